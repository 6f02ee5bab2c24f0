"""The workload both simulators replay, as one Mooncake-format JSONL file.

- A ``mooncake_trace`` scenario replays its own file (cut to ``max_requests`` in replay order
  and without requests no worker's pool can hold; written anew only if anything is left out).
- An ``agent`` scenario becomes a synthetic multi-turn trace: one session per program, turns
  separated by the program's tool latencies (Dynamo's ``delay``: time from a turn's completion
  to the next turn), one ``hash_id`` per engine block. Closed-loop scenarios export their first
  ``concurrency`` programs, all starting after their set-up time; Poisson scenarios every
  program that arrives before ``duration_s``. A trace carries no generated tokens, so a turn
  reuses the previous turn's prompt but not its output, in both simulators alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasim.config.scenario import AgentWorkload, MooncakeTraceWorkload, Scenario
from tasim.core.determinism import arrival_rng
from tasim.core.model import blocks_for, check_block_sizes
from tasim.validation import ValidationUnavailable
from tasim.workloads import plan_program
from tasim.workloads.trace_formats.mooncake import read_mooncake_records
from tasim.workloads.trace_formats.reading import MAX_TRACE_ID


class UnsupportedWorkload(ValidationUnavailable):
    """The scenario's workload has no Mooncake-trace form; the message names what is allowed."""


@dataclass(frozen=True, slots=True)
class ReplayTrace:
    path: Path
    trace_block_size: int
    arrival_speedup: float
    requests: int
    excluded: int = 0  # requests whose prompt + output need more KV blocks than a worker has


def replay_trace(scenario: Scenario, directory: Path) -> ReplayTrace:
    workload = scenario.workload
    if isinstance(workload, MooncakeTraceWorkload):
        return _mooncake(scenario, workload, directory)
    if isinstance(workload, AgentWorkload):
        path = directory / "workload.jsonl"
        count = _write(path, _agent_records(scenario, workload))
        return ReplayTrace(path, scenario.cluster.engine.block_size, 1.0, count)
    raise UnsupportedWorkload(f"workload.kind: validate dynamo replays 'mooncake_trace' and 'agent' workloads (got {workload.kind!r})")


def _mooncake(scenario: Scenario, workload: MooncakeTraceWorkload, directory: Path) -> ReplayTrace:
    """The trace's requests in replay order, cut to ``max_requests``, without those no worker
    can ever hold: neither simulator can serve them, and Dynamo's replay aborts on one whose
    prompt fits but whose output does not (tasim drops it once it outgrows the pool)."""
    source = Path(workload.path)
    bs, blocks = scenario.cluster.engine.block_size, scenario.cluster.kv_blocks_per_worker()
    check_block_sizes(bs, workload.trace_block_size)
    records = read_mooncake_records(source, workload.trace_block_size)
    chosen = records[: workload.max_requests]
    servable = [r for r in chosen if blocks_for(r["input_length"] + r["output_length"], bs) <= blocks]
    excluded = len(chosen) - len(servable)
    if not servable:
        raise UnsupportedWorkload(f"{source}: no request fits a worker's {blocks} KV blocks of {bs} tokens (prompt + output)")
    if len(servable) == len(records):
        return ReplayTrace(source, workload.trace_block_size, workload.arrival_speedup, len(records))
    path = directory / "workload.jsonl"
    _write(path, iter(servable))
    return ReplayTrace(path, workload.trace_block_size, workload.arrival_speedup, len(servable), excluded)


def _write(path: Path, records: Iterator[dict[str, Any]]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w") as handle:
        for record in records:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            count += 1
    return count


def _program_starts(scenario: Scenario, workload: AgentWorkload) -> Iterator[float]:
    if workload.arrival == "closed":
        yield from (0.0 for _ in range(workload.concurrency))
        return
    assert workload.rate_per_s is not None
    rng = arrival_rng(scenario.seed)  # the simulator's arrivals for this seed
    now = float(rng.exponential(1.0 / workload.rate_per_s))
    while now < scenario.duration_s:
        yield now
        now += float(rng.exponential(1.0 / workload.rate_per_s))


def _agent_records(scenario: Scenario, workload: AgentWorkload) -> Iterator[dict[str, Any]]:
    bs = scenario.cluster.engine.block_size
    system_blocks = workload.system_prompt_tokens // bs  # whole blocks of the shared prompt
    next_id = system_blocks  # ids 0 .. system_blocks-1 are the shared prompt's
    for index, start_s in enumerate(_program_starts(scenario, workload)):
        plan = plan_program(workload, scenario.seed, index, scenario.max_context_tokens)
        context = plan.system_tokens + plan.task_tokens
        base = next_id - system_blocks  # program block j >= system_blocks gets id base + j
        for turn, step in enumerate(plan.turns):
            blocks = blocks_for(context, bs)
            record: dict[str, Any] = {"session_id": plan.id}
            if turn == 0:
                record["timestamp"] = round((start_s + plan.setup_s) * 1000.0, 3)
            else:
                record["delay"] = round(plan.turns[turn - 1].tool_latency_s * 1000.0, 3)
            record["input_length"] = context
            record["output_length"] = step.output_tokens
            record["hash_ids"] = list(range(min(blocks, system_blocks))) + list(range(base + system_blocks, base + max(blocks, system_blocks)))
            yield record
            context += step.output_tokens + step.observation_tokens
        next_id = base + max(blocks_for(context, bs), system_blocks)
        if next_id > MAX_TRACE_ID:
            raise UnsupportedWorkload("workload: the exported trace needs more than 2**30 block ids; use fewer programs or a larger block size")
