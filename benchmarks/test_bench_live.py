"""Live-mode speed: routing decisions with 1,000 live programs (in the host, and through the
decision service's socket as a pin-mode client sees them), and requests per second through the
tasim router (proxy mode) and around it (pin mode) against the Dynamo frontend's own round-robin
on the same mocker workers, in the same run."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
import msgspec
import numpy as np
import pytest
from conftest import RESULTS

from tasim.config.scenario import load_scenario
from tasim.core.cluster_view import ClusterView, WorkerInfo
from tasim.live.clients.pinned import DecisionSocket, PinnedCalls, completion_request
from tasim.live.hashing import pack_tokens, sequence_hashes
from tasim.live.router.decisions import Decisions, decision_app, serve_app
from tasim.live.router.kv_events import KvEvent
from tasim.live.router.live_host import Call, PolicyHost
from tasim.live.stack.launcher import HOST, INTERNAL_SUFFIX, LiveStack, free_ports
from tasim.policies import make_policy

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


@pytest.mark.parametrize("policy", ["round_robin", "kv_router", "thunderagent"])
def test_routing_decision_through_the_service_with_1000_live_programs(benchmark, policy: str) -> None:  # type: ignore[no-untyped-def]
    """What a pin-mode client waits for: its route frame out, the policy's decision, the answer
    back, over the decision socket (client and service share this process and one core)."""
    host, contexts = _programs_host(policy)
    decisions = Decisions(host, lambda worker: 1 + int(worker[1:]), _never_lost, max_retries=3, report_timeout_s=None)
    seconds: list[float] = []

    async def rounds(count: int) -> None:
        (port,) = free_ports(1)
        runner = await serve_app(decision_app(decisions), port)
        try:
            async with aiohttp.ClientSession() as session:
                socket = DecisionSocket(session, f"http://{HOST}:{port}/v1/socket")
                for _ in range(count):
                    for index, context in enumerate(contexts):
                        started = time.perf_counter()
                        answer = await socket.ask("route", {"program": f"p{index}", "tokens": pack_tokens(context), "max_tokens": 200})
                        seconds.append(time.perf_counter() - started)
                        await socket.tell("fail", {"call": answer["call"], "reason": "benchmark round over"})  # the table as it was
                await socket.close()
        finally:
            await runner.cleanup()

    benchmark.pedantic(lambda: asyncio.run(rounds(1)), rounds=3, iterations=1)
    p50, p99 = np.percentile(np.asarray(seconds) * 1e3, [50, 99])
    info = {"programs": len(host.programs), "decisions": len(seconds), "p50_ms": float(p50), "p99_ms": float(p99)}
    benchmark.extra_info.update(info)
    RESULTS.append((f"routing decision through the service socket, {policy}, {PROGRAMS} live programs", info))
    assert len(host.programs) == PROGRAMS and not decisions.calls
    assert p99 < 1.0, f"p99 decision through the service {p99:.3f} ms"


async def _never_lost(worker: str, instance: int, reason: str) -> None:
    raise AssertionError(f"no call fails in this benchmark ({worker}: {reason})")


_encode = msgspec.json.Encoder().encode


async def _requests_per_second(side: str, url: str, model: str, shape: tuple[int, int, int, int], decisions_url: str) -> float:
    """``side`` "frontend" and "proxy" post to ``url``; "pin" asks the router at ``decisions_url``
    first and reports the end after (`PinnedCalls`, one JSON reply); "pin-stream" streams and
    reports the first token too, as tasim's drivers do; "frontend-stream" is its peer. Every
    side sends the same body, asking for the output token ids as tasim's drivers do
    (`completion_request`). ``shape``: (requests, concurrency, prompt tokens, output tokens)."""
    requests, concurrency, prompt, output = shape
    gate = asyncio.Semaphore(concurrency)
    stream = side.endswith("-stream")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        pinned = PinnedCalls(session, decisions_url, url)

        async def one(i: int) -> None:
            tokens = [3 + i % 97] * prompt
            body = {"model": model, "prompt": tokens, "max_tokens": output, "min_tokens": output, "ignore_eos": True}
            async with gate:
                if side.startswith("pin"):
                    await pinned.complete(body, tokens, output, stream=stream)
                    return
                async with session.post(url, data=_encode(completion_request(body, stream)), headers={"content-type": "application/json"}) as reply:
                    assert reply.status == 200, await reply.text()
                    await reply.read()

        await asyncio.gather(*(one(i) for i in range(concurrency)))  # warm connections and caches
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(requests)))
        rate = requests / (time.perf_counter() - started)
        await pinned.close()
        return rate


# (label, mocker time scale, requests, concurrency, prompt tokens, output tokens, rounds): first
# the workers at the scenario's own step times (what routing is for), then at 1000x, where the
# workers cost little and the figure is the routing path's own overhead. On two cores the 1000x
# mockers, the frontends, the router and the client fill the machine, so single runs swing by
# 20 %: each side gets 3,000 requests a round, and the median of 7 rounds' paired ratios counts.
REGIMES = (("workers at scenario speed", 1.0, 320, 16, 96, 32, 2), ("workers 1000x faster", 1000.0, 3000, 32, 64, 8, 7))
SIDES = ("frontend", "pin", "proxy", "frontend-stream", "pin-stream", "dynamo_python_router")


@pytest.mark.parametrize("regime", REGIMES, ids=[r[0] for r in REGIMES])
def test_router_throughput_against_frontend_round_robin(benchmark, regime: tuple, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    label, time_scale, requests, concurrency, prompt, output, rounds = regime
    scenario = load_scenario(SCENARIO, ["policy.name=round_robin", "policy.params={}"])
    with LiveStack(scenario, time_scale=time_scale, workdir=tmp_path / "stack") as stack:
        assert stack.model_path is not None
        # Pin mode's frontend (direct: a call must name its worker) on the same workers.
        direct = stack.add_frontend("frontend-direct", "direct") + "/v1/completions"
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
        internal = stack.model_name + INTERNAL_SUFFIX
        stack.begin_run()
        url = f"{stack.base_url}/v1/completions"
        targets = {
            "frontend": (url, internal),
            "pin": (direct, internal),
            "proxy": (url, stack.model_name),
            "frontend-stream": (url, internal),
            "pin-stream": (direct, internal),
            "dynamo_python_router": (url, PEER_MODEL),
        }
        figures: dict[str, list[float]] = {side: [] for side in SIDES}

        def all_sides() -> None:
            # Every round runs every side, in reverse order every other round (ABBA), so a drift
            # in the machine's speed hits no side more than its peer.
            rounds_done = len(figures[SIDES[0]])
            for side in SIDES if rounds_done % 2 == 0 else SIDES[::-1]:
                side_url, model = targets[side]
                shape = (requests, concurrency, prompt, output)
                figures[side].append(asyncio.run(_requests_per_second(side, side_url, model, shape, stack.status_url)))

        benchmark.pedantic(all_sides, rounds=rounds, iterations=1)
        assert stack.status()["pinned_calls"]["unreported"] == 0
    rate = {side: float(np.median(figures[side])) for side in SIDES}

    def paired(side: str, peer: str) -> list[float]:
        """The side's rate over its peer's in each round: pairs from one round share the
        machine's state, which drifts by more than the effect between rounds."""
        return [mine / theirs for mine, theirs in zip(figures[side], figures[peer], strict=True)]

    pin_ratios = paired("pin", "frontend")
    info = {f"{side}_rps": rate[side] for side in SIDES} | {
        "pin_ratio": float(np.median(pin_ratios)),
        "pin_ratio_min": min(pin_ratios),
        "pin_ratio_max": max(pin_ratios),
        "pin_stream_ratio": float(np.median(paired("pin-stream", "frontend-stream"))),
        "proxy_ratio": float(np.median(paired("proxy", "frontend"))),
    }
    benchmark.extra_info.update(info)
    RESULTS.append((f"requests/s, {label}", info))
    if time_scale == 1.0:
        assert info["proxy_ratio"] >= 0.9, (
            f"proxy over frontend round-robin, median of rounds {info['proxy_ratio']:.2f} ({rate['proxy']:.1f} vs {rate['frontend']:.1f} req/s)"
        )
    ratios = ", ".join(f"{r:.2f}" for r in pin_ratios)
    assert info["pin_ratio"] >= 0.9, f"pin mode over frontend round-robin, median of rounds {info['pin_ratio']:.2f} (rounds: {ratios})"
