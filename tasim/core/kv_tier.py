"""Where a worker holds a KV block: its GPU pool (``device``) or a tier behind it (``host``,
``disk``). KV events carry it, as Dynamo's ``RouterEvent.storage_tier`` does, so a router can
credit a block by the tier it sits in.

Workers name the tier in their events' ``medium`` (vLLM's ``BlockStored.medium``: ``GPU`` /
``CPU``; Dynamo's mocker: ``CPU_PINNED`` over ZMQ, ``host_pinned`` in its replay).
`tier_from_medium` maps it as Dynamo 1.6.1's ``StorageTier::from_kv_medium_or_default`` does
(lib/kv-router/src/protocols.rs): ``GPU|DEVICE`` → device, ``CPU|CPU_PINNED|CPU_TIER1`` →
host, ``CPU_TIER2|DISK|NVME`` → disk, anything else or none → device. Dynamo's own serialised
names (``device``, ``host_pinned``, ``disk``) map to themselves. Dynamo's fourth tier,
``External`` (``EXTERNAL|NETWORK|REMOTE|SHARED``), is credited with the disk weight there; tasim
has no such tier and files it under disk.
"""

from __future__ import annotations

from typing import Final, Literal

KvTier = Literal["device", "host", "disk"]

_TIER_OF_MEDIUM: Final[dict[str, KvTier]] = {
    "GPU": "device",
    "DEVICE": "device",
    "device": "device",
    "CPU": "host",
    "CPU_PINNED": "host",
    "CPU_TIER1": "host",
    "host_pinned": "host",
    "CPU_TIER2": "disk",
    "DISK": "disk",
    "NVME": "disk",
    "disk": "disk",
    "EXTERNAL": "disk",
    "NETWORK": "disk",
    "REMOTE": "disk",
    "SHARED": "disk",
    "external": "disk",
}


def tier_from_medium(medium: object) -> KvTier:
    """The tier of a block a worker reports with this ``medium``: device when missing or unknown."""
    return _TIER_OF_MEDIUM.get(medium, "device") if isinstance(medium, str) else "device"
