"""Trace readers: real Mooncake traces, block-hash remapping, the Dynamo agent-trace format and
exact ``path:line`` errors for malformed files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SCENARIOS, TEST_DATA

from tasim.workloads.trace_formats import (
    TRACE_HASH_NAMESPACE,
    TraceError,
    TraceSession,
    TraceTurn,
    ideal_prefix_hit_rate,
    read_dynamo_agent_trace,
    read_mooncake,
)

TRACES = SCENARIOS / "traces"
DYNAMO_TRACE = TEST_DATA / "dynamo_agent_trace.jsonl"


def write_lines(path: Path, lines: list[object]) -> Path:
    """One line per item: dicts as JSON, strings verbatim (for malformed lines)."""
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def mooncake_line(input_length: int, hash_ids: list[int], timestamp: float = 0, output_length: int = 10) -> dict:
    return {"timestamp": timestamp, "input_length": input_length, "output_length": output_length, "hash_ids": hash_ids}


def h(j: int, trace_id: int) -> int:
    """Engine block ``j``'s hash when its last token lies in the trace block with ``trace_id``."""
    return TRACE_HASH_NAMESPACE + j * 2**30 + trace_id


# --- real Mooncake traces --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, count, hit_rate",
    [
        ("conversation_trace.jsonl", 12_031, 0.374),
        ("synthetic_trace.jsonl", 3_993, 0.651),
    ],
)
def test_real_trace_counts_and_ideal_hit_rate(name: str, count: int, hit_rate: float) -> None:
    requests = read_mooncake(TRACES / name, block_size=512)
    assert len(requests) == count
    assert [r.index for r in requests] == list(range(count))
    assert requests[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(requests, requests[1:]))
    assert ideal_prefix_hit_rate(requests, block_size=512) == pytest.approx(hit_rate, abs=0.005)


def test_real_trace_at_engine_block_size_16_keeps_full_blocks_only() -> None:
    requests = read_mooncake(TRACES / "synthetic_trace.jsonl", block_size=16)
    assert all(len(r.block_hashes) == r.prompt_tokens // 16 for r in requests)
    # Finer blocks can only reuse more of the same prefixes, never less.
    assert ideal_prefix_hit_rate(requests, block_size=16) >= 0.651 - 0.005


# --- Mooncake reading and remapping ----------------------------------------------------------


def test_session_lines_form_closed_loop_sessions(tmp_path: Path) -> None:
    """Dynamo's multi-turn form: lines sharing a session_id are one session, its turns in file
    order; the first turn's timestamp starts it (0 when absent), later turns wait `delay` ms
    after the previous one completes and their timestamps are ignored."""
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            {**mooncake_line(100, [0], timestamp=4000), "session_id": "b"},
            {"session_id": "a", "input_length": 64, "output_length": 2, "hash_ids": [9]},
            {**mooncake_line(600, [0, 1], timestamp=99999), "session_id": "b", "delay": 1500},
            mooncake_line(50, [7], timestamp=1000),
            {"session_id": "a", "delay": 250.5, "input_length": 80, "output_length": 3, "hash_ids": [9]},
        ],
    )
    requests = read_mooncake(path, block_size=16)
    assert [(r.index, r.session, r.turn, r.arrival_s, r.delay_s, r.prompt_tokens) for r in requests] == [
        (0, "a", 0, 0.0, 0.0, 64),
        (1, "a", 1, 0.0, 0.2505, 80),
        (2, None, 0, 1.0, 0.0, 50),
        (3, "b", 0, 4.0, 0.0, 100),
        (4, "b", 1, 4.0, 1.5, 600),
    ]


