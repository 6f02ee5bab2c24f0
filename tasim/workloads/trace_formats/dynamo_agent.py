"""Dynamo agent traces: the ``dynamo.request.trace.v1`` JSONL that Dynamo's request tracing
writes (``DYN_REQUEST_TRACE``) and its offline replay reads (``trace_format="dynamo"``).

Format (as in ai-dynamo/dynamo ``lib/data-gen/src/request_trace/load.rs``, the loader behind
``dynamo.replay``, and the fixture ``replay/tests/e2e/configs/unified_cli/fixtures/traces/
dynamo-agentic.jsonl`` in the ``ai-dynamo`` wheel). Every line is an object with
``schema: "dynamo.request.trace.v1"``, ``event_type``, ``event_time_unix_ms`` and optional
``agent_context: {session_id, parent_session_id?}``; a line may also be wrapped as
``{"event": {...}}``. Event types:

- ``request_end``: one LLM call, ``request: {request_id, request_received_ms, total_time_ms?,
  output_tokens, replay: {trace_block_size, input_length, input_sequence_hashes}}``. It ran
  from ``request_received_ms`` for ``total_time_ms`` (else until ``event_time_unix_ms``).
  ``input_sequence_hashes`` has one hash per ``trace_block_size``-token block, partial tail
  included; Dynamo computes them as *sequence* hashes (each chains the previous block's, see
  ``input_sequence_hashes`` in dynamo-llm ``request_trace/replay.rs``), so equal hashes at
  equal positions already mean equal prefixes and need no further chaining.
  ``trace_block_size`` is the serving engine's KV block size; one trace uses one.
- ``tool_start`` / ``tool_end`` / ``tool_error``: a harness tool call of the session,
  ``tool: {tool_call_id, started_at_unix_ms?, ended_at_unix_ms?, duration_ms?}``.
- ``request_payload``: prompt and response bodies; skipped.

Sessions and turns. A session is the requests sharing ``agent_context.session_id`` (a request
without agent context is a session of its own, named by its ``request_id``), its turns ordered
by start. A turn's ``gap_before_s`` is the time from the previous turn's end to its start
(0 for the first turn, and 0 when the two overlap): tool time or think time, whichever the
agent spent. ``tool_s`` is the part of that gap covered by the session's tool spans.

Block hashes. Sequence hashes are 64-bit, too wide for the namespace encoding of
:mod:`tasim.workloads.trace_formats.reading`, so each distinct hash is first numbered densely in order of first
appearance (requests by start time); the number then plays the trace id's part. Equal hashes
get equal numbers, so the result is a deterministic function of the file's contents.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tasim.core.gc_pacing import fewer_collections
from tasim.core.model import check_block_sizes
from tasim.workloads.trace_formats.reading import (
    Record,
    TraceError,
    check_hash_count,
    count_field,
    engine_block_hashes,
    id_list_field,
    ms,
    object_field,
    positive_field,
    read_json_lines,
    shown,
    string_field,
    time_field,
)

SCHEMA = "dynamo.request.trace.v1"
_EVENT_TYPES = ("request_end", "tool_start", "tool_end", "tool_error", "request_payload")
_HASH_LIMIT = 1 << 64


@dataclass(frozen=True, slots=True)
class TraceTurn:
    """One LLM call. ``gap_before_s``: from the previous turn's end to this turn's start (0 for
    the first); ``tool_s``: the part of that gap the session's tool calls covered, the rest
    being think time."""

    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]
    gap_before_s: float
    tool_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TraceSession:
    """``start_s``: first turn's start, seconds after the trace's earliest request;
    ``parent_id``: the session that spawned this one (a sub-agent), if the trace says."""

    id: str
    start_s: float
    turns: tuple[TraceTurn, ...]
    parent_id: str | None = None


@dataclass(frozen=True, slots=True)
class _Request:
    where: str
    request_id: str
    session_id: str
    parent_id: str | None
    start_ms: float
    end_ms: float
    input_length: int
    output_tokens: int
    sequence_hashes: list[int]


@dataclass
class _Trace:
    """What the lines of one file add up to, before grouping into sessions."""

    path: str
    block_size: int
    trace_block_size: int | None = None
    requests: list[_Request] = field(default_factory=list)
    request_lines: dict[str, str] = field(default_factory=dict)
    tool_starts: dict[tuple[str, str], float] = field(default_factory=dict)
    tool_spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


def read_dynamo_agent_trace(path: str | os.PathLike[str], block_size: int) -> list[TraceSession]:
    """Sessions ordered by start time (then id), each with its turns in order.

    Raises :class:`TraceError` for a missing, empty or malformed file, or a trace block size
    that does not nest with ``block_size``.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive (got {block_size})")
    trace = _Trace(os.fspath(path), block_size)
    with fewer_collections():
        for where, record in read_json_lines(path):
            _add_record(trace, where, _unwrap(record))
        if not trace.requests:
            raise TraceError(f"{trace.path}: no request_end records (expected at least one request)")
        return _sessions(trace)


