"""``tasim scenarios``: list the preset scenarios (or the scenario files of a folder), each with its
workload kind and description, and the files that do not load."""

from __future__ import annotations

import argparse
from pathlib import Path

from tasim.cli.common import Commands
from tasim.core.errors import UsageError


def add_parser(commands: Commands) -> None:
    scenarios = commands.add_parser("scenarios", help="list the preset scenarios")
    scenarios.add_argument("--dir", type=Path, help="directory of scenario files (default: the presets)")
    scenarios.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tasim.config.presets import PRESET_DIR, presets

    directory = args.dir or PRESET_DIR
    if not directory.is_dir():
        raise UsageError(f"--dir {directory}: not a directory")
    found = presets(directory)
    if not found:
        raise UsageError(f"{directory}: no *.yaml scenario files")
    for preset in found:
        if isinstance(preset, Exception):
            print(f"INVALID  {preset}")
        else:
            print(f"{preset.path.name:<28} {preset.kind:<15} {preset.description}")
    return 0
