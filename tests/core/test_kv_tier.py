"""`tasim.core.kv_tier`: a worker's ``medium`` to a tier, as Dynamo 1.6.1's ``StorageTier::from_kv_medium_or_default``."""

from __future__ import annotations

import pytest

from tasim.core.kv_tier import tier_from_medium


@pytest.mark.parametrize(
    ("medium", "tier"),
    [
        ("GPU", "device"),
        ("DEVICE", "device"),
        ("device", "device"),
        ("CPU", "host"),
        ("CPU_PINNED", "host"),
        ("CPU_TIER1", "host"),
        ("host_pinned", "host"),
        ("CPU_TIER2", "disk"),
        ("DISK", "disk"),
        ("NVME", "disk"),
        ("disk", "disk"),
        ("EXTERNAL", "disk"),  # Dynamo's External tier, credited at the disk weight there
        (None, "device"),
        ("cpu", "device"),  # Dynamo matches the exact spelling; anything else is the GPU
        ("STORAGE", "device"),
        (3, "device"),
    ],
)
def test_tier_from_medium(medium: object, tier: str) -> None:
    assert tier_from_medium(medium) == tier
