"""Command line: ``python -m tasim simulate|compare|report|validate|live|policies|scenarios|schema``.

Every user error (bad scenario, bad flag, unreadable log) prints one line and exits 2; results
already on disk are only replaced once a run has completed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from tasim import __version__
from tasim.calibration import CalibrationError
from tasim.errors import UsageError
from tasim.eventlog import EVENTS_GZIP, EVENTS_PLAIN, EventLogError
from tasim.lifecycle import exit_on_termination
from tasim.live.errors import LiveError  # no Dynamo import: the core install has it
from tasim.measurements.schema import MeasurementError
from tasim.policy_spec import PolicySpec, PolicySpecError, file_safe
from tasim.presets import scenario_path
from tasim.render import param_rows, print_summary, print_unsquashed, side_by_side
from tasim.rundir import SUMMARY_FILE, report_summary, run_simulation, write_json
from tasim.scenario import Override, Scenario, ScenarioError, load_scenario, set_flags, shown
from tasim.sim.checks import InvariantViolation
from tasim.sim.drivers import WorkloadError
from tasim.traces import TraceError
from tasim.validation import ValidationUnavailable

EXIT_USAGE = 2
EXIT_INVARIANT = 3  # `simulate --check` found a bug in tasim itself


POLICY_HELP = "policy NAME or NAME[key=value,...] (replaces the scenario's policy and its params; --set policy.params.KEY=VALUE applies on top)"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tasim", description="Program-aware LLM routing: simulate, compare, serve.")
    parser.add_argument("--version", action="version", version=f"tasim {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    simulate = commands.add_parser("simulate", help="run one scenario in the simulator")
    simulate.add_argument("scenario", help="scenario YAML file, or a preset's name (tasim scenarios lists them)")
    simulate.add_argument("--policy", metavar="SPEC", help=POLICY_HELP)
    simulate.add_argument("--seed", type=int, help="random seed (replaces the scenario's)")
    simulate.add_argument("--out", type=Path, help="output directory (default: runs/<scenario>-<policy>-s<seed>)")
    simulate.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario field, e.g. --set workload.concurrency=96 (repeatable)",
    )
    simulate.add_argument("--gzip", action="store_true", help=f"write {EVENTS_GZIP} instead of {EVENTS_PLAIN}")
    simulate.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    simulate.add_argument(
        "--check",
        action="store_true",
        help=f"check the simulator's invariants as it runs (slower); a broken one exits {EXIT_INVARIANT}",
    )

    report = commands.add_parser("report", help="recompute a run's summary from its event log")
    report.add_argument("run_dir", type=Path, help="directory written by simulate (or live)")
    report.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")

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
    compare.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario field in every run (repeatable)",
    )
    compare.add_argument("--seed", type=int, help="random seed (replaces the scenario's)")
    compare.add_argument(
        "--seeds",
        type=_positive_int,
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
    compare.add_argument("--jobs", type=_positive_int, help="runs in parallel (default: CPUs, at most the number of runs)")

    validate = commands.add_parser("validate", help="cross-validate tasim against another simulator or published measurements")
    against = validate.add_subparsers(dest="against", required=True, parser_class=_Parser)
    dynamo = against.add_parser("dynamo", help="replay the scenario's workload through Dynamo's own replay and through tasim, side by side")
    dynamo.add_argument("scenario", help="scenario YAML file or preset name (workload kind mooncake_trace or agent)")
    dynamo.add_argument(
        "--routers",
        default="round_robin,kv_router",
        metavar="A,B",
        help="routers to compare, from round_robin and kv_router (default: both)",
    )
    dynamo.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario field (repeatable)",
    )
    dynamo.add_argument(
        "--repeats",
        type=_positive_int,
        default=3,
        help="runs of each side for kv_router, whose random tie-breaks make Dynamo's results vary; means are compared (default 3)",
    )
    dynamo.add_argument("--seed", type=int, help="random seed (replaces the scenario's)")
    dynamo.add_argument("--out", type=Path, help="output directory (default: runs/validate-<scenario>)")
    vllm = against.add_parser("vllm", help="run the scenario on tasim's engine and on vLLM's own scheduler, and compare request by request")
    vllm.add_argument("scenario", help="scenario YAML file or preset name (any workload; any policy but continuum)")
    vllm.add_argument(
        "--step-ms",
        type=_positive_float,
        default=10.0,
        help="the fixed time of every engine step on both sides (default 10)",
    )
    vllm.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario field (repeatable)",
    )
    vllm.add_argument("--policy", help="policy name (replaces the scenario's policy and its params)")
    vllm.add_argument("--seed", type=int, help="random seed (replaces the scenario's)")
    vllm.add_argument("--out", type=Path, help="output directory (default: runs/validate-vllm-<scenario>)")

    published = against.add_parser("published", help="hold the presets against published measurements (measurements/*.yaml), point by point")
    published.add_argument("files", nargs="+", type=Path, metavar="FILE", help="measurement files (measurements/*.yaml)")
    published.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario field in every run (repeatable); the points' own overrides and policies stay theirs",
    )
    published.add_argument(
        "--system",
        dest="systems",
        action="append",
        default=[],
        metavar="NAME=POLICY",
        help="run a source's system as another policy spec, e.g. --system 'ThunderAgent=thunderagent[variant=upstream]'",
    )
    published.add_argument("--jobs", type=_positive_int, help="runs in parallel (default: CPUs, at most the number of runs)")
    published.add_argument("--out", type=Path, default=Path("runs/published"), help="directory of published.json (default: runs/published)")
    published.add_argument("--doc", type=Path, help="rewrite the published-measurements span of this document (docs/validation.md)")
    published.add_argument("--plots", type=Path, default=Path("docs/published"), help="PNG directory for --doc (default: docs/published)")
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

    live = commands.add_parser("live", help="serve the policy as a Dynamo router and drive the scenario's programs through it")
    live.add_argument("scenario", help="scenario YAML file or preset name (workload kind agent)")
    live.add_argument("--policy", metavar="SPEC", help=POLICY_HELP)
    live.add_argument(
        "--engine", choices=("mocker", "vllm", "sglang"), default="mocker", help="workers: Dynamo's mocker (CPU, default) or real engines on GPUs"
    )
    live.add_argument(
        "--driver",
        choices=("http", "verl"),
        default="http",
        help="how programs reach the stack: async HTTP clients (agent workloads) or verl agent loops (rl_rollout workloads)",
    )
    live.add_argument(
        "--routing",
        choices=("proxy", "pin", "dynamo-thunderagent", "dynamo-two-tier"),
        help="proxy: calls stream through the tasim router; pin: the router only decides and calls go to the frontend "
        "pinned to its choice; dynamo-*: Dynamo's own Rust plug-in decides, a baseline (policy thunderagent or "
        "cache_aware) (sets live.routing; default: the scenario's, proxy)",
    )
    live.add_argument("--programs", type=_positive_int, help="programs to run (default: the scenario's workload.programs)")
    live.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        help="run this many times faster than the scenario: divides engine step times and tool waits (mocker only)",
    )
    live.add_argument("--prompt", choices=("tokens", "text"), default="tokens", help="send prompts as token ids (default) or as text")
    live.add_argument("--model", type=Path, help="model folder for tokenizer and config (default: a generated tokenizer-only model)")
    live.add_argument("--compare-sim", action="store_true", help="also simulate the same scenario and programs and print both side by side")
    live.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a scenario field (repeatable)")
    live.add_argument("--seed", type=int, help="random seed (replaces the scenario's)")
    live.add_argument("--out", type=Path, help="output directory (default: runs/live-<scenario>-<policy>-s<seed>)")

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
    calibrate.add_argument("--trials", type=_positive_int, default=40, help="trials of the search (default 40)")
    calibrate.add_argument(
        "--loo-trials",
        type=int,
        metavar="N",
        help="trials of each leave-one-out refit, 0 to skip them (default: --trials)",
    )
    calibrate.add_argument("--seeds", type=_positive_int, default=3, help="seeds the calibrated scenario is evaluated on (default 3)")
    calibrate.add_argument("--fit-seed", type=int, default=0, help="seed of the search's sampler (default 0)")
    calibrate.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario field in every run (repeatable)",
    )
    calibrate.add_argument("--jobs", type=_positive_int, help="simulations in parallel (default: CPUs)")
    calibrate.add_argument("--out", type=Path, help="directory of calibration.json (default: runs/calibrate-<scenario>)")
    calibrate.add_argument("--write", type=Path, metavar="FILE", help="the calibrated scenario (default: OUT/<scenario>-calibrated.yaml)")

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
    tune.add_argument("--trials", type=_positive_int, default=40, help="trials the study holds when done (a rerun resumes up to it; default 40)")
    tune.add_argument("--seeds", type=_positive_int, default=3, help="paired seeds each configuration runs at (default 3)")
    tune.add_argument("--sampler-seed", type=int, default=0, help="seed of the TPE sampler (default 0)")
    tune.add_argument("--storage", metavar="URL", help="Optuna storage URL (default: sqlite:///OUT/study.db)")
    tune.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a scenario field in every run")
    tune.add_argument("--seed", type=int, help="first seed (replaces the scenario's)")
    tune.add_argument("--jobs", type=_positive_int, help="simulations in parallel (default: CPUs)")
    tune.add_argument("--ray", metavar="ADDRESS", help="run on Ray: local, auto or HOST:PORT (see compare)")
    tune.add_argument("--out", type=Path, help="output directory (default: runs/tune-<scenario>-<policy>)")

    commands.add_parser("policies", help="list the routing policies and their parameters")
    scenarios = commands.add_parser("scenarios", help="list the preset scenarios")
    scenarios.add_argument("--dir", type=Path, help="directory of scenario files (default: the presets)")

    commands.add_parser("schema", help="print the scenario file JSON schema")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number (got {text})")
    return value


def _refuse_replacing(overrides: Sequence[str], flag: str, sets: Override) -> None:
    """A --set that would replace what ``flag`` sets is refused: one of the two would be lost."""
    for assignment in overrides:
        if Override.parse(assignment).overwrites(sets):
            raise UsageError(f"--set {shown(assignment)}: {flag} sets {'.'.join(sets.key)} too (give one of them)")


def _seeded(args: argparse.Namespace) -> list[Override]:
    """The --set overrides, then --seed's, each blamed on its flag."""
    if args.seed is None:
        return set_flags(args.overrides)
    _refuse_replacing(args.overrides, f"--seed {args.seed}", Override(("seed",), args.seed))
    return [*set_flags(args.overrides), Override(("seed",), args.seed, f"--seed {args.seed}")]


