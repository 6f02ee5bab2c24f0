"""``tasim report``: recompute a run's summary from its event log and print it as a table or JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tasim.cli.common import Commands
from tasim.results.render import print_summary
from tasim.results.run_folder import report_summary


def add_parser(commands: Commands) -> None:
    report = commands.add_parser("report", help="recompute a run's summary from its event log")
    report.add_argument("run_dir", type=Path, help="directory written by simulate (or live)")
    report.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    report.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    summary = report_summary(args.run_dir)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    return 0
