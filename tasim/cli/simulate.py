"""``tasim simulate``: run one scenario in the simulator, write its event log and summary, and
print the summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from tasim.cli.common import EXIT_INVARIANT, POLICY_HELP, Commands, add_set_flag, default_out, output_dir, scenario_from_args
from tasim.results.eventlog import EVENTS_GZIP, EVENTS_PLAIN
from tasim.results.render import print_summary
from tasim.results.run_folder import SUMMARY_FILE
from tasim.sim.simulation import run_simulation


def add_parser(commands: Commands) -> None:
    simulate = commands.add_parser("simulate", help="run one scenario in the simulator")
    simulate.add_argument("scenario", help="scenario YAML file, or a preset's name (tasim scenarios lists them)")
    simulate.add_argument("--policy", metavar="SPEC", help=POLICY_HELP)
    simulate.add_argument("--seed", type=int, help="random seed (replaces the scenario's)")
    simulate.add_argument("--out", type=Path, help="output directory (default: runs/<scenario>-<policy>-s<seed>)")
    add_set_flag(simulate, "override a scenario field, e.g. --set workload.concurrency=96 (repeatable)")
    simulate.add_argument("--gzip", action="store_true", help=f"write {EVENTS_GZIP} instead of {EVENTS_PLAIN}")
    simulate.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    simulate.add_argument(
        "--check",
        action="store_true",
        help=f"check the simulator's invariants as it runs (slower); a broken one exits {EXIT_INVARIANT}",
    )
    simulate.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    scenario = scenario_from_args(args)
    out = output_dir(args.out or default_out(scenario))
    interactive = not args.quiet and sys.stderr.isatty()
    summary = run_simulation(scenario, out, gzip=args.gzip, progress=interactive, check=args.check)
    if not args.quiet:
        print_summary(summary)
        Console().print(f"wrote {out}/{SUMMARY_FILE} and the event log")
    return 0
