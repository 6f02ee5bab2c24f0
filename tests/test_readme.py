"""Every command in the ``sh`` blocks of the README and the documentation (docs/, the generated
reference aside) runs exactly as written, from a repository root.

A user copies a command into a shell at the root of a fresh clone: relative paths, default output
folders and all. So each command runs here as a subprocess of a shell, from a copy of the
repository root (its entries linked, with a ``runs/`` of its own), with the one addition the
README names: ``--set duration_s=1200`` on the simulations of presets that run for simulated
hours. Each then leaves no process behind: every process started carries a marker in its
environment, looked for after. A command shown twice (the README's in a how-to too) runs once.

A new command in a ``sh`` block fails `test_every_shown_command_has_a_check` until a check of what
it must do is written below; a command the documentation shows but no test machine can run (a GPU
host, a cluster of several machines) goes in a ``text`` block instead.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, ProcessMark

README = REPO / "README.md"
# the README first (its commands run first: a how-to may report on a run of the quickstart), then
# docs/ in path order; the reference pages are generated from the code and show no commands
PAGES = [README, *sorted(page for page in (REPO / "docs").rglob("*.md") if "reference" not in page.parts)]
SHORTER = " --set duration_s=1200"  # the addition the README names

pytestmark = [pytest.mark.processes, pytest.mark.slow]


def shown_commands(text: str) -> list[str]:
    """The commands of the ``sh`` blocks, a backslash-continued line joined, comments dropped."""
    commands: list[str] = []
    for block in re.findall(r"^ *```sh\n(.*?)^ *```", text, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split(" #")[0].strip()
            if command and not command.startswith("#"):
                commands.append(re.sub(r"\s+", " ", command))
    return commands


def every_shown_command() -> list[str]:
    """The commands of every page, each once, in the order they are first shown."""
    return list(dict.fromkeys(command for page in PAGES for command in shown_commands(page.read_text())))


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    left_behind: list[int]


def run_shown(command: str, root: Path, timeout_s: float = 600) -> Outcome:
    """``command`` through a shell in ``root``, with the virtual environment's python first on
    PATH (as an activated .venv puts it); then up to 10 s for its processes to be gone."""
    mark = ProcessMark()
    env = mark.env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", COLUMNS="200")
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", command], cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s)
    seconds = time.monotonic() - started
    return Outcome(done.returncode, done.stdout, done.stderr, seconds, mark.wait_gone(10))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository root as a user's clone has it, with its own (empty) ``runs/``."""
    clone = tmp_path_factory.mktemp("clone")
    for entry in REPO.iterdir():
        if entry.name not in ("runs", ".git"):
            (clone / entry.name).symlink_to(entry)
    return clone


def _ok(outcome: Outcome) -> None:
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    assert "Traceback" not in outcome.stderr
    assert outcome.left_behind == []


def check_compare(outcome: Outcome, root: Path) -> None:
    _ok(outcome)
    out = root / "runs" / "compare-swe-agent-2x"
    record = json.loads((out / "compare.json").read_text())
    assert record["seeds"] == [0, 1, 2] and record["baseline"] == "round_robin"
    ratio = next(cell["ratio_to_baseline"] for cell in record["cells"] if cell["spec"] == "thunderagent")
    assert ratio["low"] > 2.0 and ratio["significant"] is True  # the Quickstart's claim, at 1,200 s
    assert re.search(r"thunderagent .* \d\.\d{3}× \[\d\.\d{3}, \d\.\d{3}\]", outcome.stdout)
    assert (out / "throughput.png").is_file() and len(list((out / "runs").iterdir())) == 9


def check_tune(outcome: Outcome, root: Path) -> None:
    _ok(outcome)
    out = root / "runs" / "tune-swe-agent-2x-thunderagent"
    record = json.loads((out / "tune.json").read_text())
    assert record["trials"] == 8 and record["seeds"] == [0, 1, 2]
    assert (out / "swe-agent-2x-tuned.yaml").is_file()


def check_simulate(outcome: Outcome, root: Path) -> None:
    _ok(outcome)
    summary = json.loads((root / "runs" / "swe-agent-thunderagent-s0" / "summary.json").read_text())
    assert summary["calls_per_min"] > 0
    assert "wrote runs/swe-agent-thunderagent-s0/summary.json" in outcome.stdout


