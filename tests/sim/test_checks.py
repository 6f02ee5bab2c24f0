"""The simulator's invariants (`tasim simulate --check`): they hold on random scenarios under
every policy, and each check fires when its invariant is broken."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.reliability import SMALL_RUNS, random_scenario
from tasim import native
from tasim.cli.common import EXIT_INVARIANT
from tasim.config.scenario import ScenarioError, load_scenario
from tasim.core import events as ev
from tasim.sim.checks import EventChecks, InvariantViolation
from tasim.sim.drivers import WorkloadError
from tasim.sim.engine.block_pool import BlockPool
from tasim.sim.engine.scheduler import Engine, EngineSetup
from tasim.sim.runner import Simulation

PRESETS = REPO / "scenarios"


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[str, list[str], bool]:
    preset, overrides = random_scenario(lambda options: draw(st.sampled_from(options)))
    return preset, overrides, draw(st.booleans())


@pytest.mark.slow
def test_invariants_hold_on_random_scenarios() -> None:
    """Every invariant checked on 60 random scenarios; most of them must really run, not stop at
    the scenario model's refusal (counted, so a change that makes most draws invalid fails)."""
    outcomes: Counter[str] = Counter()

    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(scenarios())
    def check(case: tuple[str, list[str], bool]) -> None:
        preset, overrides, fast_forward = case
        try:
            scenario = load_scenario(PRESETS / preset, overrides)
        except ScenarioError:
            outcomes["refused by the scenario model"] += 1  # its messages are tested elsewhere
            return
        events: list[ev.Event] = []
        try:
            Simulation(scenario, events.append, fast_forward=fast_forward, check=True).run()
        except WorkloadError:  # every first request too big for the pool: reported, and checked so far
            outcomes["stopped: no request fits"] += 1
            return
        assert isinstance(events[-1], ev.RunEnded)
        outcomes["ran to the end"] += 1

    check()
    assert sum(outcomes.values()) >= 60, outcomes
    assert outcomes["ran to the end"] >= 45, outcomes


def test_mooncake_replay_holds_its_invariants() -> None:
    scenario = load_scenario(PRESETS / "mooncake-conversation.yaml", ["cluster.backends=4", "workload.max_requests=400"])
    Simulation(scenario, lambda event: None, check=True).run()


# --- every check fires ------------------------------------------------------------------------


def _stream(*events: ev.Event) -> None:
    checks = EventChecks(lambda event: None)
    for event in events:
        checks(event)


START = ev.RunStarted(0.0, "s", "p", 0, 100.0, ("w0",), 16, 64, 0.0)
PROGRAM = ev.ProgramStarted(1.0, "a", 2)
ARRIVED = ev.RequestArrived(1.0, "a-0", "a", 0, 10, 0, 5)


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ((START, PROGRAM, ev.ProgramStarted(0.5, "b", 1)), r"^t=0\.500000 program_started: time went backwards from 1\.000000$"),
        ((START, PROGRAM, ARRIVED, ARRIVED), "request a-0 arrived twice"),
        ((START, ev.RequestArrived(1.0, "x-0", "x", 0, 10, 0, 5)), "request x-0 of program x, which is not running"),
        ((START, ev.RequestRouted(1.0, "a-0", "w0")), "request_routed: request a-0 is not open"),
        ((START, PROGRAM, ARRIVED, ev.RequestDropped(2.0, "a-0", "a", "w0", " ")), "request a-0 dropped without a reason"),
        (
            (START, PROGRAM, ARRIVED, ev.RequestFinished(2.0, "a-0", "a", "w0", 10, 5, 0), ev.RequestFinished(3.0, "a-0", "a", "w0", 10, 5, 0)),
            "request a-0 ended but is not open",
        ),
        ((START, PROGRAM, ev.ProgramStarted(2.0, "a", 1)), "program a started twice"),
        ((START, ev.ProgramFinished(2.0, "a", 0, False)), "program a finished but is not running"),
        ((START, PROGRAM, ARRIVED, ev.RunEnded(100.0, 3, 0)), "reports 0 unfinished requests, 1 are open"),
        ((START, PROGRAM, ev.RunEnded(50.0, 3, 0)), "the workload completed with requests or programs still open: a$"),
    ],
)
def test_each_event_check_fires(events: tuple[ev.Event, ...], message: str) -> None:
    with pytest.raises(InvariantViolation, match=message):
        _stream(*events)


def test_a_run_cut_at_its_duration_may_leave_work_open() -> None:
    _stream(START, PROGRAM, ARRIVED, ev.RunEnded(100.0, 3, 1))


def _engine(eviction: str = "lru") -> Engine:
    engine = Engine("w0", EngineSetup(block_size=4, num_blocks=16, eviction=eviction), None, None)  # type: ignore[arg-type]
    return engine