def _unwrap(record: Record) -> Record:
    # Some exports wrap each record with an outer timestamp: {"timestamp": ..., "event": {...}}.
    event = record.get("event")
    return event if "schema" not in record and isinstance(event, dict) else record


def _add_record(trace: _Trace, where: str, record: Record) -> None:
    event_type = record.get("event_type")
    if event_type == "request_payload":  # bodies only; Dynamo skips them unchecked, schema or not
        return
    schema = record.get("schema")
    if schema != SCHEMA:
        raise TraceError(f"{where}: schema must be {shown(SCHEMA)} (got {shown(schema)})")
    if event_type not in _EVENT_TYPES:
        raise TraceError(f"{where}: unknown event_type {shown(event_type)} (expected one of {', '.join(_EVENT_TYPES)})")
    event_ms = time_field(record, "event_time_unix_ms", where)
    if event_type == "request_end":
        _add_request(trace, where, record, event_ms)
    else:
        _add_tool_event(trace, where, record, event_type, event_ms)


def _optional_time(record: Record, key: str, where: str) -> float | None:
    return None if record.get(key) is None else time_field(record, key, where)


def _session_of(record: Record, where: str, request_id: str) -> tuple[str, str | None]:
    """(session id, parent session id) of a request."""
    if record.get("agent_context") is None:
        return request_id, None
    context = object_field(record, "agent_context", where)
    session_id = string_field(context, "session_id", where)
    parent_id = None if context.get("parent_session_id") is None else string_field(context, "parent_session_id", where)
    return session_id, parent_id


def _add_request(trace: _Trace, where: str, record: Record, event_ms: float) -> None:
    request = object_field(record, "request", where)
    request_id = string_field(request, "request_id", where)
    if request_id in trace.request_lines:
        raise TraceError(f"{where}: duplicate request_id {shown(request_id)} (first at {trace.request_lines[request_id]}; expected unique ids)")
    session_id, parent_id = _session_of(record, where, request_id)
    start_ms = time_field(request, "request_received_ms", where)
    total_ms = _optional_time(request, "total_time_ms", where)
    end_ms = start_ms + total_ms if total_ms is not None else event_ms
    if end_ms < start_ms:
        raise TraceError(
            f"{where}: event_time_unix_ms {ms(event_ms)} is before request_received_ms {ms(start_ms)} (expected a request to end after it starts)"
        )
    output_tokens = count_field(request, "output_tokens", where)
    replay = object_field(request, "replay", where)
    trace_block_size = positive_field(replay, "trace_block_size", where)
    _check_trace_block_size(trace, where, trace_block_size)  # now trace.trace_block_size
    input_length = count_field(replay, "input_length", where)
    hashes = id_list_field(replay, "input_sequence_hashes", where, _HASH_LIMIT)
    check_hash_count(hashes, input_length, trace_block_size, "input_sequence_hashes", where)
    trace.request_lines[request_id] = where
    trace.requests.append(_Request(where, request_id, session_id, parent_id, start_ms, end_ms, input_length, output_tokens, hashes))


def _check_trace_block_size(trace: _Trace, where: str, size: int) -> None:
    """Hashes at different block sizes are incomparable, so a trace must keep to one."""
    if trace.trace_block_size is None:
        try:
            check_block_sizes(trace.block_size, size)
        except ValueError as error:
            raise TraceError(f"{where}: {error}") from None
        trace.trace_block_size = size
    elif size != trace.trace_block_size:
        raise TraceError(
            f"{where}: trace_block_size {size} differs from earlier requests' {trace.trace_block_size} (expected one block size per trace)"
        )


