"""Weight syncs in the simulator: each engine aborts what it runs at the end of its step and
empties its cache; the client retries after its delay with the output so far in its prompt
(recomputed from the empty cache); calls routed during the sync wait at their worker."""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tasim.config.scenario import Scenario
from tasim.core import events as ev
from tasim.sim.clock import Event
from tasim.sim.runner import Simulation

STEP_S = 0.01


def _scenario(**workload: object) -> Scenario:
    return Scenario.model_validate(
        {
            "duration_s": 60,
            "cluster": {"backends": 1, "engine": {"kv_blocks": 1000, "block_size": 16}, "perf": {"model": "fixed", "step_ms": STEP_S * 1000}},
            "workload": {
                "concurrency": 1,
                "programs": 1,
                "turns": 1,
                "system_prompt_tokens": 0,
                "task_prompt_tokens": 160,
                "output_tokens": 200,
                "setup_s": 0,
                **workload,
            },
            "metrics": {"log_kv_events": True},
        }
    )


def _run_with_sync(scenario: Scenario, begin_s: float, end_s: float) -> tuple[Simulation, list[ev.Event]]:
    log: list[ev.Event] = []
    sim = Simulation(scenario, log.append)

    def trainer() -> Generator[Event, object, None]:
        yield sim.env.timeout(begin_s)
        stopped = sim.begin_weight_sync(1, retry_after_s=1.0)
        yield sim.env.timeout(end_s - begin_s)
        assert stopped.triggered or end_s == begin_s
        sim.end_weight_sync(1)

    sim.env.process(trainer())
    sim.run()
    return sim, log


def _only(log: list[ev.Event], kind: type[ev.Event]) -> list[ev.Event]:
    return [e for e in log if isinstance(e, kind)]


def test_a_sync_aborts_at_the_step_end_and_the_retry_recomputes_prompt_and_partial_output() -> None:
    sim, log = _run_with_sync(_scenario(), begin_s=0.505, end_s=3.0)
    # the prefill step (160 tokens) ends at 0.01 with the first token; one token per step after
    # it: the step running at 0.505 ends at 0.51 with the 51st, and the engine stops there
    (retried,) = _only(log, ev.RequestRetried)
    assert isinstance(retried, ev.RequestRetried)
    assert (retried.request, retried.worker, retried.reason, retried.output_tokens) == ("p0.0", "w0", "weight sync to version 1", 51)
    assert retried.t == pytest.approx(0.51)
    arrivals = [e for e in _only(log, ev.RequestArrived) if isinstance(e, ev.RequestArrived)]
    assert [(a.request, a.prompt_tokens, a.output_tokens) for a in arrivals] == [("p0.0", 160, 200), ("p0.0r2", 211, 149)]
    assert arrivals[1].t == pytest.approx(1.51)  # the client's retry delay
    # routed at once, it waits at the worker's gate until the sync ends, then prefills all of
    # its 211 tokens: the cache was emptied
    prefills = [e for e in _only(log, ev.PrefillStarted) if isinstance(e, ev.PrefillStarted)]
    assert [(p.request, p.cached_tokens) for p in prefills] == [("p0.0", 0), ("p0.0r2", 0)]
    assert prefills[1].t == 3.0
    finished = [e for e in _only(log, ev.RequestFinished) if isinstance(e, ev.RequestFinished)]
    assert [(f.request, f.prompt_tokens, f.output_tokens) for f in finished] == [("p0.0r2", 211, 149)]
    assert finished[0].t == pytest.approx(3.0 + 149 * STEP_S)
    removed = [b for e in _only(log, ev.KvRemoved) if isinstance(e, ev.KvRemoved) for b in e.blocks]
    assert len(removed) == (160 + 51) // 16  # the aborted call's full blocks, dropped by the reset
    assert [type(e) for e in log if isinstance(e, (ev.WeightSyncStarted, ev.WeightSyncFinished))] == [ev.WeightSyncStarted, ev.WeightSyncFinished]
    # its output was generated under version 0, then 1
    assert sim.pop_versions("p0") == (0, 1)
    assert sim.pop_versions("p0") == (1, 1)  # forgotten: the current version


def test_a_sync_with_nothing_running_stops_at_once_and_changes_no_call() -> None:
    _, log = _run_with_sync(_scenario(), begin_s=10.0, end_s=10.0)
    assert not _only(log, ev.RequestRetried)
    (finished,) = _only(log, ev.RequestFinished)
    assert isinstance(finished, ev.RequestFinished) and finished.request == "p0.0"


def test_a_sync_that_ends_before_the_engines_stopped_is_refused() -> None:
    with pytest.raises(RuntimeError, match="ended before the engines stopped"):
        _run_with_sync(_scenario(), begin_s=0.505, end_s=0.505)


def test_a_sync_drops_pinned_kv_with_the_rest() -> None:
    # Continuum pins a program's blocks through a short tool call; the sync comes during it
    scenario = _scenario(turns=2, tool_latency_s=0.5, output_tokens=20)
    scenario = scenario.model_copy(update={"policy": scenario.policy.model_copy(update={"name": "continuum"})})
    sim, log = _run_with_sync(scenario, begin_s=0.35, end_s=0.4)
    pinned = [e for e in log if isinstance(e, ev.ProgramPinned)]
    assert pinned and pinned[0].t < 0.35
    removed = [b for e in log if isinstance(e, ev.KvRemoved) and e.t == pytest.approx(0.35) for b in e.blocks]
    assert len(removed) == (160 + 20) // 16  # the pinned blocks, all of them
    assert not sim.engines["w0"].has_pin("p0")
