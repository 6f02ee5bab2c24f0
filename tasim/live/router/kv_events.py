"""Workers' KV events in vLLM's native ZMQ wire format (what ``dynamo.mocker
--zmq-kv-events-ports`` and vLLM's ``--kv-events-config`` publish).

A message is three frames: a topic, an 8-byte big-endian sequence number and a msgpack payload
``[timestamp, [event, ...], dp_rank]``. An event is ``BlockStored`` (sequence hashes of newly
cached blocks, their parent, their token ids), ``BlockRemoved`` (evicted hashes) or
``AllBlocksCleared``; the mocker encodes each as a map with a ``type`` key, vLLM as an array
with the tag first. Only *new* stores are published, so a worker's stored-minus-removed set in a
tier is exactly what it holds there. A stored or removed event names its tier in ``medium``
(vLLM: ``GPU`` or ``CPU`` for its CPU offloading; the mocker: ``CPU_PINNED`` for its host tier;
missing: the GPU), mapped as Dynamo maps it (`tasim.core.kv_tier.tier_from_medium`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from tasim.core.kv_tier import KvTier, tier_from_medium
from tasim.core.model import BlockHash

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KvEvent:
    """One event: ``kind`` is ``stored``, ``removed`` or ``cleared``; ``tier`` where the blocks are."""

    kind: str
    blocks: tuple[BlockHash, ...] = ()
    token_ids: tuple[int, ...] = ()
    tier: KvTier = "device"


_KINDS = {"BlockStored": "stored", "BlockRemoved": "removed", "AllBlocksCleared": "cleared"}
# vLLM's array form (msgspec array_like, tag first): the field ``medium`` sits at this index
# (vllm/distributed/kv_events.py: BlockStored's block_hashes, parent_block_hash, token_ids,
# block_size, lora_id, medium; BlockRemoved's block_hashes, medium)
_MEDIUM_AT = {"BlockStored": 6, "BlockRemoved": 2}


def _event(raw: Any) -> KvEvent | None:
    if isinstance(raw, Mapping):
        tag = raw.get("type")
        hashes = raw.get("block_hashes") or ()
        tokens = raw.get("token_ids") or ()
        medium = raw.get("medium")
    elif isinstance(raw, (list, tuple)) and raw:
        tag = raw[0]
        hashes = raw[1] if len(raw) > 1 and tag != "AllBlocksCleared" else ()
        tokens = raw[3] if tag == "BlockStored" and len(raw) > 3 else ()
        at = _MEDIUM_AT.get(tag, len(raw)) if isinstance(tag, str) else len(raw)
        medium = raw[at] if at < len(raw) else None
    else:
        return None
    kind = _KINDS.get(tag) if tag is not None else None
    if kind is None:
        return None
    return KvEvent(kind, tuple(int(h) for h in hashes), tuple(tokens), tier_from_medium(medium))


def decode_message(frames: Sequence[bytes]) -> tuple[int, list[KvEvent]]:
    """(sequence number, events) of one published message; ValueError if it is not one."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise ValueError(f"expected 3 frames with an 8-byte sequence number, got {[len(f) for f in frames]}")
    seq = int.from_bytes(frames[1], "big")
    payload = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
    if not isinstance(payload, (list, tuple)) or len(payload) < 2 or not isinstance(payload[1], (list, tuple)):
        raise ValueError("payload is not [timestamp, events, dp_rank]")
    return seq, [e for e in map(_event, payload[1]) if e is not None]


Handler = Callable[[str, KvEvent], None]


@dataclass
class KvEventSubscriber:
    """Subscribes to each worker's publisher and calls ``handler(worker, event)`` in order.

    A gap in a worker's sequence numbers means events were lost (ZMQ drops on overflow); it is
    counted and logged, since an index that missed a removal over-reports overlap until the
    block is stored again."""

    endpoints: Mapping[str, str]
    handler: Handler
    gaps: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    _last_seq: dict[str, int] = field(default_factory=dict)

    async def run(self, ready: asyncio.Event | None = None) -> None:
        context = zmq.asyncio.Context.instance()
        poller = zmq.asyncio.Poller()
        sockets: dict[zmq.asyncio.Socket, str] = {}
        try:
            for worker, endpoint in self.endpoints.items():
                sock = context.socket(zmq.SUB)
                sock.setsockopt(zmq.RCVHWM, 0)  # never drop on our side
                sock.setsockopt(zmq.SUBSCRIBE, b"")
                sock.connect(endpoint)
                sockets[sock] = worker
                poller.register(sock, zmq.POLLIN)
            if ready is not None:
                ready.set()
            while True:
                for sock, _ in await poller.poll():
                    self._receive(sockets[sock], await sock.recv_multipart())
        finally:
            for sock in sockets:
                sock.close(linger=0)

    def forget(self, worker: str) -> None:
        """``worker`` was lost: a restarted one numbers its messages from the start again."""
        self._last_seq.pop(worker, None)

    def _receive(self, worker: str, frames: list[bytes]) -> None:
        try:
            seq, events = decode_message(frames)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
            logger.warning("undecodable KV event message from %s: %s", worker, exc)
            return
        last = self._last_seq.get(worker)
        if last is not None and seq != last + 1:
            self.gaps[worker] = self.gaps.get(worker, 0) + 1
            logger.warning("KV events from %s skipped from sequence %d to %d", worker, last, seq)
        self._last_seq[worker] = seq
        self.messages += 1
        for event in events:
            self.handler(worker, event)
