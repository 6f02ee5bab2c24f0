"""Live-mode speed: routing decisions with 1,000 live programs, and requests per second through
the tasim router against the Dynamo frontend's own round-robin on the same mocker workers."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from conftest import RESULTS

from tasim.live.hashing import sequence_hashes
from tasim.live.host import Call, PolicyHost
from tasim.live.kv_events import KvEvent
from tasim.live.stack import INTERNAL_SUFFIX, LiveStack
from tasim.policies import make_policy
from tasim.scenario import load_scenario
from tasim.view import ClusterView, WorkerInfo

PROGRAMS = 1000
BLOCK_SIZE = 16
SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "live-mocker.yaml"
PEER_MODEL = "peer-model"


def _programs_host(policy: str) -> tuple[PolicyHost, list[list[int]]]:
    """1,000 live programs on 8 workers, each with a 2-8k-token context from two earlier turns;
    the KV router's index holds every block the workers reported stored."""
    view = ClusterView(tuple(WorkerInfo(f"w{i}", BLOCK_SIZE, 1 << 16, 256, 8192) for i in range(8)))
    host = PolicyHost(make_policy(policy, {}, view, np.random.default_rng(0)), time.perf_counter, lambda e: None, BLOCK_SIZE)
    rng = np.random.default_rng(1)
    system = rng.integers(3, 32000, 1024).tolist()
    contexts = [system + rng.integers(3, 32000, int(rng.integers(1000, 4000))).tolist() for _ in range(PROGRAMS)]
    for _turn in range(2):
        for index, context in enumerate(contexts):
            call = host.decide(f"p{index}", context, 200)
            assert isinstance(call, Call)
            output = rng.integers(3, 32000, 200).tolist()
            host.kv_event(call.worker, KvEvent("stored", tuple(sequence_hashes(context + output, BLOCK_SIZE))))
            host.finish(call, len(context), 200, 0)
            contexts[index] = context + output + rng.integers(3, 32000, int(rng.integers(200, 1000))).tolist()
    return host, contexts


@pytest.mark.parametrize("policy", ["round_robin", "kv_router", "thunderagent"])
def test_routing_decision_with_1000_live_programs(benchmark, policy: str) -> None:  # type: ignore[no-untyped-def]
    host, contexts = _programs_host(policy)
    host.decision_seconds.clear()
    calls: list[Call] = []

    def decide_all() -> None:
        for index, context in enumerate(contexts):
            call = host.decide(f"p{index}", context, 200)
            assert isinstance(call, Call)
            calls.append(call)
        for call in calls:  # keep the program table as it was for the next round
            host.fail(call, "benchmark round over")
        calls.clear()

    benchmark.pedantic(decide_all, rounds=5, iterations=1)
    decisions_ms = np.asarray(host.decision_seconds) * 1e3
    p50, p99 = np.percentile(decisions_ms, [50, 99])
    info = {"programs": len(host.programs), "decisions": len(decisions_ms), "p50_ms": float(p50), "p99_ms": float(p99)}
    benchmark.extra_info.update(info)
    RESULTS.append((f"routing decision, {policy}, {PROGRAMS} live programs", info))
    assert len(host.programs) == PROGRAMS
    assert p99 < 1.0, f"p99 routing decision {p99:.3f} ms"


async def _requests_per_second(url: str, model: str, requests: int, concurrency: int, prompt: int, output: int) -> float:
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> None:
            body = {"model": model, "prompt": [3 + i % 97] * prompt, "max_tokens": output, "min_tokens": output, "ignore_eos": True}
            async with gate, session.post(url, json=body) as reply:
                assert reply.status == 200, await reply.text()
                await reply.read()

        await asyncio.gather(*(one(i) for i in range(concurrency)))  # warm connections and caches
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(requests)))
        return requests / (time.perf_counter() - started)


# (label, mocker time scale, requests, concurrency, prompt tokens, output tokens): first the
# workers at the scenario's own step times (what routing is for), then at 1000x, where the
# workers cost almost nothing and the figure is the router's own overhead.
REGIMES = (("workers at scenario speed", 1.0, 320, 16, 96, 32), ("workers 1000x faster", 1000.0, 600, 32, 64, 8))


@pytest.mark.parametrize("regime", REGIMES, ids=[r[0] for r in REGIMES])
def test_router_throughput_against_frontend_round_robin(benchmark, regime: tuple, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    label, time_scale, requests, concurrency, prompt, output = regime
    scenario = load_scenario(SCENARIO, ["policy.name=round_robin", "policy.params={}"])
    with LiveStack(scenario, time_scale=time_scale, workdir=tmp_path / "stack") as stack:
        assert stack.model_path is not None
        # Dynamo's own Python router in the request path, for scale: its ThunderAgent router,
        # whose requests without a session go straight through its KvRouter.
        stack.start_component(
            "peer-router",
            [
                sys.executable,
                "-m",
                "dynamo.thunderagent_router",
                "--endpoint",
                "dynamo.backend.generate",
                "--model-name",
                PEER_MODEL,
                "--model-path",
                str(stack.model_path),
                "--router-block-size",
                str(scenario.cluster.engine.block_size),
            ],
        )
        stack.wait_for_model(PEER_MODEL)
        stack.begin_run()
        url = f"{stack.base_url}/v1/completions"
        models = {"frontend": stack.model_name + INTERNAL_SUFFIX, "tasim": stack.model_name, "dynamo_python_router": PEER_MODEL}
        figures: dict[str, list[float]] = {side: [] for side in models}

        def all_sides() -> None:  # alternate, so drift in the machine's load hits every side alike
            for side, model in models.items():
                figures[side].append(asyncio.run(_requests_per_second(url, model, requests, concurrency, prompt, output)))

        benchmark.pedantic(all_sides, rounds=2, iterations=1)
    frontend, tasim, peer = (float(np.mean(figures[side])) for side in models)
    info = {"frontend_rr_rps": frontend, "tasim_rr_rps": tasim, "dynamo_ta_router_rps": peer, "ratio": tasim / frontend}
    benchmark.extra_info.update(info)
    RESULTS.append((f"requests/s, {label}", info))
    if time_scale == 1.0:
        assert tasim >= 0.9 * frontend, f"tasim router {tasim:.1f} req/s vs frontend round-robin {frontend:.1f} req/s"
