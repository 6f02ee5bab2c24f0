"""Recorded traces as scripts: each session a program, each recorded request one of its calls.

A trace fixes when each session starts and what each call asks for; `mooncake_scripts` and
`dynamo_trace_scripts` yield ``(start time, Script)`` in start order, and whoever runs them
decides what waiting means. A request's generated tokens get block hashes only it has (no other
prompt is known to contain them): owner keys from `tasim.core.determinism.TRACE_OUTPUTS`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tasim.config.scenario import DynamoTraceWorkload, MooncakeTraceWorkload
from tasim.core.determinism import TRACE_OUTPUTS
from tasim.core.model import RequestSpec, with_private_tail
from tasim.workloads.programs import Script
from tasim.workloads.trace_formats import TraceRequest, TraceSession, read_dynamo_agent_trace, read_mooncake

Start = tuple[float, Script]


def mooncake_scripts(workload: MooncakeTraceWorkload, block_size: int) -> Iterator[Start]:
    """Sessions (or lone requests) of a Mooncake trace, at their first request's arrival."""
    requests = read_mooncake(Path(workload.path), block_size, workload.trace_block_size)[: workload.max_requests]
    for turns in _by_session(requests):
        first = turns[0]
        program = f"r{first.index}" if first.session is None else f"s:{first.session}"
        yield first.arrival_s / workload.arrival_speedup, Script(program, len(turns), _mooncake_calls(program, turns, block_size))


def _by_session(requests: list[TraceRequest]) -> Iterator[list[TraceRequest]]:
    """Each session's turns: the reader keeps them together, first turn first."""
    turns: list[TraceRequest] = []
    for request in requests:
        if request.turn == 0 and turns:
            yield turns
            turns = []
        turns.append(request)
    if turns:
        yield turns


def _mooncake_calls(program: str, turns: list[TraceRequest], block_size: int) -> Iterator[tuple[float, RequestSpec]]:
    history = 0
    for request in turns:
        prompt, output = _at_least_one(request.prompt_tokens, request.output_tokens)
        hashes = with_private_tail(request.block_hashes, prompt + output, TRACE_OUTPUTS.key(request.index), block_size)
        yield request.delay_s, RequestSpec(f"{program}.{request.turn}", program, request.turn, prompt, output, history, hashes)
        history = prompt + output


def dynamo_trace_scripts(workload: DynamoTraceWorkload, block_size: int) -> Iterator[Start]:
    """Agent sessions of a Dynamo request trace, at their first turn's start. Owner keys are
    numbered in the order calls are made (one counter for the whole replay), as recorded runs
    of this replay have them."""
    sessions = read_dynamo_agent_trace(Path(workload.path), block_size)[: workload.max_sessions]
    owners = iter(range(TRACE_OUTPUTS.start, TRACE_OUTPUTS.stop))
    for session in sessions:
        yield session.start_s, Script(session.id, len(session.turns), _session_calls(session, owners, workload.gap_scale, block_size))


def _session_calls(session: TraceSession, owners: Iterator[int], gap_scale: float, block_size: int) -> Iterator[tuple[float, RequestSpec]]:
    history = 0
    for turn, step in enumerate(session.turns):
        prompt, output = _at_least_one(step.prompt_tokens, step.output_tokens)
        hashes = with_private_tail(step.block_hashes, prompt + output, next(owners), block_size)
        yield step.gap_before_s * gap_scale, RequestSpec(f"{session.id}.{turn}", session.id, turn, prompt, output, history, hashes)
        history = prompt + output


def _at_least_one(prompt_tokens: int, output_tokens: int) -> tuple[int, int]:
    """Traces may record empty prompts or outputs; an engine always computes at least one prompt
    token and emits at least the first output token, so both count as one."""
    return max(1, prompt_tokens), max(1, output_tokens)
