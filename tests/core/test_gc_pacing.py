"""tasim.core.gc_pacing: fewer young collections inside, the caller's settings back afterwards."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tasim.core.gc_pacing import YOUNG_THRESHOLD, fewer_collections


@pytest.fixture(autouse=True)
def _restore_collector() -> Iterator[None]:
    saved, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*saved)
    (gc.enable if enabled else gc.disable)()


def test_raises_the_young_threshold_and_restores_the_callers() -> None:
    gc.set_threshold(700, 11, 12)
    with fewer_collections():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 11, 12)
        with fewer_collections():  # nested: the outer setting comes back
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 11, 12)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 11, 12)
    assert gc.get_threshold() == (700, 11, 12)


def test_keeps_a_higher_threshold_and_a_disabled_collector() -> None:
    gc.set_threshold(2 * YOUNG_THRESHOLD, 10, 10)
    gc.disable()
    with fewer_collections():
        assert gc.get_threshold() == (2 * YOUNG_THRESHOLD, 10, 10)
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_restores_the_threshold_when_the_body_raises() -> None:
    gc.set_threshold(700, 10, 10)
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("boom")
    assert gc.get_threshold() == (700, 10, 10)