def _policy_overrides(args: argparse.Namespace) -> list[Override]:
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


def _scenario_from_args(args: argparse.Namespace) -> Scenario:
    # --policy's first, so a --set policy.params.KEY=VALUE lands on top of the params it clears
    return load_scenario(scenario_path(args.scenario), [*_policy_overrides(args), *_seeded(args)])


def _default_out(scenario: Scenario) -> Path:
    return Path("runs") / f"{scenario.name}-{scenario.policy.name}-s{scenario.seed}"


def _output_dir(out: Path, flag: str = "--out") -> Path:
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


def _simulate(args: argparse.Namespace) -> int:
    scenario = _scenario_from_args(args)
    out = _output_dir(args.out or _default_out(scenario))
    interactive = not args.quiet and sys.stderr.isatty()
    summary = run_simulation(scenario, out, gzip=args.gzip, progress=interactive, check=args.check)
    if not args.quiet:
        print_summary(summary)
        Console().print(f"wrote {out}/{SUMMARY_FILE} and the event log")
    return 0


def _report(args: argparse.Namespace) -> int:
    summary = report_summary(args.run_dir)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from tasim import compare  # keeps `simulate` and `report` free of the pool and plotting code

    specs = compare.parse_policies(args.policies)
    sweep = compare.parse_sweep(args.sweep) if args.sweep else None
    compare.check_overrides(args.overrides, sweep, args.seed)
    if args.baseline is not None and args.seeds == 1:
        raise UsageError(f"--baseline {args.baseline}: ratios with intervals need --seeds N (N > 1)")
    plan = compare.plan_runs(str(scenario_path(args.scenario)), specs, sweep, _seeded(args), args.seeds, args.baseline)
    out = _output_dir(args.out or Path("runs") / f"compare-{plan.scenario.name}")
    jobs = min(args.jobs or compare.default_jobs(plan), len(plan.runs))
    progress = Console(stderr=True)
    done = iter(range(1, len(plan.runs) + 1))

    def on_done(run: compare.Run, summary: dict[str, Any]) -> None:
        line = f"[{next(done)}/{len(plan.runs)}] {run.label}: {summary['calls_per_min']:.1f} calls/min"
        progress.print(line, markup=False, highlight=False, soft_wrap=True)  # one line each, however long the label

    from tasim.parallel import BackendUnavailable, LocalPool, RayTasks

    backend = LocalPool(jobs) if args.ray is None else RayTasks(args.ray, args.jobs)
    try:
        summaries = compare.execute(plan, out, backend, on_done)
    except BackendUnavailable as error:
        raise UsageError(str(error)) from None
    out.mkdir(parents=True, exist_ok=True)
    if plan.multi_seed:
        write_json(out / compare.COMPARE_FILE, compare.seeded_records(plan, summaries))
        print_unsquashed(compare.interval_table(plan, summaries))
    else:
        write_json(out / compare.COMPARE_FILE, compare.records(plan, summaries))
        print_unsquashed(compare.comparison_table(plan, summaries))
    from tasim.plots import write_plots

    plots = ", ".join(path.name for path in write_plots(plan, summaries, out, out / compare.RUNS_DIR))
    runs = f"{len(plan.runs)} run{'s' if len(plan.runs) > 1 else ''}"
    line = f"wrote {out}/{compare.COMPARE_FILE}, {plots} and {runs} under {out}/{compare.RUNS_DIR}"
    Console().print(line, markup=False, highlight=False)
    return 0


