"""The reliability table of docs/results/reliability.md: load held, faults injected, outcomes.

    python -m lab.reliability [--doc docs/results/reliability.md] [--out DIR]

Each row is one measurement, run here and now (about five minutes in all, most of it the live
runs): the simulator under random scenarios with every invariant checked; the live router's
program table under 100,000 sessions that never end; and the live stack (Dynamo frontend, tasim
router, Dynamo mocker workers on this machine) under 512 concurrent programs, and with a worker
killed mid-run. Tests assert what the table shows, no lost request and no leaked program
(tests/sim/test_checks.py, tests/live/router/test_service_hostile_input.py, tests/live/test_live_load.py,
tests/lab/test_faults.py).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasim.config.presets import PRESET_DIR
from tasim.config.scenario import Scenario, load_scenario
from tasim.core import events as ev
from tasim.policies import POLICIES
from tasim.results.doc_section import replace_section
from tasim.sim.drivers import WorkloadError
from tasim.sim.runner import Simulation

BEGIN, END = "<!-- reliability:begin -->", "<!-- reliability:end -->"

# Per preset: overrides that keep a simulated run to about a second.
SMALL_RUNS = {
    "swe-agent.yaml": ["workload.concurrency=6", "duration_s=400", "metrics.warmup_s=0"],
    "multiturn-validation.yaml": ["workload.concurrency=8", "workload.programs=12", "duration_s=300"],
    "rl-rollout.yaml": [
        "workload.prompts_per_step=3",
        "workload.samples_per_prompt=2",
        "workload.steps=2",
        "workload.max_concurrency=4",
        "duration_s=2000",
        "workload.training_s=20",
    ],
    "toolorchestra.yaml": ["workload.concurrency=4", "duration_s=300", "metrics.warmup_s=0"],
}


@dataclass(frozen=True, slots=True)
class Outcome:
    """One row: what ran, what was done to it, and what came out."""

    check: str
    load: str
    faults: str
    requests: int
    lost_requests: int
    leaked_programs: int
    result: str


def random_scenario(pick: Callable[[Sequence[Any]], Any]) -> tuple[str, list[str]]:
    """A small preset under a random policy and random engine settings; small pools force
    eviction, preemption and requests too big to ever run. ``pick`` returns one element of the
    sequence it is given: from a seeded generator here (`picker`), a hypothesis draw in the tests."""
    preset = pick(sorted(SMALL_RUNS))
    block_size = pick([16, 64])
    policy = pick(sorted(POLICIES))
    if POLICIES[policy].sets_priorities:  # it needs priority scheduling, which is vLLM's
        flavour, scheduling = "vllm", "priority"
    else:
        flavour = pick(["vllm", "mocker"])
        scheduling = pick(["fcfs", "priority"]) if flavour == "vllm" else "fcfs"
    evictions = ["lru"] if flavour == "vllm" else ["lru", "lineage"]  # vLLM evicts lru only
    preemption = [f"cluster.engine.preemption={pick(['newest_first', 'oldest_first'])}"] if scheduling == "fcfs" else []
    overrides = SMALL_RUNS[preset] + [
        f"policy.name={policy}",
        "policy.params={}",
        f"seed={pick(range(1000))}",
        f"cluster.backends={pick(range(1, 4))}",
        f"cluster.engine.block_size={block_size}",
        f"cluster.engine.kv_blocks={pick(range(256, 8193)) * 16 // block_size}",
        f"cluster.engine.max_num_seqs={pick(range(1, 65))}",
        f"cluster.engine.max_num_batched_tokens={pick([512, 2048, 8192])}",
        f"cluster.engine.flavour={flavour}",
        f"cluster.engine.eviction={pick(evictions)}",
        f"cluster.engine.scheduling_policy={scheduling}",
        *preemption,
        f"cluster.engine.enable_chunked_prefill={pick([False, True])}",
        f"cluster.engine.enable_prefix_caching={pick([False, True])}",
        f"cluster.engine.reuse_output_blocks={pick([False, True])}",
    ]
    return preset, overrides


def picker(rng: np.random.Generator) -> Callable[[Sequence[Any]], Any]:
    """`random_scenario`'s ``pick`` from a seeded generator: a uniform element."""
    return lambda options: options[int(rng.integers(len(options)))]


