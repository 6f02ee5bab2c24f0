"""Compiled builds of the simulator's hottest modules, used only while they match the sources.

The policy host and the simulation around it, the clock, the engine, its KV cache manager and
block pool, the folded runs of steps, the perf models that time them and the KV router's block
indexes and cost (`MODULES`) are the inner loop of every simulation. `make install` compiles them with mypyc (the
compiler that ships with mypy: the same code, type-checked, translated to C) into
``build/native/`` of the checkout, with a manifest of the sources' hashes. `tasim` and the
packages of those modules put that folder in front of their own on their module search paths
(`search_path`) only when the manifest matches the sources as they are now and this Python; an
edited source, a build for another Python, a failed build or ``TASIM_NATIVE=0`` all mean the
plain modules, so a stale build can never run. Compiled and plain modules write byte-identical
event logs (tests/native/test_native.py); a profile with py-spy needs the plain ones, since it cannot
see into compiled code.

    python -m tasim.native          # build (or say why not) and print the state
    python -m tasim.native --check  # print the state; exit 1 unless the build is in use

This module is imported by every ``import tasim``, so it holds only the rules; the build is
`tasim.native.build`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # tasim/
BUILD = PACKAGE.parent / "build" / "native"
MANIFEST = BUILD / "manifest.json"
# Compiled together, so calls between them are native calls. Other modules stay plain: pydantic
# models (scenario, policy parameters) are not mypyc's to compile, and the policies hold them.
MODULES = (
    "hosting/policy_host.py",
    "sim/runner.py",
    "sim/clock.py",
    "sim/engine/scheduler.py",
    "sim/engine/kv_manager.py",
    "sim/engine/host_tier.py",
    "sim/engine/keyed_host_pool.py",
    "sim/engine/hicache.py",
    "sim/engine/mocker_host_tier.py",
    "sim/engine/block_pool.py",
    "sim/engine/fast_forward.py",
    "sim/perf/perf_model.py",
    "sim/perf/fixed.py",
    "sim/perf/polynomial.py",
    "sim/perf/roofline.py",
    "policies/prefix_index.py",
    "policies/booked_blocks.py",
    "policies/worker_cost.py",
)
DISABLE = "TASIM_NATIVE"  # set to 0 to run the plain modules


def _sources() -> dict[str, str]:
    return {module: hashlib.sha256((PACKAGE / module).read_bytes()).hexdigest() for module in MODULES}


def _python() -> str:
    return f"{sys.implementation.cache_tag} {sysconfig.get_config_var('EXT_SUFFIX')}"


def state() -> str:
    """Why the compiled modules are or are not in use, in one line."""
    if os.environ.get(DISABLE, "1") == "0":
        return f"plain modules ({DISABLE}=0)"
    try:
        manifest = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return "plain modules (no native build: `python -m tasim.native` makes one)"
    if not manifest.get("built"):
        return f"plain modules (the native build failed: {manifest.get('reason', 'unknown')})"
    if manifest.get("python") != _python():
        return f"plain modules (the native build is for {manifest.get('python')}, this is {_python()})"
    if manifest.get("sources") != _sources():
        return "plain modules (the sources changed since the native build: `python -m tasim.native` rebuilds it)"
    return f"compiled modules ({', '.join(MODULES)}) from {BUILD}"


def in_use() -> bool:
    return state().startswith("compiled")


def search_path(package: str, package_path: Sequence[str]) -> list[str]:
    """The module search path of ``package`` (``tasim`` or a subpackage holding `MODULES`):
    the native build's folder first, when it is in use."""
    if not in_use():
        return list(package_path)
    return [str(BUILD.joinpath(*package.split("."))), *package_path]
