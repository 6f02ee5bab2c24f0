"""vLLM's scheduler behind tasim's engine interface (`tasim.validation.vllm_engine`): the calls a
weight sync aborts, and their retries, against tasim's own engine on an asynchronous rollout.
vLLM is in the project's test install (the `oracle` extra)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import small_async_rollout

from tasim.core import events as ev
from tasim.sim.engine.scheduler import Engine
from tasim.sim.simulation import run_simulation
from tasim.validation.against_vllm import DecisionLog, compare, oracle_scenario, validate

pytestmark = pytest.mark.processes  # starts vLLM's scheduler (make test-fast leaves it out)

pytest.importorskip("vllm", reason="the oracle extra (make install) brings vLLM")

STEP_MS = 10.0  # as small_async_rollout's fixed step


def _aborts(events: list[dict[str, Any]]) -> list[tuple[float, str, str, int]]:
    """Each aborted call in the order the engines reported it: (step, request, worker, output tokens)."""
    # a field at its default (no output yet) is left out of the log
    return [(_step(e["t"]), e["request"], e["worker"], e.get("output_tokens", 0)) for e in events if e["type"] == ev.RequestRetried.TYPE]


def _retries(events: list[dict[str, Any]]) -> list[tuple[float, str, int, int]]:
    """Each retry as it reached the router: (step, request, prompt tokens, output tokens)."""
    return [
        (_step(e["t"]), e["request"], e["prompt_tokens"], e["output_tokens"])
        for e in events
        if e["type"] == ev.RequestArrived.TYPE and "r" in e["request"]
    ]


def _step(t: float) -> float:
    return round(t * 1000 / STEP_MS, 6)


def _events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def test_one_worker_aborts_and_retries_every_call_as_tasim_does(tmp_path: Path) -> None:
    """``tasim validate vllm``'s own comparison: vLLM's scheduler aborts each sync's calls
    (``finish_requests(None, FINISHED_ABORTED)``, in the order they were added, which under
    fcfs with newest-first preemption is tasim's order: running calls, then the queue) at the
    same steps with the same output tokens, among them calls preempted and waiting with output
    of their own; every retry then goes as on tasim."""
    result = validate(small_async_rollout(1), tmp_path, STEP_MS)
    assert result.mismatches == [], result.mismatches[:3]
    assert result.all_identical
    tasim, vllm = _events(tmp_path / "tasim"), _events(tmp_path / "vllm")
    assert _aborts(vllm) == _aborts(tasim)
    assert _retries(vllm) == _retries(tasim)
    aborts = _aborts(vllm)
    assert (result.requests, len(aborts), result.summaries["vllm"]["preemptions"]) == (85, 13, 21)
    assert {step for step, *_ in aborts} == {367.0, 690.0, 1073.0}  # the three syncs
    # The first finds the engine thrashing: nothing runs, two calls wait preempted with 10 and 7
    # output tokens (recomputed on re-admission), three were never admitted
    assert aborts[:5] == [
        (367.0, "s0.2.1.2", "w0", 10),
        (367.0, "s0.2.2.0", "w0", 7),
        (367.0, "s0.3.0.0", "w0", 0),
        (367.0, "s0.3.1.0", "w0", 0),
        (367.0, "s0.3.2.0", "w0", 0),
    ]
    # each retry's prompt holds the output so far; its output is the rest
    assert _retries(vllm)[:2] == [(372.0, "s0.2.1.2r2", 292, 45), (372.0, "s0.2.2.0r2", 160, 40)]


def test_two_workers_abort_and_retry_as_tasim_does_folded_or_stepped(tmp_path: Path) -> None:
    """Two workers, a sync that starts as one of them ends a step: tasim's engine, stepped one
    step at a time as the oracle is or fast-forwarded as ``tasim validate vllm`` runs it, aborts
    and retries exactly as vLLM's.

    The sync starts at step 236, when w1's step ends. Step by step, w0's step ended at that
    instant just before, so both engines are between steps and abort at once in worker order,
    w0's calls first. Fast-forwarded, w0's run of decode steps is cut at that instant: its last
    step ends then, so it aborts then too, before w1, as stepped."""
    scenario = oracle_scenario(small_async_rollout(2), STEP_MS)
    from tasim.validation.vllm_engine import VllmEngine

    logs, aborts = {}, {}
    for side, factory in (("stepped", Engine), ("vllm", VllmEngine), ("folded", None)):
        logs[side] = DecisionLog(STEP_MS / 1000)
        run_simulation(scenario, tmp_path / side, engine_factory=factory, observe=logs[side])
        aborts[side] = _aborts(_events(tmp_path / side))
    for side in ("stepped", "folded"):
        result = compare(logs[side].requests, logs["vllm"].requests, {}, {})
        assert result.mismatches == [], (side, result.mismatches[:3])
        assert aborts["vllm"] == aborts[side], side
        assert _retries(_events(tmp_path / "vllm")) == _retries(_events(tmp_path / side)), side
    assert (result.requests, len(aborts["vllm"])) == (83, 11)

    first = [a for a in aborts["vllm"] if a[0] == 236.0]
    assert first == [
        (236.0, "s0.2.2.1", "w0", 2),
        (236.0, "s0.3.1.1", "w0", 2),
        (236.0, "s0.3.2.0", "w1", 19),
        (236.0, "s0.3.0.1", "w1", 18),
    ]
