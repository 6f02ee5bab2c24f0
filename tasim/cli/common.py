"""What the command modules share: the parser class that turns argparse's errors into UsageError,
flag types, the scenario as the flags shape it, output folders, and the exit codes."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn, TypeAlias

from tasim.config.policy_spec import PolicySpec, PolicySpecError
from tasim.config.presets import scenario_path
from tasim.config.scenario import Override, Scenario, load_scenario, set_flags, shown
from tasim.core.errors import UsageError

EXIT_USAGE = 2
EXIT_INVARIANT = 3  # `simulate --check` found a bug in tasim itself


POLICY_HELP = "policy NAME or NAME[key=value,...] (replaces the scenario's policy and its params; --set policy.params.KEY=VALUE applies on top)"


class Parser(argparse.ArgumentParser):
    """Raises UsageError rather than exiting, so main prints every user error the same way."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


# What a command module's add_parser is handed: the subparsers action of the `tasim` parser.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_set_flag(parser: argparse.ArgumentParser, help: str) -> None:
    """``--set KEY=VALUE`` (repeatable), which every command that loads a scenario takes into
    ``args.overrides``."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number (got {text})")
    return value


def refuse_replacing(overrides: Sequence[str], flag: str, sets: Override) -> None:
    """A --set that would replace what ``flag`` sets is refused: one of the two would be lost."""
    for assignment in overrides:
        if Override.parse(assignment).overwrites(sets):
            raise UsageError(f"--set {shown(assignment)}: {flag} sets {'.'.join(sets.key)} too (give one of them)")


def seeded(args: argparse.Namespace) -> list[Override]:
    """The --set overrides, then --seed's, each blamed on its flag."""
    if args.seed is None:
        return set_flags(args.overrides)
    refuse_replacing(args.overrides, f"--seed {args.seed}", Override(("seed",), args.seed))
    return [*set_flags(args.overrides), Override(("seed",), args.seed, f"--seed {args.seed}")]


def policy_overrides(args: argparse.Namespace) -> list[Override]:
    """--policy's overrides, refusing a --set that would undo part of it or be undone by it."""
    if args.policy is None:
        return []
    try:
        spec = PolicySpec.parse(args.policy)
    except PolicySpecError as exc:
        raise UsageError(f"--policy {exc}") from None
    for assignment in args.overrides:
        problem = spec.conflict(Override.parse(assignment), f"--policy {shown(spec.label)}")
        if problem:
            raise UsageError(f"--set {shown(assignment)}: {problem}")
    return [Override.parse(override, f"--policy {shown(spec.label)}") for override in spec.overrides()]


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    # --policy's first, so a --set policy.params.KEY=VALUE lands on top of the params it clears
    return load_scenario(scenario_path(args.scenario), [*policy_overrides(args), *seeded(args)])


def default_out(scenario: Scenario) -> Path:
    return Path("runs") / f"{scenario.name}-{scenario.policy.name}-s{scenario.seed}"


def output_dir(out: Path, flag: str = "--out") -> Path:
    """``out``, made now and written to once: a folder that cannot be written fails here, in one
    line, rather than after the runs (or in a pool worker, mid-run)."""
    for path in (out, *out.parents):
        if path.exists() and not path.is_dir():
            raise UsageError(f"{flag} {out}: {path} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as exc:
        raise UsageError(f"{flag} {out}: cannot write there ({exc.strerror or exc})") from None
    return out