def sim_invariants(runs: int = 200, seed: int = 0) -> Outcome:
    """``runs`` random scenarios (`random_scenario`) simulated with every invariant checked
    (`tasim.sim.checks`); a violation raises, so reaching the end means none."""
    rng = np.random.default_rng(seed)
    requests = finished = preempted = dropped = stalled = 0
    for _ in range(runs):
        preset, overrides = random_scenario(picker(rng))
        events: list[ev.Event] = []
        try:
            Simulation(load_scenario(PRESET_DIR / preset, overrides), events.append, check=True).run()
        except WorkloadError:  # every first request too big for the pool: reported, not lost
            stalled += 1
        requests += sum(isinstance(e, ev.RequestArrived) for e in events)
        finished += sum(isinstance(e, ev.RequestFinished) for e in events)
        preempted += sum(isinstance(e, ev.RequestPreempted) for e in events)
        dropped += sum(isinstance(e, ev.RequestDropped) for e in events)
    return Outcome(
        "simulator invariants (`simulate --check`)",
        f"{runs} random scenarios: 4 presets × {len(POLICIES)} policies × engine settings",
        f"KV pools of 4k-128k tokens: {preempted:,} preemptions; requests too big for their pool "
        f"({stalled} run{'s' if stalled != 1 else ''} stopped as every program's first request was)",
        requests,
        0,
        0,
        f"no invariant broken: {finished:,} finished, {dropped:,} dropped with a reason, {requests - finished - dropped:,} open at the deadline",
    )


def live_load_scenario(programs: int = 2048, concurrency: int = 512, routing: str = "proxy") -> Scenario:
    """``programs`` agent programs, ``concurrency`` at a time, on the live-mocker preset's two
    workers (pools enlarged so that programs fit) under ThunderAgent, which pauses and resumes
    programs at tool boundaries: the race of a pause with a request's admission gets exercised
    on every pause. ``routing``: ``live.routing``."""
    from tasim.live.run import finite_scenario

    scenario = load_scenario(
        PRESET_DIR / "live-mocker.yaml",
        [
            f"workload.concurrency={concurrency}",
            "cluster.engine.kv_blocks=4096",
            "policy.name=thunderagent",
            "policy.params={}",
            f"live.routing={routing}",
        ],
    )
    return finite_scenario(scenario, programs)


# How each routing mode's calls reach the workers, for the table.
ROUTE = {
    "proxy": "Dynamo's frontend, the tasim router (thunderagent)",
    "pin": "the tasim router's decisions (thunderagent) and Dynamo's frontend pinned to them",
}


def live_load(out: Path, programs: int = 2048, concurrency: int = 512, routing: str = "proxy") -> Outcome:
    """`live_load_scenario` through the real stack at time scale 1 (about two minutes)."""
    from tasim.live.run import run_live

    summary = run_live(live_load_scenario(programs, concurrency, routing), out)
    driver = json.loads((out / "run.json").read_text())["driver"]
    lost = driver["failed_requests"] + summary["requests_unfinished"] + summary["requests_dropped"]
    return Outcome(
        f"live router under load ({routing})",
        f"{programs:,} programs, {concurrency} concurrent, for {driver['wall_s']:.0f} s through {ROUTE[routing]} and 2 mocker workers",
        f"{summary['pauses']:,} pauses and {summary['resumes']:,} resumes racing requests' admission",
        driver["requests"],
        lost,
        summary["programs_leaked"],
        f"{summary['requests_completed']:,} completed, {driver['failed_requests']} failed",
    )


