"""Command line: ``python -m tasim simulate|compare|report|validate|live|policies|scenarios|schema``.

The parser is assembled from the command modules of this package, in the order of COMMANDS (the
order ``tasim --help`` lists them): each module's ``add_parser`` adds its subcommand and its
flags and sets the subcommand's ``run`` default to the handler main calls. Building the parser
imports every command module, so a module's heavy imports (the pool, plotting, Optuna, Dynamo,
verl) stay inside its handler, and ``simulate`` and ``report`` never load them.

Every user error (bad scenario, bad flag, unreadable log) prints one line and exits 2; results
already on disk are only replaced once a run has completed.
"""

from __future__ import annotations

import sys
from argparse import ArgumentParser, Namespace
from collections.abc import Callable, Sequence

from tasim import __version__
from tasim.cli import calibrate, compare, live, policies, report, scenarios, schema, simulate, tune, validate
from tasim.cli.common import EXIT_INVARIANT, EXIT_USAGE, Parser
from tasim.config.scenario import ScenarioError
from tasim.core.errors import LiveError, UsageError
from tasim.core.lifecycle import exit_on_termination
from tasim.results.eventlog import EventLogError
from tasim.sim.checks import InvariantViolation
from tasim.sim.drivers import WorkloadError
from tasim.validation import ValidationUnavailable
from tasim.validation.calibration import CalibrationError
from tasim.validation.published.measurement_file import MeasurementError
from tasim.workloads.trace_formats import TraceError

__all__ = ["main"]

COMMANDS = (simulate, report, compare, validate, live, calibrate, tune, policies, scenarios, schema)


def _build_parser() -> ArgumentParser:
    parser = Parser(prog="tasim", description="Program-aware LLM routing: simulate, compare, serve.")
    parser.add_argument("--version", action="version", version=f"tasim {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # as the user typed it, for generated text
        handler: Callable[[Namespace], int] = args.run
        with exit_on_termination():  # SIGTERM unwinds, so pools, clusters and stacks are stopped
            return handler(args)
    except (UsageError, ScenarioError, MeasurementError, CalibrationError, EventLogError, TraceError, ValidationUnavailable, LiveError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except WorkloadError as exc:  # raised mid-run, by code that does not know the scenario's file
        print(f"error: {args.scenario}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        if exc.filename is None:  # not the file system's: a bug, shown whole
            raise
        print(f"error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except InvariantViolation as exc:
        print(f"invariant violated (a bug in tasim; the log so far is kept as .partial): {exc}", file=sys.stderr)
        return EXIT_INVARIANT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