def _validate(args: argparse.Namespace) -> int:
    if args.against == "vllm":
        return _validate_vllm(args)
    if args.against == "published":
        return _validate_published(args)
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
    scenario = load_scenario(scenario_path(args.scenario), _seeded(args))
    out = _output_dir(args.out or Path("runs") / f"validate-{scenario.name}")
    trace, results = validate(scenario, out, list(dict.fromkeys(routers)), args.repeats)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / VALIDATION_FILE, validation_record(scenario, trace, results))
    print_unsquashed(validation_table(results))
    if trace.excluded:
        print(f"left out {trace.excluded} requests whose prompt + output need more KV blocks than a worker has")
    Console().print(f"wrote {out}/{VALIDATION_FILE}", markup=False, highlight=False)
    return 0


def _validate_vllm(args: argparse.Namespace) -> int:
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
    scenario = _scenario_from_args(args)

    out = _output_dir(args.out or Path("runs") / f"validate-vllm-{scenario.name}")
    result = validate(scenario, out, args.step_ms)
    write_json(out / VALIDATION_FILE, validation_record(scenario, args.step_ms, result))
    print_unsquashed(decision_table(result))
    mismatches = mismatch_table(result)
    if mismatches is not None:
        print_unsquashed(mismatches)
    print_unsquashed(summary_table(result))
    Console().print(f"wrote {out}/{VALIDATION_FILE} and both event logs under {out}/", markup=False, highlight=False)
    return 0