def worker_crash(out: Path, routing: str = "proxy") -> Outcome:
    """`lab.faults.kill_a_worker`: one of two mocker workers SIGKILLed mid-stream and
    restarted, then both killed (about a minute)."""
    from lab.faults import kill_a_worker

    run = kill_a_worker(out, routing=routing)
    # A proxied call goes on where it broke off; a pinned one starts over on its new worker.
    retried = f"{run.retried_mid_stream} mid-stream, their output kept" if routing == "proxy" else "each started over on its new worker"
    return Outcome(
        f"live router: a worker dies ({routing})",
        f"{run.programs} programs, {run.concurrency} concurrent, for {run.wall_s:.0f} s through {ROUTE[routing]} and 2 mocker workers",
        f"w1 SIGKILLed with {run.streaming_at_kill} calls in flight on it, restarted at once; after the run, both workers killed",
        run.requests,
        run.lost_requests,
        run.leaked_programs,
        f"w1 lost after {run.lost_after_s:.2f} s; {run.retried} calls retried ({retried}), {run.failed_requests} failed; "
        f"{run.replaced_programs} programs re-placed on w0; w1 serving again "
        f"{run.rejoined_after_s:.1f} s after its restart and took {run.served_after_rejoin} calls; with no worker a call got "
        f"HTTP {run.refused_status}",
    )


def abandoned_sessions(count: int = 100_000, ttl_s: float = 600.0, every_s: float = 0.5) -> Outcome:
    """``count`` sessions that each make one call and never send a session-final, one every
    ``every_s`` seconds, through the live router's program table (`PolicyHost`, round robin,
    a simulated clock): the idle TTL must keep the table bounded and end every program."""
    from tasim.core.cluster_view import ClusterView, WorkerInfo
    from tasim.live.router.live_host import Call, PolicyHost
    from tasim.policies import make_policy

    view = ClusterView(tuple(WorkerInfo(f"w{i}", 16, 64, 64, 2048) for i in range(2)))
    now = [0.0]
    ended: list[str] = []

    def emit(event: ev.Event) -> None:
        if isinstance(event, ev.ProgramFinished):
            ended.append(event.program)

    host = PolicyHost(make_policy("round_robin", {}, view, np.random.default_rng(0)), lambda: now[0], emit, 16, idle_ttl_s=ttl_s)
    peak = 0
    for i in range(count):
        now[0] = i * every_s
        call = host.decide(f"s{i}", list(range(5, 25)), 4)
        assert isinstance(call, Call)  # round robin never holds
        peak = max(peak, len(host.programs))
        host.finish(call, 20, 4, 0)
    now[0] += ttl_s + every_s
    host.tick()  # traffic has stopped: the next policy tick ends the rest
    return Outcome(
        "live router: sessions that never end",
        f"{count:,} sessions, one call each, one every {every_s:g} s",
        "no session ever sends its session-final",
        count,
        count - host.finished,
        len(host.programs),
        f"program table peaked at {peak:,} (idle TTL {ttl_s:g} s); {len(set(ended)):,} programs ended by the TTL",
    )


def render(outcomes: list[Outcome]) -> str:
    lines = [
        "| check | load held | faults injected | requests | lost requests | leaked programs | outcome |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for o in outcomes:
        lines.append(f"| {o.check} | {o.load} | {o.faults} | {o.requests:,} | {o.lost_requests} | {o.leaked_programs} | {o.result} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.reliability", description=__doc__.splitlines()[0])
    parser.add_argument("--doc", type=Path, default=Path("docs/results/reliability.md"), help="document whose table to rewrite")
    parser.add_argument("--out", type=Path, help="keep the live runs here (default: a temporary directory)")
    args = parser.parse_args(argv)
    outcomes = [sim_invariants(), abandoned_sessions()]
    with tempfile.TemporaryDirectory(prefix="tasim-reliability-") as tmp:
        kept = args.out or Path(tmp)
        for routing in ("proxy", "pin"):
            outcomes.append(live_load(kept / f"live-load-{routing}", routing=routing))
            outcomes.append(worker_crash(kept / f"worker-crash-{routing}", routing=routing))
    table = render(outcomes)
    replace_section(args.doc, BEGIN, END, table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