def check_host_tier(run_dir: str) -> Callable[[Outcome, Path], None]:
    def check(outcome: Outcome, root: Path) -> None:
        _ok(outcome)
        tier = json.loads((root / "runs" / run_dir / "summary.json").read_text())["host_tier"]
        assert tier["host_hit_tokens"] > 0 and tier["stored_tokens"] > 0

    return check


def check_report(outcome: Outcome, root: Path) -> None:
    _ok(outcome)
    summary = json.loads((root / "runs" / "swe-agent-thunderagent-s0" / "summary.json").read_text())
    assert f"{summary['prefix_hit_rate']:.4f}" in outcome.stdout  # the summary again, from the log


def check_live(run_dir: str, calls: int) -> Callable[[Outcome, Path], None]:
    def check(outcome: Outcome, root: Path) -> None:
        _ok(outcome)
        summary = json.loads((root / "runs" / run_dir / "summary.json").read_text())
        assert summary["programs_leaked"] == 0
        assert summary["requests_completed"] == calls
        assert f"wrote runs/{run_dir}/summary.json" in outcome.stdout

    return check


def check_ok(outcome: Outcome, root: Path) -> None:
    _ok(outcome)


def check_printed(*fragments: str) -> Callable[[Outcome, Path], None]:
    def check(outcome: Outcome, root: Path) -> None:
        _ok(outcome)
        for fragment in fragments:
            assert fragment in outcome.stdout

    return check


def check_checked_simulation(outcome: Outcome, root: Path) -> None:
    """``simulate --check --quiet``: the run completes with every invariant held, silently."""
    _ok(outcome)
    run = json.loads((root / "runs" / "live-mocker-thunderagent-s5" / "run.json").read_text())
    assert run["scenario"]["policy"]["params"] == {"variant": "dynamo"}


def check_compared(out: str, runs: int) -> Callable[[Outcome, Path], None]:
    def check(outcome: Outcome, root: Path) -> None:
        _ok(outcome)
        assert len(json.loads((root / "runs" / out / "compare.json").read_text())) == runs
        assert (root / "runs" / out / "throughput.png").is_file()

    return check


def check_replay(outcome: Outcome, root: Path) -> None:
    _ok(outcome)
    summary = json.loads((root / "runs" / "mooncake-conversation-kv_router-s0" / "summary.json").read_text())
    assert summary["requests_completed"] == 500 and summary["requests_dropped"] == 0


def check_calibrated(outcome: Outcome, root: Path) -> None:
    _ok(outcome)
    out = root / "runs" / "calibrate-toolorchestra-demo"
    record = json.loads((out / "calibration.json").read_text())
    assert list(record["fitted_values"]) == ["cluster.perf.bandwidth_efficiency"]
    assert (out / "toolorchestra-calibrated.yaml").is_file()


def check_live_report(outcome: Outcome, root: Path) -> None:
    _ok(outcome)
    summary = json.loads((root / "runs" / "live-live-mocker-thunderagent-s5" / "summary.json").read_text())
    assert f"{summary['prefix_hit_rate']:.4f}" in outcome.stdout


def check_written(path: str) -> Callable[[Outcome, Path], None]:
    def check(outcome: Outcome, root: Path) -> None:
        _ok(outcome)
        assert (root / path).is_file()

    return check


def check_rollout_step(outcome: Outcome, root: Path) -> None:
    """One step of 2,048 trajectories: every one finishes, and the pool holds them without a pause."""
    _ok(outcome)
    summary = json.loads((root / "runs" / "rl-scale-2048-thunderagent-s0" / "summary.json").read_text())
    assert summary["programs_completed"] == 2048 and summary["requests_unfinished"] == 0
    assert summary["pauses"] == 0 and summary["working_set_ratio"] < 0.5


def check_trainer_modes_compared(outcome: Outcome, root: Path) -> None:
    """Four trainers × two policies × two seeds, every run with its trainer steps done."""
    _ok(outcome)
    runs = json.loads((root / "runs" / "compare-rl-async" / "compare.json").read_text())["runs"]
    assert len(runs) == 16 and all(run["summary"]["rollout"]["steps"] == 2 for run in runs)


