"""Compiled builds of the simulator's hottest modules, used only while they match the sources.

The engine, its KV block pool, the folded runs of steps, the perf models that time them and the
KV router's block indexes (`MODULES`) are the inner loop of every simulation. `make install`
compiles them with mypyc (the compiler that ships with mypy: the same code, type-checked,
translated to C) into ``build/native/`` of the checkout, with a manifest of the sources'
hashes. `tasim` and the packages of those modules put that folder in front of their own on
their module search paths (`search_path`) only when the manifest matches the sources as they
are now and this Python; an edited source, a build for another Python, a failed build or
``TASIM_NATIVE=0`` all mean the plain modules, so a stale build can never run. Compiled and
plain modules write byte-identical event logs (tests/test_native.py); a profile with py-spy
needs the plain ones, since it cannot see into compiled code.

    python -m tasim.native          # build (or say why not) and print the state
    python -m tasim.native --check  # print the state; exit 1 unless the build is in use
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # tasim/
BUILD = PACKAGE.parent / "build" / "native"
MANIFEST = BUILD / "manifest.json"
# Compiled together, so calls between them are native calls. Other modules stay plain: the
# runner drives simpy generators, and pydantic models (scenario, policy parameters) are not
# mypyc's to compile.
MODULES = (
    "sim/engine.py",
    "sim/kv_cache.py",
    "sim/runs.py",
    "perf/base.py",
    "perf/fixed.py",
    "perf/polynomial.py",
    "perf/roofline.py",
    "policies/prefix_index.py",
    "policies/booked_blocks.py",
)
GROUP = "tasim._native"  # the shared library of the group, found on tasim's search path
# C compilers may fuse a * b + c into one rounding (FMA) where the CPU has it; Python rounds
# each operation, and compiled and plain modules must compute the same floats.
_C_FLAGS = ["-ffp-contract=off"]
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


def build() -> str:
    """Compile `MODULES` into `BUILD` and write the manifest (also when the build fails, with
    the reason, so `make` does not retry on every run); returns `state()`."""
    sources = _sources()
    shutil.rmtree(BUILD, ignore_errors=True)
    BUILD.mkdir(parents=True)
    reason = _compile()
    record = {"built": reason is None, "python": _python(), "sources": sources}
    if reason is not None:
        record["reason"] = reason
    MANIFEST.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return state()


def _compile() -> str | None:
    """Run mypyc on `MODULES`, its output and the C compiler's in ``build.log``; None when it
    worked, else why not."""
    compiler = sysconfig.get_config_var("CC") or "cc"
    if shutil.which(compiler.split()[0]) is None:
        return f"no C compiler ({compiler})"
    try:
        from mypyc.build import mypycify
        from setuptools import Distribution  # type: ignore[import-untyped]
        from setuptools.command.build_ext import build_ext  # type: ignore[import-untyped]
    except ImportError as exc:
        return f"mypyc or setuptools missing ({exc})"
    here = Path.cwd()
    try:
        os.chdir(PACKAGE.parent)  # mypyc names modules by their paths from the project root
        with _output_to(BUILD / "build.log"):
            extensions = mypycify([f"tasim/{module}" for module in MODULES], group_name=GROUP, opt_level="3", target_dir=str(BUILD / "c"))
            for extension in extensions:  # a new list each: mypyc's extensions share theirs
                extension.extra_compile_args = [*extension.extra_compile_args, *_C_FLAGS]
            command = build_ext(Distribution({"name": "tasim-native", "ext_modules": extensions}))
            command.build_lib = str(BUILD)
            command.build_temp = str(BUILD / "objects")
            command.ensure_finalized()
            command.run()
    except (Exception, SystemExit) as exc:  # any failure means the plain modules
        return f"{type(exc).__name__}: {exc} (see {BUILD / 'build.log'})".splitlines()[0]
    finally:
        os.chdir(here)
    return None


@contextlib.contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """Send this process's stdout and stderr, the compiler's included, to ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(log, "w") as file:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasim.native", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only print the state; exit 1 unless the build is in use")
    args = parser.parse_args(argv)
    print(state() if args.check else build())
    return 0 if in_use() or not args.check else 1