def _pinned(engine: Engine, hashes: tuple[int, ...]) -> None:
    """Cache ``hashes`` through a holder, release it, and pin them again: a consistent state."""
    pool = engine.kv_cache.block_pool
    claim = pool.acquire(hashes, 0)
    assert pool.allocate(len(hashes))
    pool.register_run(claim, 0, len(hashes))
    pool.release(claim)
    assert engine.pin("p", hashes) == len(hashes)


def test_a_consistent_engine_passes_its_audit() -> None:
    engine = _engine("lineage")
    _pinned(engine, (1, 2, 3))
    assert engine.audit(every_block=True) is None
    engine.unpin("p")
    assert engine.audit(every_block=True) is None


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda pool: setattr(pool, "free", -1), r"^negative block count \(free -1"),
        (lambda pool: pool.acquire((1, 2, 3), 3), "block 1 has 2 references but 1 holders"),
        (lambda pool: next(iter(pool._heads.values())).__setattr__("refs", -1), "negative reference count -1 on block 1"),
        (lambda pool: setattr(pool, "_cached", 2), "counted 3 cached, 0 inactive; the pool says 2, 0"),
        (lambda pool: pool.release_private(1), "^2 active blocks, but holders reference 3 and occupy 0 privately$"),
    ],
)
def test_each_pool_check_fires(corrupt, message: str) -> None:  # type: ignore[no-untyped-def]
    engine = _engine()
    _pinned(engine, (1, 2, 3))
    corrupt(engine.kv_cache.block_pool)
    problem = engine.audit()
    assert problem is not None and re.search(message, problem), problem


def test_an_unevictable_block_and_a_block_cached_twice_are_found() -> None:
    pool = BlockPool(16, "lineage")
    claim = pool.acquire((1, 2), 0)
    assert pool.allocate(2)
    pool.register_run(claim, 0, 2)
    pool.release(claim)
    pool._candidates.clear()  # nothing left that eviction could pop
    assert pool.audit([], 0) == "unreferenced block 1 cannot be evicted (no candidate entry)"
    pool = BlockPool(16)
    first, second = pool.acquire((1, 2), 0), pool.acquire((5, 2), 0)
    assert pool.allocate(4)
    pool.register_run(first, 0, 2)
    pool.register_run(second, 0, 2)  # block 2 again, under another chain: an impossible history
    assert pool.audit([first, second], 0) is None  # O(extents) checks cannot see it ...
    assert pool.audit([first, second], 0, every_block=True) == "a block of extent 5 is cached twice"  # ... this one does


# The third request to finish keeps its references: the audit after that run of steps finds
# blocks referenced more often than holders hold them. The plain modules (TASIM_NATIVE=0) run it,
# in a process of their own: a compiled class's methods cannot be replaced.
_LEAKY_POOL = """
import sys
from tasim.sim.engine.block_pool import BlockPool

release = BlockPool.release
calls = iter(range(1, 1 << 30))


def leaky_release(self, claim):
    if next(calls) != 3:
        release(self, claim)
    else:
        claim.ranges, claim.blocks = [], 0


BlockPool.release = leaky_release
if sys.argv[1] == "simulation":
    from lab.reliability import SMALL_RUNS
    from tasim.config.scenario import load_scenario
    from tasim.sim.checks import InvariantViolation
    from tasim.sim.runner import Simulation

    try:
        Simulation(load_scenario(sys.argv[2], SMALL_RUNS["swe-agent.yaml"]), lambda event: None, check=True).run()
    except InvariantViolation as exc:
        print(exc)
else:
    from tasim.cli import main

    sys.exit(main(sys.argv[2:]))
"""


def _with_a_leaky_pool(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, native.DISABLE: "0"}
    return subprocess.run([sys.executable, "-c", _LEAKY_POOL, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


def test_a_broken_pool_stops_a_checked_run_and_the_cli_keeps_the_partial_log(tmp_path: Path) -> None:
    scenario = PRESETS / "swe-agent.yaml"
    simulated = _with_a_leaky_pool("simulation", str(scenario))
    assert re.fullmatch(r"t=\d+\.\d{6} w\d: block \d+ has (\d+) references but (?!\1)\d+ holders\n", simulated.stdout), simulated.stderr
    out = tmp_path / "run"
    overrides = sum((["--set", o] for o in SMALL_RUNS["swe-agent.yaml"]), [])
    cli = _with_a_leaky_pool("cli", "simulate", str(scenario), "--check", "--quiet", "--out", str(out), *overrides)
    assert cli.returncode == EXIT_INVARIANT
    err = cli.stderr
    assert err.count("\n") == 1 and err.startswith("invariant violated (a bug in tasim") and "Traceback" not in err
    assert (out / "events.jsonl.partial").stat().st_size > 0 and not (out / "events.jsonl").exists()