def check_trainer_modes(outcome: Outcome, root: Path) -> None:
    _ok(outcome)
    rows = outcome.stdout.splitlines()
    assert rows[0].split()[:3] == ["mode", "policy", "step"] and len(rows) == 9
    assert all("× [" in row for row in rows if not row.startswith(("mode", "sync")))  # paired with sync


def check_refused_without_gpus(outcome: Outcome, root: Path) -> None:
    """On a machine without the GPUs the command asks for: one line, exit 2, at once, nothing
    started or written."""
    assert outcome.returncode == 2 and outcome.stdout == ""
    assert outcome.stderr.startswith("error: --engine vllm needs 8 CUDA GPUs") and outcome.stderr.count("\n") == 1
    assert outcome.seconds < 30 and outcome.left_behind == []
    assert not (root / "runs" / "rl-gpu").exists()


def _gpus() -> int:
    import torch

    return int(torch.cuda.device_count())


# Each shown command, in the order of every_shown_command, with what it must do. `make` commands
# are checked for what they run (the demo is the Quickstart's first command; `make test` and
# `make install` are what runs this file; the others rewrite committed files) and not run here.
COMPARE = "python -m tasim compare swe-agent-2x --policies round_robin,kv_router,thunderagent --seeds 3 --set workload.concurrency=96"
TUNE = (
    "python -m tasim tune swe-agent-2x --policy thunderagent --set workload.concurrency=96 --space policy.params.scheduler_interval_s=1:20:log "
    "--space 'policy.params.admission_order=smallest_first|fifo' --objective calls_per_min --trials 8"
)
GPU_ROLLOUT = (
    "python -m tasim live scenarios/rl-rollout.yaml --driver verl --engine vllm "
    "--model /models/Qwen3-Coder-30B-A3B --set policy.name=thunderagent --out runs/rl-gpu"
)
CHECKS: dict[str, tuple[str, Callable[[Outcome, Path], None]] | None] = {
    # README.md
    "make demo": None,
    "make test": None,
    COMPARE: (SHORTER, check_compare),
    TUNE: (SHORTER, check_tune),
    "python -m tasim live scenarios/live-mocker.yaml --compare-sim": ("", check_live("live-live-mocker-thunderagent-s5", 98)),
    # docs/engine.md
    "python -m tasim simulate swe-agent --set cluster.engine.host_tier.ratio=2 --set duration_s=900 --quiet --out runs/swe-agent-host-tier": (
        "",
        check_host_tier("swe-agent-host-tier"),
    ),
    "python -m tasim simulate swe-agent --set cluster.engine.host_tier.semantics=sglang --set cluster.engine.host_tier.ratio=2 "
    "--set cluster.engine.kv_blocks=6000 --set duration_s=300 --set metrics.warmup_s=60 --quiet --out runs/swe-agent-hicache": (
        "",
        check_host_tier("swe-agent-hicache"),
    ),
    # docs/howto/add-a-perf-model.md
    "python -m tasim compare live-mocker --policies round_robin --sweep cluster.perf.model=roofline,dynamo_polynomial,fixed --jobs 1 "
    "--out runs/compare-perf-models": ("", check_compared("compare-perf-models", 3)),
    # docs/howto/add-a-policy.md
    "make reference-docs": None,
    "make baseline": None,
    "python -m tasim policies": ("", check_printed("round_robin", "thunderagent", "autellix")),
    "python -m tasim simulate live-mocker --policy 'thunderagent[variant=dynamo]' --check --quiet": ("", check_checked_simulation),
    # docs/howto/add-a-workload.md
    "python -m tasim simulate mooncake-conversation --set workload.max_requests=500 --quiet": ("", check_replay),
    # docs/howto/calibrate.md
    "python -m tasim calibrate toolorchestra --against measurements/thunderagent-paper.yaml --fit cluster.perf.bandwidth_efficiency=0.2:0.5 "
    "--points fig4-toolorchestra-vllm-48 --trials 2 --loo-trials 0 --seeds 1 --out runs/calibrate-toolorchestra-demo": ("", check_calibrated),
    # docs/howto/compare.md
    "python -m tasim simulate swe-agent --policy thunderagent": (SHORTER, check_simulate),
    "python -m tasim report runs/swe-agent-thunderagent-s0": ("", check_report),
    "python -m tasim compare live-mocker --policies 'round_robin,kv_router,thunderagent[variant=upstream],thunderagent[variant=dynamo]' "
    "--sweep workload.concurrency=8,16,24": ("", check_compared("compare-live-mocker", 12)),
    # docs/howto/run-live.md
    "python -m tasim report runs/live-live-mocker-thunderagent-s5": ("", check_live_report),
    # docs/howto/run-with-verl.md
    "python -m tasim live scenarios/rl-live-mocker.yaml --driver verl --engine mocker": ("", check_live("live-rl-live-mocker-thunderagent-s3", 101)),
    "make install": None,
    GPU_ROLLOUT: ("", check_refused_without_gpus),
    # docs/howto/validate.md
    "python -m tasim validate vllm live-mocker": ("", check_written("runs/validate-vllm-live-mocker/validation.json")),
    "python -m tasim validate vllm live-mocker --set cluster.engine.host_tier.ratio=2 --out runs/validate-vllm-live-mocker-tier": (
        "",
        check_written("runs/validate-vllm-live-mocker-tier/validation.json"),
    ),
    "python -m tasim validate dynamo multiturn-validation --set duration_s=120 --repeats 1": (
        "",
        check_written("runs/validate-multiturn-validation/validation.json"),
    ),
    "python -m tasim validate dynamo multiturn-validation --set cluster.engine.kv_blocks=1024 --set cluster.engine.host_tier.blocks=2048 "
    "--set duration_s=120 --repeats 1 --out runs/validate-multiturn-validation-tier": (
        "",
        check_written("runs/validate-multiturn-validation-tier/validation.json"),
    ),
    "python -m tasim validate published measurements/verl-recipe-h20.yaml": ("", check_written("runs/published/published.json")),
    # docs/live.md
    "python -m tasim live scenarios/live-mocker-host-tier.yaml --compare-sim": ("", check_live("live-live-mocker-host-tier-round_robin-s5", 98)),
    # docs/results/async-rl.md
    "python -m tasim compare rl-async --policies least_loaded,thunderagent --sweep workload.mode=sync,one_step_off,colocate_async,separate_async "
    "--set workload.prompts_per_step=8 --set workload.steps=2 --set workload.training_s=600 --seeds 2": ("", check_trainer_modes_compared),
    "python -m lab.trainer_modes runs/compare-rl-async": ("", check_trainer_modes),
    # docs/results/rl-scale.md
    "python -m tasim simulate rl-scale-2048 --policy thunderagent --quiet": ("", check_rollout_step),
    "python -m lab.rollout_audit runs/rl-scale-2048-thunderagent-s0": ("", check_printed("2048/2048")),
    # docs/scenarios.md
    "python -m tasim scenarios": ("", check_printed("swe-agent.yaml", "live-mocker.yaml")),
}
RUNNABLE = [command for command, check in CHECKS.items() if check is not None]


