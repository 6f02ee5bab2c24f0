"""The native build: mypyc compiles `tasim.native.MODULES` into `tasim.native.BUILD` and the
manifest records what it was built from (`python -m tasim.native` runs `main`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path

from tasim.native import BUILD, MANIFEST, MODULES, PACKAGE, _python, _sources, in_use, state

GROUP = "tasim._native"  # the shared library of the group, found on tasim's search path
# C compilers may fuse a * b + c into one rounding (FMA) where the CPU has it; Python rounds
# each operation, and compiled and plain modules must compute the same floats.
_C_FLAGS = ["-ffp-contract=off"]


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
    parser = argparse.ArgumentParser(prog="python -m tasim.native", description="Build the compiled simulator core, or print why it is not in use.")
    parser.add_argument("--check", action="store_true", help="only print the state; exit 1 unless the build is in use")
    args = parser.parse_args(argv)
    print(state() if args.check else build())
    return 0 if in_use() or not args.check else 1
