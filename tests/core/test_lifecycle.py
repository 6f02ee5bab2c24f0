"""`tasim.core.lifecycle` without a command under signals: the stack's children die with the launcher."""

from __future__ import annotations

import pytest


def test_a_child_whose_launcher_died_before_it_asked_to_die_with_it_leaves_before_exec() -> None:
    """PR_SET_PDEATHSIG only covers a parent that dies after the request: a child that finds
    another parent (init took it over) exits as if told, rather than running unsupervised."""
    import os
    import subprocess
    import sys

    from tasim.core.lifecycle import terminate_with

    if not sys.platform.startswith("linux"):
        pytest.skip("parent-death signals are Linux's")
    ours = subprocess.Popen(["true"], preexec_fn=terminate_with(os.getpid()))
    orphaned = subprocess.Popen(["sleep", "30"], preexec_fn=terminate_with(os.getpid() + 1_000_000))
    assert ours.wait(10) == 0 and orphaned.wait(10) == 143
