"""``tasim validate dynamo|vllm|published``: hold tasim against Dynamo's own replay, against
vLLM's own scheduler, or against published measurements, and tabulate the differences."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from tasim import __version__
from tasim.cli.common import Commands, Parser, add_set_flag, output_dir, positive_float, positive_int, scenario_from_args, seeded
from tasim.config.presets import scenario_path
from tasim.config.scenario import Override, load_scenario, shown
from tasim.core.errors import UsageError
from tasim.results.render import print_unsquashed
from tasim.results.run_folder import write_json


def add_parser(commands: Commands) -> None:
    validate = commands.add_parser("validate", help="cross-validate tasim against another simulator or published measurements")
    against = validate.add_subparsers(dest="against", required=True, parser_class=Parser)
    dynamo = against.add_parser("dynamo", help="replay the scenario's workload through Dynamo's own replay and through tasim, side by side")
    dynamo.add_argument("scenario", help="scenario YAML file or preset name (workload kind mooncake_trace or agent)")
    dynamo.add_argument(
        "--routers",
        default="round_robin,kv_router",
        metavar="A,B",
        help="routers to compare, from round_robin and kv_router (default: both)",
    )
    add_set_flag(dynamo, "override a scenario field (repeatable)")
    dynamo.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="runs of each side for kv_router, whose random tie-breaks make Dynamo's results vary; means are compared (default 3)",
    )
    dynamo.add_argument("--seed", type=int, help="random seed (replaces the scenario's)")
    dynamo.add_argument("--out", type=Path, help="output directory (default: runs/validate-<scenario>)")
    dynamo.set_defaults(run=run_dynamo)

    vllm = against.add_parser("vllm", help="run the scenario on tasim's engine and on vLLM's own scheduler, and compare request by request")
    vllm.add_argument("scenario", help="scenario YAML file or preset name (any workload; any policy but continuum)")
    vllm.add_argument(
        "--step-ms",
        type=positive_float,
        default=10.0,
        help="the fixed time of every engine step on both sides (default 10)",
    )
    add_set_flag(vllm, "override a scenario field (repeatable)")
    vllm.add_argument("--policy", help="policy name (replaces the scenario's policy and its params)")
    vllm.add_argument("--seed", type=int, help="random seed (replaces the scenario's)")
    vllm.add_argument("--out", type=Path, help="output directory (default: runs/validate-vllm-<scenario>)")
    vllm.set_defaults(run=run_vllm)

    published = against.add_parser("published", help="hold the presets against published measurements (measurements/*.yaml), point by point")
    published.add_argument("files", nargs="+", type=Path, metavar="FILE", help="measurement files (measurements/*.yaml)")
    add_set_flag(published, "override a scenario field in every run (repeatable); the points' own overrides and policies stay theirs")
    published.add_argument(
        "--system",
        dest="systems",
        action="append",
        default=[],
        metavar="NAME=POLICY",
        help="run a source's system as another policy spec, e.g. --system 'ThunderAgent=thunderagent[variant=upstream]'",
    )
    published.add_argument("--jobs", type=positive_int, help="runs in parallel (default: CPUs, at most the number of runs)")
    published.add_argument("--out", type=Path, default=Path("runs/published"), help="directory of published.json (default: runs/published)")
    published.add_argument("--doc", type=Path, help="rewrite the published-measurements span of this document (docs/results/validation.md)")
    published.add_argument(
        "--plots", type=Path, default=Path("docs/results/published"), help="PNG directory for --doc (default: docs/results/published)"
    )
    published.add_argument(
        "--before",
        action="append",
        default=[],
        type=Path,
        metavar="JSON",
        help="an earlier published.json, shown as a column of earlier tasim values (repeatable)",
    )
    published.add_argument("--label", default=f"tasim {__version__}", help="names this run's record when it is later a --before")
    published.add_argument(
        "--from-record",
        type=Path,
        metavar="JSON",
        help="take tasim's values from this published.json instead of simulating (renders tables and --doc again)",
    )
    published.set_defaults(run=run_published)


def run_dynamo(args: argparse.Namespace) -> int:
    from tasim.validation.against_dynamo import VALIDATION_FILE, validate, validation_record, validation_table
    from tasim.validation.dynamo_replay import ROUTERS
    from tasim.validation.tasim_replay import lost_in_replay

    routers = [name.strip() for name in args.routers.split(",") if name.strip()]
    unknown = [name for name in routers if name not in ROUTERS]
    if not routers or unknown:
        raise UsageError(f"--routers {args.routers!r}: unknown router (allowed: {', '.join(ROUTERS)})")
    for assignment in args.overrides:
        problem = lost_in_replay(Override.parse(assignment))
        if problem:
            raise UsageError(f"--set {shown(assignment)}: {problem}")
    scenario = load_scenario(scenario_path(args.scenario), seeded(args))
    out = output_dir(args.out or Path("runs") / f"validate-{scenario.name}")
    trace, results = validate(scenario, out, list(dict.fromkeys(routers)), args.repeats)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / VALIDATION_FILE, validation_record(scenario, trace, results))
    print_unsquashed(validation_table(results))
    if trace.excluded:
        print(f"left out {trace.excluded} requests whose prompt + output need more KV blocks than a worker has")
    Console().print(f"wrote {out}/{VALIDATION_FILE}", markup=False, highlight=False)
    return 0


def run_vllm(args: argparse.Namespace) -> int:
    from tasim.validation.against_vllm import (
        VALIDATION_FILE,
        decision_table,
        lost_in_oracle,
        mismatch_table,
        summary_table,
        validate,
        validation_record,
    )

    for assignment in args.overrides:
        problem = lost_in_oracle(Override.parse(assignment))
        if problem:
            raise UsageError(f"--set {shown(assignment)}: {problem}")
    scenario = scenario_from_args(args)

    out = output_dir(args.out or Path("runs") / f"validate-vllm-{scenario.name}")
    result = validate(scenario, out, args.step_ms)
    write_json(out / VALIDATION_FILE, validation_record(scenario, args.step_ms, result))
    print_unsquashed(decision_table(result))
    mismatches = mismatch_table(result)
    if mismatches is not None:
        print_unsquashed(mismatches)
    print_unsquashed(summary_table(result))
    Console().print(f"wrote {out}/{VALIDATION_FILE} and both event logs under {out}/", markup=False, highlight=False)
    return 0


def run_published(args: argparse.Namespace) -> int:
    from tasim.validation.published.against_published import Request, command_line, parse_system, validate_published

    systems = dict(parse_system(text) for text in args.systems)
    if len(systems) != len(args.systems):
        raise UsageError("--system: a system is remapped twice")
    out = output_dir(args.out)
    validate_published(
        Request(
            tuple(args.files),
            tuple(args.overrides),
            systems,
            args.jobs,
            out,
            args.doc,
            args.plots,
            tuple(args.before),
            args.label,
            args.from_record,
            command_line(args.argv),
        )
    )
    return 0
