"""Fewer runs of Python's cyclic garbage collector while a simulation or a trace load builds up
objects that stay alive.

CPython starts a young-generation collection every 700 net container allocations, and each
one costs milliseconds once a simulation holds its trace, engines and programs (112 of them,
0.28 s, in the Mooncake conversation replay; 0.34 of the 0.92 s of reading its trace went to
rescanning what was just read). Almost nothing the simulator allocates is cyclic garbage, so a
higher threshold loses no memory worth having and changes no result. The caller's thresholds
come back afterwards, and a collector switched off stays off.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_THRESHOLD = 100_000


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, saved[0]), *saved[1:])
    try:
        yield
    finally:
        gc.set_threshold(*saved)
