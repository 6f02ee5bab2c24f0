"""``tasim calibrate``: fit scenario fields to some points of a published measurement file with
Optuna, and report how well the fitted scenario predicts the points held out."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from tasim.cli.common import Commands, add_set_flag, output_dir, positive_int
from tasim.config.presets import scenario_path
from tasim.config.scenario import load_scenario, set_flags
from tasim.core.errors import UsageError


def add_parser(commands: Commands) -> None:
    calibrate = commands.add_parser("calibrate", help="fit scenario fields to published measurements and report how well the fit predicts the rest")
    calibrate.add_argument("scenario", help="scenario YAML file or preset name to calibrate (the set-up the measurements ran)")
    calibrate.add_argument("--against", required=True, type=Path, metavar="MEASUREMENTS", help="measurement file (measurements/*.yaml)")
    calibrate.add_argument(
        "--fit",
        required=True,
        action="append",
        metavar="KEY=LOW:HIGH[:log],...",
        help="scenario fields to fit and their ranges, e.g. --fit cluster.perf.mfu=0.2:0.8,workload.training_s=60:900",
    )
    calibrate.add_argument("--points", required=True, metavar="ID,...", help="the points to fit to; the set-up's other points are held out")
    calibrate.add_argument("--trials", type=positive_int, default=40, help="trials of the search (default 40)")
    calibrate.add_argument(
        "--loo-trials",
        type=int,
        metavar="N",
        help="trials of each leave-one-out refit, 0 to skip them (default: --trials)",
    )
    calibrate.add_argument("--seeds", type=positive_int, default=3, help="seeds the calibrated scenario is evaluated on (default 3)")
    calibrate.add_argument("--fit-seed", type=int, default=0, help="seed of the search's sampler (default 0)")
    add_set_flag(calibrate, "override a scenario field in every run (repeatable)")
    calibrate.add_argument("--jobs", type=positive_int, help="simulations in parallel (default: CPUs)")
    calibrate.add_argument("--out", type=Path, help="directory of calibration.json (default: runs/calibrate-<scenario>)")
    calibrate.add_argument("--write", type=Path, metavar="FILE", help="the calibrated scenario (default: OUT/<scenario>-calibrated.yaml)")
    calibrate.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("optuna") is None:
        raise UsageError("calibrate needs Optuna (make install, or pip install -e '.[calibrate]')")
    from tasim.validation.calibration.procedure import Request, run_calibration
    from tasim.validation.calibration.space import parse_space
    from tasim.validation.published.against_published import command_line

    path = scenario_path(args.scenario)
    scenario = load_scenario(path, set_flags(args.overrides))  # a bad file or --set costs no trial
    knobs = parse_space(args.fit, scenario)
    out = output_dir(args.out or Path("runs") / f"calibrate-{scenario.name}")
    if args.write is not None:
        output_dir(args.write.parent, "--write")
    fitted = tuple(part.strip() for part in args.points.split(",") if part.strip())
    loo_trials = args.trials if args.loo_trials is None else args.loo_trials
    if loo_trials < 0:
        raise UsageError(f"--loo-trials: must be 0 (no leave-one-out) or more (got {loo_trials})")
    run_calibration(
        Request(
            path,
            args.against,
            knobs,
            fitted,
            tuple(args.overrides),
            args.trials,
            loo_trials,
            args.seeds,
            args.fit_seed,
            args.jobs,
            out,
            args.write,
            command_line(args.argv),
        )
    )
    return 0
