"""Edge cases found in review: runs that could stall at one instant, pins on several workers,
KV events of a block evicted and stored again within one step, recompute accounting."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Recorder, UnitStep, assert_usage_error, spec, tasim

from tasim.config.scenario import parse_scenario
from tasim.core import events as ev
from tasim.sim.drivers import WorkloadError
from tasim.sim.engine.block_pool import BlockPool, Claim
from tasim.sim.engine.scheduler import Engine, EngineSetup
from tasim.sim.runner import Simulation
from tasim.sim.simulation import run_simulation


def _scenario(**overrides) -> dict:
    raw = {
        "duration_s": 60,
        "cluster": {"engine": {"kv_blocks": 400}},
        "workload": {"concurrency": 8, "task_prompt_tokens": 2000, "turns": 4, "output_tokens": 50, "observation_tokens": 100, "tool_latency_s": 1.0},
    }
    for key, value in overrides.items():
        node = raw
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return raw


def _run(raw: dict) -> list[ev.Event]:
    log: list[ev.Event] = []
    Simulation(parse_scenario(raw, "inline"), log.append).run()
    return log


def test_pins_that_block_admission_do_not_stall_the_clock() -> None:
    # Continuum pins fill most of a small pool; the queue head waits for a pin to expire.
    log = _run(_scenario(**{"policy.name": "continuum"}))
    assert isinstance(log[-1], ev.RunEnded) and log[-1].t == 60
    assert sum(isinstance(e, ev.RequestFinished) for e in log) > 10


def test_prompt_over_budget_without_chunking_is_dropped_not_stalled() -> None:
    log = _run(
        _scenario(
            **{
                "cluster.engine.enable_chunked_prefill": False,
                "cluster.engine.max_num_batched_tokens": 1024,
                "workload.concurrency": 1,
                "workload.setup_s": 1.0,
                "duration_s": 5,
            }
        )
    )
    drops = [e for e in log if isinstance(e, ev.RequestDropped)]
    assert drops and "max_num_batched_tokens" in drops[0].reason


def test_programs_that_can_never_run_raise_a_clear_error() -> None:
    with pytest.raises(WorkloadError, match="max_context_tokens"):
        _run(_scenario(**{"workload.max_context_tokens": 1000}))


def test_cli_reports_a_stalled_workload_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "s.yaml"
    bad.write_text("duration_s: 30\nworkload: {task_prompt_tokens: 5000, max_context_tokens: 4000}\n")
    assert_usage_error(tasim("simulate", str(bad), "--out", str(tmp_path / "o")), "max_context_tokens")


def test_dropped_programs_are_not_completed(tmp_path: Path) -> None:
    raw = _scenario(**{"cluster.engine.kv_blocks": 100, "workload.concurrency": 1, "workload.setup_s": 1.0, "duration_s": 10})
    summary = run_simulation(parse_scenario(raw, "inline"), tmp_path)
    assert summary["requests_dropped"] > 0 and summary["programs_completed"] == 0


def test_net_kv_events_when_a_block_is_evicted_and_stored_again() -> None:
    pool = BlockPool(2)
    assert pool.allocate(2)
    claim = Claim([1, 2])
    pool.register_run(claim, 0, 2)
    pool.drain_events()
    pool.release(claim)
    assert pool.allocate(1)  # evicts 2 (deepest first)
    pool.register_run(pool.acquire([1, 2], 1), 1, 2)  # ... and the same content is stored again
    assert pool.drain_events() == ([2], [])  # the index must end up holding block 2


def test_recompute_counts_only_lost_kv(recorder: Recorder) -> None:
    # B is preempted after its first 8-token chunk of a 20-token prompt: 8 tokens are lost
    # (its full blocks were evicted), not the 20 it still had to compute.
    cfg = EngineSetup(block_size=4, num_blocks=6, max_num_batched_tokens=8)
    engine = Engine("w0", cfg, UnitStep(), recorder)
    engine.submit(spec("A", 4, 12, [1, 2, 3, 4]))
    engine.submit(spec("B", 20, 1, [10, 11, 12, 13, 14]))
    now = 0.0
    while engine.has_work:
        step = engine.begin_step(now)
        now = step.end
        engine.end_step(step, now)
    lost = [e[2] for e in recorder.log if e[0] == "preempted"]
    readmitted = [e for e in recorder.log if e[0] == "readmitted"]
    assert lost and readmitted
    assert all(e[2] <= max(lost) for e in readmitted)
