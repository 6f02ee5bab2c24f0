"""Mooncake request traces (kvcache-ai/Mooncake, FAST'25): one JSON object per line.

Fields: ``timestamp`` (ms from trace start), ``input_length`` and ``output_length`` (tokens),
``hash_ids`` (one id per ``trace_block_size``-token block of the prompt, partial tail included,
so ``len == ceil(input_length / trace_block_size)``; equal ids at equal positions mean the whole
prefix up to that block is identical). Other fields are ignored.

``block_hashes`` are the hashes of the prompt's full engine blocks, remapped from the trace's
ids as described in :mod:`tasim.traces.common`: ``2**62 + j * 2**30 + hash_id`` for engine
block ``j``, with ``hash_id`` taken from the trace block that holds the block's last token.
Trace ids must therefore be below ``2**30`` (the published traces stay under 200,000).
"""

from __future__ import annotations

import os
from bisect import bisect_left
from dataclasses import dataclass
from typing import Sequence

from tasim.traces.common import (
    MAX_TRACE_ID,
    TraceError,
    check_block_sizes,
    check_hash_count,
    count_field,
    engine_block_hashes,
    id_list_field,
    read_json_lines,
    time_field,
)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One trace line. ``index`` is the position in arrival order (file order for ties)."""

    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Line:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: list[int]


def _parse_line(where: str, record: dict, trace_block_size: int) -> _Line:
    timestamp = time_field(record, "timestamp", where)
    input_length = count_field(record, "input_length", where)
    output_length = count_field(record, "output_length", where)
    hash_ids = id_list_field(record, "hash_ids", where, MAX_TRACE_ID)
    check_hash_count(hash_ids, input_length, trace_block_size, "hash_ids", where)
    return _Line(timestamp, input_length, output_length, hash_ids)


def read_mooncake(path: str | os.PathLike[str], block_size: int,
                  trace_block_size: int = 512) -> list[TraceRequest]:
    """Requests in arrival order, arrivals in seconds with the earliest at 0.

    Raises ``ValueError`` if the block sizes do not nest and :class:`TraceError` for a missing,
    empty or malformed file.
    """
    check_block_sizes(block_size, trace_block_size)
    lines = [_parse_line(where, record, trace_block_size) for where, record in read_json_lines(path)]
    if not lines:
        raise TraceError(f"{os.fspath(path)}: no requests (expected one JSON object per line)")
    lines.sort(key=lambda line: line.timestamp_ms)  # stable: ties keep file order
    start_ms = lines[0].timestamp_ms
    return [
        TraceRequest(
            index=index,
            arrival_s=(line.timestamp_ms - start_ms) / 1000.0,
            prompt_tokens=line.input_length,
            output_tokens=line.output_length,
            block_hashes=engine_block_hashes(line.hash_ids, line.input_length, block_size, trace_block_size),
        )
        for index, line in enumerate(lines)
    ]


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
