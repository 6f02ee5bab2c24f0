"""``tasim live``: serve the policy as a Dynamo router in front of Dynamo workers (mocker, vLLM or
SGLang), drive the scenario's programs through it, and optionally simulate the same run beside it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from tasim.cli.common import POLICY_HELP, Commands, add_set_flag, output_dir, positive_float, positive_int, refuse_replacing, scenario_from_args
from tasim.config.scenario import Override
from tasim.core.errors import UsageError
from tasim.results.render import print_summary, print_unsquashed, side_by_side
from tasim.results.run_folder import SUMMARY_FILE
from tasim.sim.simulation import run_simulation


def add_parser(commands: Commands) -> None:
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
    live.add_argument("--programs", type=positive_int, help="programs to run (default: the scenario's workload.programs)")
    live.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        help="run this many times faster than the scenario: divides engine step times and tool waits (mocker only)",
    )
    live.add_argument("--prompt", choices=("tokens", "text"), default="tokens", help="send prompts as token ids (default) or as text")
    live.add_argument("--model", type=Path, help="model folder for tokenizer and config (default: a generated tokenizer-only model)")
    live.add_argument("--compare-sim", action="store_true", help="also simulate the same scenario and programs and print both side by side")
    add_set_flag(live, "override a scenario field (repeatable)")
    live.add_argument("--seed", type=int, help="random seed (replaces the scenario's)")
    live.add_argument("--out", type=Path, help="output directory (default: runs/live-<scenario>-<policy>-s<seed>)")
    live.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        from tasim.live.run import SIM_DIR, prepare_scenario, run_live, simulated_twin
        from tasim.live.stack.engines import check_engine
    except ImportError as exc:
        raise UsageError(f"live mode needs the live extra (pip install -e '.[live]' or make install): {exc}") from None
    if args.programs is not None:
        refuse_replacing(args.overrides, f"--programs {args.programs}", Override(("workload", "programs"), args.programs))
    if args.routing is not None:
        refuse_replacing(args.overrides, f"--routing {args.routing}", Override(("live", "routing"), args.routing))
        args.overrides = [*args.overrides, f"live.routing={args.routing}"]
    scenario = prepare_scenario(scenario_from_args(args), args.driver, args.programs, args.engine)
    if args.engine != "mocker" and args.time_scale != 1.0:
        raise UsageError(f"--time-scale must be 1 with --engine {args.engine}: real engines run in real time")
    check_engine(args.engine, scenario)  # what this machine lacks, after what the flags got wrong anywhere
    if args.model is not None and not (args.model / "config.json").is_file():
        raise UsageError(f"--model {args.model}: no config.json there (a model folder has config.json and a tokenizer)")
    out = output_dir(args.out or Path("runs") / f"live-{scenario.name}-{scenario.policy.name}-s{scenario.seed}")
    if scenario.policy.name == "continuum" and getattr(scenario.workload, "tools", None):
        print(
            "note: the live router reads no tool names from the outputs (Continuum's fork parses them), so continuum "
            "keeps one average over every tool gap here; simulation (and --compare-sim's twin) gives it workload.tools' names",
            file=sys.stderr,
        )
    summary = run_live(scenario, out, args.engine, args.time_scale, prompt_format=args.prompt, model_path=args.model, driver=args.driver)
    if args.compare_sim:
        simulated = run_simulation(simulated_twin(scenario, args.engine), out / SIM_DIR)
        print_unsquashed(side_by_side({"live": summary, "simulated": simulated}))
    else:
        print_summary(summary)
    Console().print(f"wrote {out}/{SUMMARY_FILE} and the event log", markup=False, highlight=False)
    return 0
