"""``tasim compare``: run one scenario under several policies (optionally across one swept field
and several paired seeds), in a pool or on Ray, and tabulate and plot the results."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from tasim.cli.common import Commands, add_set_flag, output_dir, positive_int, seeded
from tasim.config.presets import scenario_path
from tasim.core.errors import UsageError
from tasim.results.render import print_unsquashed
from tasim.results.run_folder import write_json


def add_parser(commands: Commands) -> None:
    compare = commands.add_parser("compare", help="run one scenario under several policies (and one swept field)")
    compare.add_argument("scenario", help="scenario YAML file, or a preset's name (tasim scenarios lists them)")
    compare.add_argument(
        "--policies",
        required=True,
        metavar="SPEC,SPEC,...",
        help="comma-separated policies, each NAME or NAME[key=value,...], e.g. 'thunderagent[variant=dynamo],least_loaded'",
    )
    compare.add_argument(
        "--sweep",
        metavar="KEY=V1,V2,...",
        help="run every policy at each value of one scenario field, e.g. --sweep workload.concurrency=16,32,64",
    )
    add_set_flag(compare, "override a scenario field in every run (repeatable)")
    compare.add_argument("--seed", type=int, help="random seed (replaces the scenario's)")
    compare.add_argument(
        "--seeds",
        type=positive_int,
        default=1,
        metavar="N",
        help="run every cell at N paired seeds (the scenario's seed and the N-1 after it) and report means with 95%% intervals",
    )
    compare.add_argument(
        "--baseline", metavar="SPEC", help="with --seeds: the policy spec the others' throughput ratios are taken against (default: the first)"
    )
    compare.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run on Ray: 'local' (a private cluster on this machine, --jobs CPUs), 'auto' or HOST:PORT (a running cluster)",
    )
    compare.add_argument("--out", type=Path, help="output directory (default: runs/compare-<scenario>)")
    compare.add_argument("--jobs", type=positive_int, help="runs in parallel (default: CPUs, at most the number of runs)")
    compare.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tasim.tools import comparison  # keeps `simulate` and `report` free of the pool and plotting code

    specs = comparison.parse_policies(args.policies)
    sweep = comparison.parse_sweep(args.sweep) if args.sweep else None
    comparison.check_overrides(args.overrides, sweep, args.seed)
    if args.baseline is not None and args.seeds == 1:
        raise UsageError(f"--baseline {args.baseline}: ratios with intervals need --seeds N (N > 1)")
    plan = comparison.plan_runs(str(scenario_path(args.scenario)), specs, sweep, seeded(args), args.seeds, args.baseline)
    out = output_dir(args.out or Path("runs") / f"compare-{plan.scenario.name}")
    jobs = min(args.jobs or comparison.default_jobs(plan), len(plan.runs))
    progress = Console(stderr=True)
    done = iter(range(1, len(plan.runs) + 1))

    def on_done(run: comparison.Run, summary: dict[str, Any]) -> None:
        line = f"[{next(done)}/{len(plan.runs)}] {run.label}: {summary['calls_per_min']:.1f} calls/min"
        progress.print(line, markup=False, highlight=False, soft_wrap=True)  # one line each, however long the label

    from tasim.tools.parallel import BackendUnavailable, LocalPool, RayTasks

    backend = LocalPool(jobs) if args.ray is None else RayTasks(args.ray, args.jobs)
    try:
        summaries = comparison.execute(plan, out, backend, on_done)
    except BackendUnavailable as error:
        raise UsageError(str(error)) from None
    out.mkdir(parents=True, exist_ok=True)
    if plan.multi_seed:
        write_json(out / comparison.COMPARE_FILE, comparison.seeded_records(plan, summaries))
        print_unsquashed(comparison.interval_table(plan, summaries))
    else:
        write_json(out / comparison.COMPARE_FILE, comparison.records(plan, summaries))
        print_unsquashed(comparison.comparison_table(plan, summaries))
    from tasim.tools.plots import write_plots

    plots = ", ".join(path.name for path in write_plots(plan, summaries, out, out / comparison.RUNS_DIR))
    runs = f"{len(plan.runs)} run{'s' if len(plan.runs) > 1 else ''}"
    line = f"wrote {out}/{comparison.COMPARE_FILE}, {plots} and {runs} under {out}/{comparison.RUNS_DIR}"
    Console().print(line, markup=False, highlight=False)
    return 0