def test_every_shown_command_has_a_check() -> None:
    assert every_shown_command() == list(CHECKS)


def test_make_demo_runs_the_quickstarts_first_command() -> None:
    recipe = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert f".venv/bin/python -m tasim {COMPARE.removeprefix('python -m tasim ')}\n" in recipe
    assert f'echo "next, its knobs: {TUNE} (then live: README.md, Quickstart)"' in recipe  # the next command, shown


_DONE: dict[str, Outcome] = {}


def _outcome(command: str, root: Path) -> Outcome:
    """``command``'s outcome, after every command shown before it (a report reads a run)."""
    for earlier in RUNNABLE[: RUNNABLE.index(command) + 1]:
        if earlier not in _DONE:
            addition, _ = CHECKS[earlier] or ("", None)
            _DONE[earlier] = run_shown(earlier + addition, root)
    return _DONE[command]


@pytest.mark.parametrize("command", RUNNABLE, ids=[" ".join(shlex.split(c)[3:5]) for c in RUNNABLE])
def test_shown_command_runs_as_written(command: str, root: Path) -> None:
    if command == GPU_ROLLOUT and _gpus() >= 8:
        pytest.skip("this machine has the GPUs: the command would start a real rollout of a model not here")
    _, check = CHECKS[command] or ("", None)
    assert check is not None
    check(_outcome(command, root), root)