def _add_tool_event(trace: _Trace, where: str, record: Record, event_type: str, event_ms: float) -> None:
    """``tool_start`` opens a span that the terminal ``tool_end``/``tool_error`` closes."""
    session_id = string_field(object_field(record, "agent_context", where), "session_id", where)
    tool = object_field(record, "tool", where)
    key = (session_id, string_field(tool, "tool_call_id", where))
    started = _optional_time(tool, "started_at_unix_ms", where)
    if event_type == "tool_start":
        trace.tool_starts[key] = event_ms if started is None else started
        return
    ended = _optional_time(tool, "ended_at_unix_ms", where)
    end_ms = event_ms if ended is None else ended
    start_ms = started if started is not None else trace.tool_starts.pop(key, None)
    if start_ms is None:
        duration = _optional_time(tool, "duration_ms", where)
        start_ms = end_ms - (duration or 0.0)
    if end_ms < start_ms:
        raise TraceError(f"{where}: tool ends at {ms(end_ms)} before it starts at {ms(start_ms)} (expected ended_at_unix_ms >= started_at_unix_ms)")
    trace.tool_spans.setdefault(session_id, []).append((start_ms, end_ms))


def _sessions(trace: _Trace) -> list[TraceSession]:
    requests = sorted(trace.requests, key=lambda r: (r.start_ms, r.end_ms, r.request_id))
    hashes = _engine_hashes(trace, requests)
    by_session: dict[str, list[_Request]] = {}
    for request in requests:
        by_session.setdefault(request.session_id, []).append(request)
    origin_ms = requests[0].start_ms
    sessions = []
    for session_id, turns in by_session.items():
        spans = sorted(trace.tool_spans.get(session_id, ()))
        sessions.append(
            TraceSession(
                id=session_id,
                start_s=(turns[0].start_ms - origin_ms) / 1000.0,
                turns=tuple(_turns(turns, spans, hashes)),
                parent_id=_parent_of(turns),
            )
        )
    sessions.sort(key=lambda s: (s.start_s, s.id))
    return sessions


def _engine_hashes(trace: _Trace, requests: list[_Request]) -> dict[str, tuple[int, ...]]:
    """Engine-block hashes per request id, numbering sequence hashes as the module says."""
    dense: dict[int, int] = {}
    assert trace.trace_block_size is not None  # set by the first request
    return {
        request.request_id: engine_block_hashes(
            [dense.setdefault(h, len(dense)) for h in request.sequence_hashes], request.input_length, trace.block_size, trace.trace_block_size
        )
        for request in requests
    }


def _parent_of(turns: list[_Request]) -> str | None:
    parents = {turn.parent_id for turn in turns if turn.parent_id is not None}
    if len(parents) > 1:
        late = next(turn for turn in reversed(turns) if turn.parent_id is not None)
        raise TraceError(
            f"{late.where}: session {shown(late.session_id)} has conflicting parent_session_id "
            f"values {', '.join(map(shown, sorted(parents)))} (expected one parent per session)"
        )
    return next(iter(parents), None)


def _turns(requests: list[_Request], spans: list[tuple[float, float]], hashes: dict[str, tuple[int, ...]]) -> list[TraceTurn]:
    turns = []
    previous_end: float | None = None
    for request in requests:
        gap_ms = tool_ms = 0.0
        if previous_end is not None and request.start_ms > previous_end:
            gap_ms = request.start_ms - previous_end
            tool_ms = _covered_ms(spans, previous_end, request.start_ms)
        turns.append(TraceTurn(request.input_length, request.output_tokens, hashes[request.request_id], gap_ms / 1000.0, tool_ms / 1000.0))
        previous_end = request.end_ms
    return turns


def _covered_ms(spans: list[tuple[float, float]], low: float, high: float) -> float:
    """Length of ``[low, high]`` covered by the union of ``spans`` (sorted by start)."""
    covered = 0.0
    reach = low
    for start, end in spans:
        if start >= high:
            break
        start, end = max(start, reach), min(end, high)
        if end > start:
            covered += end - start
            reach = end
    return covered
