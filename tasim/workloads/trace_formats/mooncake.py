"""Mooncake request traces (kvcache-ai/Mooncake, FAST'25): one JSON object per line.

Fields: ``timestamp`` (ms from trace start), ``input_length`` and ``output_length`` (tokens),
``hash_ids`` (one id per ``trace_block_size``-token block of the prompt, partial tail included,
so ``len == ceil(input_length / trace_block_size)``; equal ids at equal positions mean the whole
prefix up to that block is identical). Other fields are ignored.

Multi-turn sessions, as Dynamo's replay reads them: lines that share a ``session_id`` are one
closed-loop session whose turns run in file order. Its first line's ``timestamp`` is the
session's start (0 when absent); each later line is sent ``delay`` ms (0 when absent) after the
previous turn completes, and its ``timestamp``, if any, is ignored.

``block_hashes`` are the hashes of the prompt's full engine blocks, remapped from the trace's
ids as described in :mod:`tasim.workloads.trace_formats.reading`: ``2**62 + j * 2**30 + hash_id`` for engine
block ``j``, with ``hash_id`` taken from the trace block that holds the block's last token.
Trace ids must therefore be below ``2**30`` (the published traces stay under 200,000).
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Sequence

from tasim.core.gc_pacing import fewer_collections
from tasim.core.model import check_block_sizes
from tasim.core.records import record
from tasim.workloads.trace_formats.reading import (
    MAX_TRACE_ID,
    Record,
    TraceError,
    check_hash_count,
    count_field,
    engine_block_hashes,
    id_list_field,
    read_json_lines,
    string_field,
    time_field,
)


@record
class TraceRequest:
    """One trace line. ``index`` is the position in replay order: sessions (a line without a
    ``session_id`` is a session of one) by start time, file order for ties, then their turns.
    ``arrival_s`` is the session's start; a later turn (``turn > 0``) is sent ``delay_s`` after
    the previous one completes."""

    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]
    session: str | None = None
    turn: int = 0
    delay_s: float = 0.0


@record
class _Line:
    timestamp_ms: float | None
    delay_ms: float
    session: str | None
    input_length: int
    output_length: int
    hash_ids: list[int]


def _parse_line(where: str, record: Record, trace_block_size: int) -> _Line:
    session = string_field(record, "session_id", where) if "session_id" in record else None
    if session is None or "timestamp" in record:
        timestamp: float | None = time_field(record, "timestamp", where)
    else:
        timestamp = None
    delay = time_field(record, "delay", where) if "delay" in record else 0.0
    input_length = count_field(record, "input_length", where)
    output_length = count_field(record, "output_length", where)
    hash_ids = id_list_field(record, "hash_ids", where, MAX_TRACE_ID)
    check_hash_count(hash_ids, input_length, trace_block_size, "hash_ids", where)
    return _Line(timestamp, delay, session, input_length, output_length, hash_ids)


def _sessions(path: str | os.PathLike[str], trace_block_size: int) -> list[list[tuple[Record, _Line]]]:
    """Every line, checked, grouped into sessions (a line without a session is its own): turns
    in file order, sessions sorted by their first line's start (stable: ties keep file order)."""
    grouped: dict[str | int, list[tuple[Record, _Line]]] = {}
    with fewer_collections():
        for number, (where, record) in enumerate(read_json_lines(path)):
            line = _parse_line(where, record, trace_block_size)
            grouped.setdefault(number if line.session is None else line.session, []).append((record, line))
    if not grouped:
        raise TraceError(f"{os.fspath(path)}: no requests (expected one JSON object per line)")
    return sorted(grouped.values(), key=lambda turns: turns[0][1].timestamp_ms or 0.0)


def read_mooncake_records(path: str | os.PathLike[str], trace_block_size: int = 512) -> list[Record]:
    """The trace's lines, checked, as they were read, in replay order (see :class:`TraceRequest`):
    for writing a cut or filtered copy that replays the same way."""
    return [record for turns in _sessions(path, trace_block_size) for record, _ in turns]


def read_mooncake(path: str | os.PathLike[str], block_size: int, trace_block_size: int = 512) -> list[TraceRequest]:
    """Requests in replay order (see :class:`TraceRequest`), start times in seconds with the
    earliest at 0.

    Raises ``ValueError`` if the block sizes do not nest and :class:`TraceError` for a missing,
    empty or malformed file.
    """
    check_block_sizes(block_size, trace_block_size)
    with fewer_collections():
        sessions = [[line for _, line in turns] for turns in _sessions(path, trace_block_size)]
        start_ms = sessions[0][0].timestamp_ms or 0.0
        requests: list[TraceRequest] = []
        for turns in sessions:
            arrival_s = ((turns[0].timestamp_ms or 0.0) - start_ms) / 1000.0
            for turn, line in enumerate(turns):
                requests.append(
                    TraceRequest(
                        index=len(requests),
                        arrival_s=arrival_s,
                        prompt_tokens=line.input_length,
                        output_tokens=line.output_length,
                        block_hashes=engine_block_hashes(line.hash_ids, line.input_length, block_size, trace_block_size),
                        session=line.session,
                        turn=turn,
                        delay_s=line.delay_ms / 1000.0 if turn else 0.0,
                    )
                )
    return requests


def ideal_prefix_hit_rate(requests: Sequence[TraceRequest], block_size: int) -> float:
    """Share of prompt tokens an unbounded prefix cache would serve, requests taken in order.

    A request hits its leading blocks that any earlier request's prompt already contained.
    ``block_size`` is the one the requests were read with.
    """
    seen: set[int] = set()
    hit_tokens = 0
    prompt_tokens = 0
    for request in requests:
        hashes = request.block_hashes
        # Hashes are chained: a seen block means its whole prefix was seen, so a prompt's seen
        # blocks come first and a binary search finds where they end.
        leading = bisect_left(range(len(hashes)), True, key=lambda i: hashes[i] not in seen)
        hit_tokens += min(leading * block_size, request.prompt_tokens)
        prompt_tokens += request.prompt_tokens
        seen.update(hashes[leading:])
    return hit_tokens / prompt_tokens if prompt_tokens else 0.0
