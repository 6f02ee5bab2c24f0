"""`tasim.live.router.kv_events`: decoding the KV-event wire format, and the subscriber's sequence gaps."""

from __future__ import annotations

import pytest

# the live extra
msgpack = pytest.importorskip("msgpack")
pytest.importorskip("zmq")
pytest.importorskip("xxhash")

from conftest import kv_event_frames as _frames  # noqa: E402
from conftest import tokens as _tokens  # noqa: E402

from tasim.live.router.kv_events import KvEvent, KvEventSubscriber, decode_message  # noqa: E402


def test_decode_mocker_message() -> None:
    tokens = _tokens(32)
    frames = _frames(
        42,
        [
            {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": tokens, "block_size": 16},
            {"type": "BlockRemoved", "block_hashes": [3]},
            {"type": "AllBlocksCleared"},
        ],
    )
    seq, events = decode_message(frames)
    assert seq == 42
    assert events == [KvEvent("stored", (1, 2), tuple(tokens)), KvEvent("removed", (3,)), KvEvent("cleared")]


def test_decode_vllm_array_message() -> None:
    tokens = _tokens(32)
    big = 2**64 - 1  # hashes are u64: msgpack must keep them exact
    frames = _frames(
        7,
        [
            ["BlockStored", [1, big], None, tokens, 16, None, "GPU"],
            ["BlockRemoved", [big], "GPU"],
            ["AllBlocksCleared"],
            ["SomethingNew", [9]],  # unknown tags are skipped
        ],
    )
    seq, events = decode_message(frames)
    assert seq == 7
    assert events == [KvEvent("stored", (1, big), tuple(tokens)), KvEvent("removed", (big,)), KvEvent("cleared")]


def test_events_keep_the_tier_their_medium_names() -> None:
    """vLLM 0.31 encodes its events as maps (msgspec tags, only the batch is an array): its CPU
    offloading publishes ``medium: CPU``; the mocker's host tier ``CPU_PINNED``; the array form
    carries ``medium`` after ``lora_id``. A missing or unknown medium is the GPU, as in Dynamo."""
    frames = _frames(
        1,
        [
            {
                "type": "BlockStored",
                "block_hashes": [1],
                "parent_block_hash": None,
                "token_ids": [],
                "block_size": 0,
                "lora_id": None,
                "medium": "CPU",
                "lora_name": None,
            },
            {"type": "BlockRemoved", "block_hashes": [1], "medium": "CPU_PINNED"},
            {"type": "BlockStored", "block_hashes": [2], "medium": "NVME"},
            {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"},
            {"type": "BlockRemoved", "block_hashes": [3], "medium": "SOMETHING_NEW"},
            ["BlockStored", [4], None, [], 16, None, "CPU_TIER1"],
            ["BlockRemoved", [4], "DISK"],
            ["BlockRemoved", [5]],
        ],
    )
    _, events = decode_message(frames)
    assert [(e.kind, e.blocks, e.tier) for e in events] == [
        ("stored", (1,), "host"),
        ("removed", (1,), "host"),
        ("stored", (2,), "disk"),
        ("removed", (2,), "device"),
        ("removed", (3,), "device"),
        ("stored", (4,), "host"),
        ("removed", (4,), "disk"),
        ("removed", (5,), "device"),
    ]


@pytest.mark.parametrize(
    "frames",
    [
        [b"", (1).to_bytes(8, "big")],  # two frames
        [b"", (1).to_bytes(4, "big"), msgpack.packb([0.0, [], 0])],  # 4-byte sequence number
        [b"", (1).to_bytes(8, "big"), msgpack.packb({"events": []})],  # payload not an array
        [b"", (1).to_bytes(8, "big"), msgpack.packb([0.0])],  # no events
        [b"", (1).to_bytes(8, "big"), msgpack.packb([0.0, "x", 0])],  # events not an array
        [b"", (1).to_bytes(8, "big"), b"\xc1"],  # not msgpack
        [b"", (1).to_bytes(8, "big"), msgpack.packb([0.0, [], 0]) + b"\x01"],  # trailing bytes
    ],
)
def test_decode_rejects_bad_frames(frames: list[bytes]) -> None:
    with pytest.raises(ValueError):
        decode_message(frames)


def test_subscriber_counts_sequence_gaps_and_skips_bad_messages() -> None:
    seen: list[tuple[str, KvEvent]] = []
    sub = KvEventSubscriber({}, lambda w, e: seen.append((w, e)))
    sub._receive("w0", _frames(1, [{"type": "BlockStored", "block_hashes": [1]}]))
    sub._receive("w0", _frames(2, [{"type": "BlockStored", "block_hashes": [2]}]))
    assert sub.gaps == {}
    sub._receive("w0", _frames(4, [{"type": "BlockRemoved", "block_hashes": [1]}]))
    assert sub.gaps == {"w0": 1}
    sub._receive("w1", _frames(9, []))  # a worker's first message is never a gap
    sub._receive("w0", [b"", b"\x00"])  # undecodable: dropped, not counted, sequence unchanged
    sub._receive("w0", _frames(5, []))
    assert sub.gaps == {"w0": 1}
    assert sub.messages == 5
    assert seen == [("w0", KvEvent("stored", (1,))), ("w0", KvEvent("stored", (2,))), ("w0", KvEvent("removed", (1,)))]


def test_subscriber_gap_from_seq_1_to_3() -> None:
    sub = KvEventSubscriber({}, lambda w, e: None)
    sub._receive("w1", _frames(1, []))
    sub._receive("w1", _frames(3, []))
    assert sub.gaps == {"w1": 1}
    assert sub.messages == 2
