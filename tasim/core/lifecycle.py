"""Processes that end with the command that started them.

A command that starts processes (a pool of simulations, a Ray cluster, a live stack) must leave
none behind however it ends. Two rules do it, shared by every such command:

- `terminate_with`: a child asks the kernel for SIGTERM when its launcher dies, even by SIGKILL
  (Linux; elsewhere only the launcher's own clean-up applies);
- `exit_on_termination`: SIGTERM and SIGHUP to the launcher unwind like Ctrl-C (`SystemExit`),
  so the ``finally`` blocks that stop pools, clusters and stacks run; the default action would
  end the launcher at once and hand its children to init.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

_PR_SET_PDEATHSIG = 1
TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def terminate_with(launcher: int) -> Callable[[], None]:
    """What a child runs first (before exec, or as a pool's initializer): ask for SIGTERM when
    ``launcher`` dies."""

    def in_child() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            return
        # The request only covers a parent that dies after it; a launcher killed between fork and
        # here has already handed the child to init, which never dies: leave as if told.
        if os.getppid() != launcher:
            os._exit(128 + signal.SIGTERM)

    return in_child


def exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def exit_on_termination() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise ``SystemExit(128 + signal)`` in the main
    thread; the previous handlers come back after. Elsewhere than the main thread (where Python
    allows no handler) the block runs unchanged and its caller must stop what it started."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {sig: signal.signal(sig, exit_on_signal) for sig in TERMINATION_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