def test_arrivals_are_sorted_stably_and_shifted_to_zero(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            mooncake_line(100, [0], timestamp=5000, output_length=1),
            mooncake_line(200, [1], timestamp=3000, output_length=2),
            mooncake_line(300, [2], timestamp=3000.5, output_length=3),
            mooncake_line(400, [3], timestamp=3000, output_length=4),
        ],
    )
    requests = read_mooncake(path, block_size=16)
    assert [(r.index, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests] == [
        (0, 0.0, 200, 2),
        (1, 0.0, 400, 4),
        (2, 0.0005, 300, 3),
        (3, 2.0, 100, 1),
    ]


def test_shared_trace_block_gives_equal_leading_hashes_then_all_differ(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", [mooncake_line(1024, [0, 1]), mooncake_line(1024, [0, 2])])
    a, b = read_mooncake(path, block_size=16)
    assert len(a.block_hashes) == len(b.block_hashes) == 64
    assert a.block_hashes[:32] == b.block_hashes[:32]
    assert not set(a.block_hashes[32:]) & set(b.block_hashes[32:])
    assert len(set(a.block_hashes)) == 64
    assert a.block_hashes[:2] == (h(0, 0), h(1, 0)) and a.block_hashes[32] == h(32, 1)
    assert all(TRACE_HASH_NAMESPACE <= x < 2 * TRACE_HASH_NAMESPACE for x in a.block_hashes + b.block_hashes)


def test_only_full_engine_blocks_are_hashed(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", [mooncake_line(600, [4, 9]), mooncake_line(15, [3])])
    for block_size, lengths in [(16, (37, 0)), (512, (1, 0)), (1024, (0, 0)), (8, (75, 1))]:
        assert tuple(len(r.block_hashes) for r in read_mooncake(path, block_size)) == lengths
    # Blocks 32..36 lie in the partial trace block, so they carry its id.
    assert read_mooncake(path, 16)[0].block_hashes[31:] == (h(31, 4),) + tuple(h(j, 9) for j in range(32, 37))


def test_engine_block_spanning_trace_blocks_takes_the_id_holding_its_last_token(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            mooncake_line(2048, [5, 6, 7, 8]),
            mooncake_line(2048, [5, 6, 9, 10]),
            mooncake_line(2100, [5, 11, 12, 13, 14]),
        ],
    )
    a, b, c = read_mooncake(path, block_size=1024)
    assert a.block_hashes == (h(0, 6), h(1, 8))
    assert b.block_hashes == (h(0, 6), h(1, 10))
    assert c.block_hashes == (h(0, 11), h(1, 13))


def test_trace_block_size_parameter(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", [mooncake_line(40, [1, 2, 3, 4, 5], output_length=3)])
    (request,) = read_mooncake(path, block_size=4, trace_block_size=8)
    assert request.block_hashes == tuple(h(j, 1 + j // 2) for j in range(10))


@pytest.mark.parametrize("block_size, trace_block_size", [(100, 512), (0, 512), (768, 512), (16, 0)])
def test_block_sizes_that_do_not_nest_are_rejected(tmp_path: Path, block_size: int, trace_block_size: int) -> None:
    path = write_lines(tmp_path / "t.jsonl", [mooncake_line(512, [0])])
    with pytest.raises(ValueError) as error:
        read_mooncake(path, block_size, trace_block_size)
    assert not isinstance(error.value, TraceError)


def test_ideal_hit_rate_counts_leading_blocks_seen_before(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            mooncake_line(1024, [0, 1]),
            mooncake_line(1024, [0, 2]),  # hits 512
            mooncake_line(1100, [0, 1, 3]),  # hits 1024
            mooncake_line(512, [4]),
        ],
    )
    requests = read_mooncake(path, block_size=512)
    assert ideal_prefix_hit_rate(requests, 512) == pytest.approx((512 + 1024) / (1024 + 1024 + 1100 + 512))
    assert ideal_prefix_hit_rate([], 512) == 0.0


# --- Mooncake errors -------------------------------------------------------------------------

GOOD = mooncake_line(600, [0, 1])


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", "invalid JSON (Expecting property name enclosed in double quotes at column 2); expected one JSON object per line"),
        ("[1, 2]", "expected a JSON object (got [1, 2])"),
        ({**GOOD, "input_length": "abc"}, 'input_length must be a non-negative integer (got "abc")'),
        ({**GOOD, "output_length": -1}, "output_length must be a non-negative integer (got -1)"),
        ({**GOOD, "input_length": 6.5}, "input_length must be a non-negative integer (got 6.5)"),
        ({k: v for k, v in GOOD.items() if k != "output_length"}, "missing field output_length (expected a non-negative integer)"),
        ({**GOOD, "timestamp": "noon"}, 'timestamp must be a non-negative number (got "noon")'),
        ({**GOOD, "timestamp": -5}, "timestamp must be a non-negative number (got -5)"),
        ({**GOOD, "hash_ids": "0,1"}, 'hash_ids must be a list of integers in [0, 2**30) (got "0,1")'),
        ({**GOOD, "hash_ids": [0, True]}, "hash_ids must be a list of integers in [0, 2**30) (got element true)"),
        ({**GOOD, "hash_ids": [0, -3]}, "hash_ids must be a list of integers in [0, 2**30) (got element -3)"),
        ({**GOOD, "hash_ids": [0, 2**30]}, "hash_ids must be a list of integers in [0, 2**30) (got element 1073741824)"),
        ({**GOOD, "hash_ids": [0]}, "hash_ids has 1 ids, expected 2 (one per 512-token block of 600 input tokens)"),
        ({**GOOD, "hash_ids": [0, 1, 2]}, "hash_ids has 3 ids, expected 2 (one per 512-token block of 600 input tokens)"),
        ({**GOOD, "session_id": 7}, "session_id must be a non-empty string (got 7)"),
        ({**GOOD, "session_id": "s", "delay": -1}, "delay must be a non-negative number (got -1)"),
        ({**{k: v for k, v in GOOD.items() if k != "timestamp"}}, "missing field timestamp (expected a non-negative number)"),
    ],
)
def test_malformed_mooncake_line_names_path_and_line(tmp_path: Path, bad: object, message: str) -> None:
    # Line 3 holds the bad record: the blank line 2 still counts.
    path = write_lines(tmp_path / "bad.jsonl", [GOOD, "", bad, GOOD])
    with pytest.raises(TraceError) as error:
        read_mooncake(path, block_size=16)
    assert str(error.value) == f"{path}:3: {message}"


def test_missing_and_empty_mooncake_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as error:
        read_mooncake(tmp_path / "absent.jsonl", 16)
    assert str(error.value) == f"{tmp_path / 'absent.jsonl'}: file not found"
    empty = write_lines(tmp_path / "empty.jsonl", ["", "   "])
    with pytest.raises(TraceError) as error:
        read_mooncake(empty, 16)
    assert str(error.value) == f"{empty}: no requests (expected one JSON object per line)"


# --- Dynamo agent traces ---------------------------------------------------------------------

A, B = 0, 1  # dense numbers of the two big sequence hashes every "main" prompt starts with


def test_dynamo_agent_trace_sessions_turns_and_gaps() -> None:
    sessions = read_dynamo_agent_trace(DYNAMO_TRACE, block_size=2)
    # Sequence hashes are numbered by first appearance, requests in start order:
    # m1 -> A, B, 2 (its partial tail); s1 -> 3, 4; s2 -> 5; m2 -> 6, 7; m3 -> 8.
    assert sessions == [
        TraceSession(
            id="main",
            start_s=0.0,
            parent_id=None,
            turns=(
                TraceTurn(10, 5, (h(0, A), h(1, A), h(2, B), h(3, B), h(4, 2)), gap_before_s=0.0, tool_s=0.0),
                # m1 ended at 1200, m2 started at 1800; tool t1 ran 1250-1700.
                TraceTurn(16, 6, (h(0, A), h(1, A), h(2, B), h(3, B), h(4, 6), h(5, 6), h(6, 7), h(7, 7)), gap_before_s=0.6, tool_s=0.45),
                # m2 ended at 2100, m3 started at 2600; t2 ran 2100-2400 (start from its tool_start),
                # t3 2300-2500 (a tool_error), overlapping: 400 ms of tool time.
                TraceTurn(16, 7, (h(0, A), h(1, A), h(2, B), h(3, B), h(4, 6), h(5, 6), h(6, 8), h(7, 8)), gap_before_s=0.5, tool_s=0.4),
            ),
        ),
        # s1 has no total_time_ms: it ended at its event time, 1400.
        TraceSession(
            id="sub",
            start_s=0.3,
            parent_id="main",
            turns=(
                TraceTurn(8, 3, (h(0, 3), h(1, 3), h(2, 4), h(3, 4)), gap_before_s=0.0, tool_s=0.0),
                TraceTurn(12, 4, (h(0, 3), h(1, 3), h(2, 4), h(3, 4), h(4, 5), h(5, 5)), gap_before_s=0.05, tool_s=0.0),
            ),
        ),
    ]


def test_dynamo_engine_blocks_spanning_trace_blocks() -> None:
    main, sub = read_dynamo_agent_trace(DYNAMO_TRACE, block_size=8)
    assert [turn.block_hashes for turn in main.turns] == [(h(0, B),), (h(0, B), h(1, 7)), (h(0, B), h(1, 8))]
    assert [turn.block_hashes for turn in sub.turns] == [(h(0, 4),), (h(0, 4),)]


def dynamo_request(request_id: str, received_ms: int, hashes: list[int], session: str | None = None, block_size: int = 4, **context: str) -> dict:
    record = {
        "schema": "dynamo.request.trace.v1",
        "event_type": "request_end",
        "event_time_unix_ms": received_ms + 10,
        "request": {
            "request_id": request_id,
            "output_tokens": 2,
            "request_received_ms": received_ms,
            "total_time_ms": 10,
            "replay": {"trace_block_size": block_size, "input_length": block_size * len(hashes), "input_sequence_hashes": hashes},
        },
    }
    if session is not None:
        record["agent_context"] = {"session_id": session, **context}
    return record


def test_requests_without_agent_context_are_sessions_of_their_own(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", [dynamo_request("r2", 1500, [9]), dynamo_request("r1", 1000, [9, 8])])
    sessions = read_dynamo_agent_trace(path, block_size=4)
    assert [(s.id, s.start_s, len(s.turns)) for s in sessions] == [("r1", 0.0, 1), ("r2", 0.5, 1)]
    assert sessions[0].turns[0].block_hashes[0] == sessions[1].turns[0].block_hashes[0] == h(0, 0)


def tool_event(event_type: str, tool: dict, session: str = "s") -> dict:
    return {
        "schema": "dynamo.request.trace.v1",
        "event_type": event_type,
        "event_time_unix_ms": 50,
        "agent_context": {"session_id": session},
        "tool": {"tool_call_id": "t", **tool},
    }


def replay_of(record: dict, **changes: object) -> dict:
    """``record`` with its request.replay fields changed."""
    request = record["request"]
    return {**record, "request": {**request, "replay": {**request["replay"], **changes}}}


OK = dynamo_request("a", 100, [1, 2], session="s")


@pytest.mark.parametrize(
    "bad, message",
    [
        (
            {**OK, "event_type": "span_end"},
            'unknown event_type "span_end" (expected one of request_end, tool_start, tool_end, tool_error, request_payload)',
        ),
        ({**OK, "schema": "dynamo.request.trace.v2"}, 'schema must be "dynamo.request.trace.v1" (got "dynamo.request.trace.v2")'),
        ({k: v for k, v in OK.items() if k != "request"}, "missing field request (expected a JSON object)"),
        ({**OK, "request": {**OK["request"], "replay": None}}, "replay must be a JSON object (got null)"),
        ({**OK, "request": {**OK["request"], "output_tokens": "2"}}, 'output_tokens must be a non-negative integer (got "2")'),
        ({**OK, "agent_context": {"session_id": 7}}, "session_id must be a non-empty string (got 7)"),
        (replay_of(OK, input_length=9), "input_sequence_hashes has 2 ids, expected 3 (one per 4-token block of 9 input tokens)"),
        (
            replay_of(OK, input_sequence_hashes=[1, 2**64]),
            "input_sequence_hashes must be a list of integers in [0, 2**64) (got element 18446744073709551616)",
        ),
        (
            replay_of(OK, trace_block_size=8, input_length=16),
            "trace_block_size 8 differs from earlier requests' 4 (expected one block size per trace)",
        ),
        ({**OK, "request": {**OK["request"], "request_id": "first"}}, 'duplicate request_id "first" (first at {path}:1; expected unique ids)'),
        (
            {**OK, "request": {**OK["request"], "total_time_ms": None}, "event_time_unix_ms": 90},
            "event_time_unix_ms 90 is before request_received_ms 100 (expected a request to end after it starts)",
        ),
        (
            tool_event("tool_end", {"started_at_unix_ms": 70, "ended_at_unix_ms": 60}),
            "tool ends at 60 before it starts at 70 (expected ended_at_unix_ms >= started_at_unix_ms)",
        ),
        ({**tool_event("tool_start", {}), "agent_context": None}, "agent_context must be a JSON object (got null)"),
        (
            dynamo_request("b", 200, [5], session="s", parent_session_id="p2"),
            'session "s" has conflicting parent_session_id values "p1", "p2" (expected one parent per session)',
        ),
    ],
)
def test_malformed_dynamo_line_names_path_and_line(tmp_path: Path, bad: dict, message: str) -> None:
    first = dynamo_request("first", 0, [3], session="s", parent_session_id="p1")
    path = write_lines(tmp_path / "agent.jsonl", [first, bad])
    with pytest.raises(TraceError) as error:
        read_dynamo_agent_trace(path, block_size=4)
    assert str(error.value) == f"{path}:2: {message.format(path=path)}"


def test_dynamo_trace_block_size_must_nest_with_engine_blocks(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "agent.jsonl", [tool_event("tool_start", {}), OK])
    with pytest.raises(TraceError) as error:
        read_dynamo_agent_trace(path, block_size=3)
    assert str(error.value) == f"{path}:2: block_size 3 must divide trace_block_size 4 or be a multiple of it"


def test_dynamo_trace_without_requests_is_an_error(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "agent.jsonl", [tool_event("tool_start", {})])
    with pytest.raises(TraceError) as error:
        read_dynamo_agent_trace(path, block_size=4)
    assert str(error.value) == f"{path}: no request_end records (expected at least one request)"
    with pytest.raises(TraceError) as error:
        read_dynamo_agent_trace(tmp_path / "absent.jsonl", block_size=4)
    assert str(error.value) == f"{tmp_path / 'absent.jsonl'}: file not found"