def _validate_published(args: argparse.Namespace) -> int:
    from tasim.measurements.command import Request, command_line, parse_system, validate_published

    systems = dict(parse_system(text) for text in args.systems)
    if len(systems) != len(args.systems):
        raise UsageError("--system: a system is remapped twice")
    out = _output_dir(args.out)
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


def _live(args: argparse.Namespace) -> int:
    try:
        from tasim.live.engines import check_engine
        from tasim.live.run import SIM_DIR, prepare_scenario, run_live, simulated_twin
    except ImportError as exc:
        raise UsageError(f"live mode needs the live extra (pip install -e '.[live]' or make install): {exc}") from None
    if args.programs is not None:
        _refuse_replacing(args.overrides, f"--programs {args.programs}", Override(("workload", "programs"), args.programs))
    if args.routing is not None:
        _refuse_replacing(args.overrides, f"--routing {args.routing}", Override(("live", "routing"), args.routing))
        args.overrides = [*args.overrides, f"live.routing={args.routing}"]
    scenario = prepare_scenario(_scenario_from_args(args), args.driver, args.programs, args.engine)
    if args.engine != "mocker" and args.time_scale != 1.0:
        raise UsageError(f"--time-scale must be 1 with --engine {args.engine}: real engines run in real time")
    check_engine(args.engine, scenario)  # what this machine lacks, after what the flags got wrong anywhere
    if args.model is not None and not (args.model / "config.json").is_file():
        raise UsageError(f"--model {args.model}: no config.json there (a model folder has config.json and a tokenizer)")
    out = _output_dir(args.out or Path("runs") / f"live-{scenario.name}-{scenario.policy.name}-s{scenario.seed}")
    if scenario.policy.name == "continuum" and getattr(scenario.workload, "tools", None):
        print(
            "note: the live router reads no tool names from the outputs (Continuum's fork parses them), so continuum "
            "keeps one average over every tool gap here; simulation (and --compare-sim's twin) gives it workload.tools' names",
            file=sys.stderr,
        )
    # The stack's processes run in its own folder, so every path they are handed is absolute.
    model = args.model.resolve() if args.model is not None else None
    summary = run_live(scenario, out.resolve(), args.engine, args.time_scale, prompt_format=args.prompt, model_path=model, driver=args.driver)
    if args.compare_sim:
        simulated = run_simulation(simulated_twin(scenario, args.engine), out / SIM_DIR)
        print_unsquashed(side_by_side({"live": summary, "simulated": simulated}))
    else:
        print_summary(summary)
    Console().print(f"wrote {out}/{SUMMARY_FILE} and the event log", markup=False, highlight=False)
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("optuna") is None:
        raise UsageError("calibrate needs Optuna (make install, or pip install -e '.[calibrate]')")
    from tasim.calibration.command import Request, run_calibration
    from tasim.calibration.space import parse_space
    from tasim.measurements.command import command_line

    path = scenario_path(args.scenario)
    scenario = load_scenario(path, set_flags(args.overrides))  # a bad file or --set costs no trial
    knobs = parse_space(args.fit, scenario)
    out = _output_dir(args.out or Path("runs") / f"calibrate-{scenario.name}")
    if args.write is not None:
        _output_dir(args.write.parent, "--write")
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


