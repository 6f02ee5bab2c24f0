"""``tasim tune``: search a policy's knobs (and scenario fields) with Optuna for the best value of
one summary metric under constraints, and write the tuned scenario."""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

from rich.console import Console

from tasim.cli.common import Commands, add_set_flag, output_dir, positive_int, seeded
from tasim.config.policy_spec import file_safe
from tasim.config.presets import scenario_path
from tasim.config.scenario import Override, load_scenario, shown
from tasim.core.errors import UsageError
from tasim.results.run_folder import write_json


def add_parser(commands: Commands) -> None:
    tune = commands.add_parser("tune", help="search a policy's knobs (and scenario fields) for the best value of one summary metric")
    tune.add_argument("scenario", help="scenario YAML file, or a preset's name")
    tune.add_argument("--policy", required=True, help="the policy whose configuration is searched")
    tune.add_argument(
        "--space",
        required=True,
        action="append",
        metavar="KEY=LOW:HIGH[:log]|KEY=A|B|C",
        help="fields to search (repeatable, or comma-separated), e.g. --space policy.params.pause_threshold=0.7:0.99",
    )
    tune.add_argument(
        "--objective", required=True, metavar="METRIC[:max|min]", help="summary metric to optimise, e.g. calls_per_min:max (default max)"
    )
    tune.add_argument("--constraint", action="append", default=[], metavar="METRIC<=X", help="a summary metric's mean must satisfy this (repeatable)")
    tune.add_argument("--trials", type=positive_int, default=40, help="trials the study holds when done (a rerun resumes up to it; default 40)")
    tune.add_argument("--seeds", type=positive_int, default=3, help="paired seeds each configuration runs at (default 3)")
    tune.add_argument("--sampler-seed", type=int, default=0, help="seed of the TPE sampler (default 0)")
    tune.add_argument("--storage", metavar="URL", help="Optuna storage URL (default: sqlite:///OUT/study.db)")
    add_set_flag(tune, "override a scenario field in every run")
    tune.add_argument("--seed", type=int, help="first seed (replaces the scenario's)")
    tune.add_argument("--jobs", type=positive_int, help="simulations in parallel (default: CPUs)")
    tune.add_argument("--ray", metavar="ADDRESS", help="run on Ray: local, auto or HOST:PORT (see compare)")
    tune.add_argument("--out", type=Path, help="output directory (default: runs/tune-<scenario>-<policy>)")
    tune.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("optuna") is None:
        raise UsageError("tune needs Optuna (make install, or pip install -e '.[calibrate]')")
    from tasim.tools import tuning
    from tasim.tools.parallel import BackendUnavailable, LocalPool, RayTasks

    path = str(scenario_path(args.scenario))
    # a bad file, --set or --policy costs no trial (the policy as tuning.check sets it)
    scenario = load_scenario(path, [*seeded(args), Override.parse(f"policy.name={args.policy}", f"--policy {shown(args.policy)}")])
    out = output_dir(args.out or Path("runs") / f"tune-{scenario.name}-{file_safe(args.policy)}")
    request = tuning.Request(
        path,
        args.policy,
        tuning.parse_space(args.space),
        tuning.parse_objective(args.objective),
        tuple(tuning.parse_constraint(c) for c in args.constraint),
        args.trials,
        tuple(range(scenario.seed, scenario.seed + args.seeds)),
        tuple(args.overrides),
        args.sampler_seed,
        args.storage or f"sqlite:///{(out / 'study.db').resolve()}",
        out,
    )
    request = tuning.check(request)
    jobs = args.jobs or os.cpu_count() or 1
    backend = LocalPool(jobs) if args.ray is None else RayTasks(args.ray, args.jobs)
    console = Console(stderr=True)
    done = [0]

    def progress() -> None:
        done[0] += 1
        if done[0] % max(1, args.seeds) == 0:
            console.print(f"tune: {done[0] // max(1, args.seeds)} configurations evaluated", markup=False, highlight=False)

    try:
        backend.check()
        study = tuning.run_study(request, backend, -(-jobs // args.seeds), progress)  # trials at once: enough runs for every job
    except BackendUnavailable as error:
        raise UsageError(str(error)) from None
    report = tuning.report(request, study)
    target = out / f"{scenario.name}-tuned.yaml"
    target.write_text(tuning.tuned_yaml(report, scenario.name, target))
    write_json(out / tuning.TUNE_FILE, tuning.record(report))
    for line in report.lines():
        Console().print(line, markup=False, highlight=False)
    Console().print(f"wrote {out / tuning.TUNE_FILE} and {target}; study {study.study_name} in {request.storage}", markup=False, highlight=False)
    return 0