def _tune(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("optuna") is None:
        raise UsageError("tune needs Optuna (make install, or pip install -e '.[calibrate]')")
    from tasim import tune
    from tasim.parallel import BackendUnavailable, LocalPool, RayTasks

    path = str(scenario_path(args.scenario))
    # a bad file, --set or --policy costs no trial (the policy as tune.check sets it)
    scenario = load_scenario(path, [*_seeded(args), Override.parse(f"policy.name={args.policy}", f"--policy {shown(args.policy)}")])
    out = _output_dir(args.out or Path("runs") / f"tune-{scenario.name}-{file_safe(args.policy)}")
    request = tune.Request(
        path,
        args.policy,
        tune.parse_space(args.space),
        tune.parse_objective(args.objective),
        tuple(tune.parse_constraint(c) for c in args.constraint),
        args.trials,
        tuple(range(scenario.seed, scenario.seed + args.seeds)),
        tuple(args.overrides),
        args.sampler_seed,
        args.storage or f"sqlite:///{(out / 'study.db').resolve()}",
        out,
    )
    request = tune.check(request)
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
        study = tune.run_study(request, backend, -(-jobs // args.seeds), progress)  # trials at once: enough runs for every job
    except BackendUnavailable as error:
        raise UsageError(str(error)) from None
    report = tune.report(request, study)
    target = out / f"{scenario.name}-tuned.yaml"
    target.write_text(tune.tuned_yaml(report, scenario.name, target))
    write_json(out / tune.TUNE_FILE, tune.record(report))
    for line in report.lines():
        Console().print(line, markup=False, highlight=False)
    Console().print(f"wrote {out / tune.TUNE_FILE} and {target}; study {study.study_name} in {request.storage}", markup=False, highlight=False)
    return 0


def _policies(args: argparse.Namespace) -> int:
    from tasim.policies import POLICIES

    console = Console(highlight=False)
    for name, cls in POLICIES.items():
        console.print(Text.assemble((name, "bold"), " — ", cls.summary))
        rows = param_rows(cls.params_model)
        if not rows:
            console.print("    no parameters")
        # one parameter per line, description below it: stays readable in any terminal width
        for param, kind, default, description in rows:  # Text, so list[int] is not read as markup
            console.print(Text.assemble("    ", (param, "cyan"), f": {kind} = {default}"))
            if description:  # indented as a block, so wrapped lines stay under their parameter
                console.print(Padding(Text(description, style="dim"), (0, 0, 0, 8), expand=False))
        console.print()
    return 0


def _scenarios(args: argparse.Namespace) -> int:
    from tasim.presets import PRESET_DIR, presets

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


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(Scenario.model_json_schema(), indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # as the user typed it, for generated text
        handler = {
            "simulate": _simulate,
            "compare": _compare,
            "report": _report,
            "validate": _validate,
            "live": _live,
            "calibrate": _calibrate,
            "tune": _tune,
            "policies": _policies,
            "scenarios": _scenarios,
            "schema": _schema,
        }[args.command]
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
