"""Scenarios that mean nothing, and errors that name their real source.

An empty scenario file, or a count the simulator would silently raise (``turns: 0`` runs one
turn), is refused in one line; an error caused by ``--set``, ``--seed`` or ``--policy`` names that
flag, not the scenario file, which does not hold the key.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import REPO, TINY

from tasim.cli import main

SWE = str(REPO / "scenarios" / "swe-agent.yaml")
MOONCAKE = str(REPO / "scenarios" / "mooncake-synthetic.yaml")
EMPTY = (
    "empty scenario (every field would be its default): give at least a workload, and usually a cluster and a policy; "
    "`python -m tasim scenarios` lists presets to start from, `python -m tasim schema` every field"
)
WORKLOAD_KEYS = (
    "system_prompt_tokens, task_prompt_tokens, turns, output_tokens, tool_latency_s, tools, observation_tokens, "
    "setup_s, max_context_tokens, release, kind, arrival, concurrency, rate_per_s, programs"
)


def error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line ``python -m tasim ARGV`` prints on stderr, checking it exits 2 with nothing else."""
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    return captured.err.removesuffix("\n")


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return str(path)


# --- item 3: empty files and silently raised counts -------------------------------------------


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "~\n", "null\n", "{}\n"])
def test_an_empty_scenario_file_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    assert error(capsys, "simulate", path, "--quiet", "--out", str(tmp_path / "out")) == f"error: {path}: {EMPTY}"
    assert not (tmp_path / "out").exists()


def test_overrides_do_not_make_an_empty_file_a_scenario(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "# nothing yet\n")
    line = error(capsys, "simulate", path, "--set", "workload.programs=2", "--quiet", "--out", str(tmp_path / "out"))
    assert line == f"error: {path}: {EMPTY}"


def test_scenarios_lists_an_empty_file_as_invalid(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("# a scenario, some day\n")
    (tmp_path / "tiny.yaml").write_text(Path(TINY).read_text())
    capsys.readouterr()
    assert main(["scenarios", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"INVALID  {tmp_path / 'empty.yaml'}: {EMPTY}"
    assert lines[1].startswith("tiny.yaml ")
    assert len(lines) == 2


# (YAML of the workload section, the message after "workload.")
COUNTS_BELOW_MINIMUM = [
    ("{turns: 0}", "turns: 0 is below 1 (allowed: 1 to 1000000000; the simulator would silently raise it to 1)"),
    ("{turns: 0.4}", "turns: 0.4 is below 1 (allowed: 1 to 1000000000; the simulator would silently raise it to 1)"),
    (
        "{output_tokens: {kind: fixed, value: 0}}",
        "output_tokens: 0 is below 1 (allowed: 1 to 1000000000; the simulator would silently raise it to 1)",
    ),
    (
        "{turns: {kind: uniform, low: 0, high: 4}}",
        "turns: low 0 is below 1 (allowed: 1 to 1000000000; the simulator would silently raise draws below 1 to 1)",
    ),
    (
        "{turns: {kind: empirical, values: [3, 0, 5]}}",
        "turns: values 0 is below 1 (allowed: 1 to 1000000000; the simulator would silently raise draws below 1 to 1)",
    ),
    (
        "{task_prompt_tokens: {kind: lognormal, median: 0.5, sigma: 1}}",
        "task_prompt_tokens: median 0.5 is below 1 (allowed: 1 to 1000000000; the simulator would silently raise draws below 1 to 1)",
    ),
    (
        "{output_tokens: {kind: lognormal, median: 100, sigma: 1, min: 0.2}}",
        "output_tokens: min 0.2 is below 1 (allowed: 1 to 1000000000; the simulator would silently raise draws below 1 to 1)",
    ),
    (
        "{output_tokens: {kind: lognormal, median: 100, sigma: 1, max: 0.5}}",
        "output_tokens: max 0.5 is below 1 (allowed: at least 1; the simulator would silently raise draws below 1 to 1)",
    ),
    (
        "{turns: {kind: pareto, scale: 0.5, alpha: 2}}",
        "turns: scale 0.5 is below 1 (allowed: 1 to 1000000000; the simulator would silently raise draws below 1 to 1)",
    ),
    (
        "{kind: rl_rollout, turns: 0}",
        "turns: 0 is below 1 (allowed: 1 to 1000000000; the simulator would silently raise it to 1)",
    ),
]


@pytest.mark.parametrize(("workload", "message"), COUNTS_BELOW_MINIMUM)
def test_a_count_the_simulator_would_raise_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, workload: str, message: str) -> None:
    path = write(tmp_path, f"duration_s: 5\nworkload: {workload}\n")
    assert error(capsys, "simulate", path, "--quiet", "--out", str(tmp_path / "out")) == f"error: {path}: workload.{message}"


@pytest.mark.parametrize(
    ("distribution", "message"),
    [
        # every draw would be max: the min given would be ignored
        ("{kind: lognormal, median: 2, sigma: 1, min: 10, max: 5}", "tool_latency_s: max (5.0) must be >= min (10.0)"),
        # every draw would be max: a fixed value in disguise
        ("{kind: pareto, scale: 4, alpha: 1.1, max: 2}", "tool_latency_s: max (2.0) must be >= scale (4.0), the smallest draw"),
    ],
)
def test_a_cap_below_the_floor_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, distribution: str, message: str) -> None:
    path = write(tmp_path, f"duration_s: 5\nworkload: {{tool_latency_s: {distribution}}}\n")
    assert error(capsys, "simulate", path, "--quiet", "--out", str(tmp_path / "out")) == f"error: {path}: workload.{message}"


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("workload.programs=0", "workload.programs: Input should be greater than 0 (got 0)"),
        ("workload.concurrency=0", "workload.concurrency: Input should be greater than 0 (got 0)"),
        ("cluster.backends=0", "cluster.backends: Input should be greater than 0 (got 0)"),
    ],
)
def test_zero_programs_workers_or_concurrency_are_refused(capsys: pytest.CaptureFixture[str], assignment: str, message: str) -> None:
    assert error(capsys, "simulate", TINY, "--set", assignment) == f"error: --set {assignment}: {message}"


def test_counts_of_zero_that_mean_zero_still_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Observation tokens and set-up time may be 0, and a lognormal without min has a lower tail
    but a median of at least 1: those run as before."""
    workload = "{programs: 2, turns: 2, observation_tokens: 0, setup_s: 0, output_tokens: {kind: lognormal, median: 20, sigma: 0.5}}"
    path = write(tmp_path, f"duration_s: 30\nworkload: {workload}\n")
    capsys.readouterr()
    assert main(["simulate", path, "--quiet", "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == ""


# --- item 9: errors name the flag that caused them ---------------------------------------------


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--set", "workload.concurency=3"], f"--set workload.concurency=3: workload.concurency: unknown key (allowed: {WORKLOAD_KEYS})"),
        (["--set", "workload.concurrency=-1"], "--set workload.concurrency=-1: workload.concurrency: Input should be greater than 0 (got -1)"),
        (
            ["--set", "workload.turns=0"],
            "--set workload.turns=0: workload.turns: 0 is below 1 (allowed: 1 to 1000000000; the simulator would silently raise it to 1)",
        ),
        (["--seed", "-1"], "--seed -1: seed: Input should be greater than or equal to 0 (got -1)"),
        (
            ["--policy", "kv_router[router_temperature=-1]"],
            "--policy kv_router[router_temperature=-1]: policy: params.router_temperature: Input should be greater than or equal to 0 (got -1)",
        ),
        # a rule across fields: blamed on the override after which it breaks
        (["--set", "workload.arrival=poisson"], "--set workload.arrival=poisson: workload: rate_per_s is required when arrival is 'poisson'"),
        (
            ["--policy", "autellix"],
            "--policy autellix: (top level): policy autellix orders calls by priority, which only vLLM's priority scheduling honours: "
            "set cluster.engine.scheduling_policy: priority (flavour vllm)",
        ),
        # the second --set is the one that breaks the scenario
        (
            ["--set", "duration_s=30", "--set", "metrics.warmup_s=40"],
            "--set metrics.warmup_s=40: (top level): metrics.warmup_s (40.0) must be < duration_s (30.0)",
        ),
    ],
)
def test_override_errors_name_their_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], line: str) -> None:
    assert error(capsys, "simulate", TINY, *flags, "--quiet", "--out", str(tmp_path / "out")) == f"error: {line}"
    assert not (tmp_path / "out").exists()


def test_the_file_is_blamed_for_its_own_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "duration_s: 5\nworkload: {concurrency: -3}\n")
    expected = f"error: {path}: workload.concurrency: Input should be greater than 0 (got -3)"
    assert error(capsys, "simulate", path, "--set", "workload.programs=2", "--quiet") == expected
    # a --set that replaces the file's bad value leaves the next error to its own source
    line = error(capsys, "simulate", path, "--set", "workload.concurrency=2", "--set", "workload.bogus=1", "--quiet")
    assert line == f"error: --set workload.bogus=1: workload.bogus: unknown key (allowed: {WORKLOAD_KEYS})"


def test_a_trace_path_from_set_blames_the_set(capsys: pytest.CaptureFixture[str]) -> None:
    missing = REPO / "scenarios" / "nope.jsonl"  # relative to the scenario file
    line = error(capsys, "simulate", MOONCAKE, "--set", "workload.path=nope.jsonl", "--quiet")
    assert line == f"error: --set workload.path=nope.jsonl: workload.path: file not found: {missing}"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        return False


def _live_installed() -> bool:
    try:
        import tasim.live.run  # noqa: F401 - the live extra's modules
    except ImportError:
        return False
    return True


NO_OPTUNA = pytest.mark.skipif(not _installed("optuna"), reason="tune and calibrate need Optuna (the calibrate extra)")


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["simulate", TINY, "--quiet"], id="simulate"),
        pytest.param(["compare", TINY, "--policies", "round_robin,kv_router", "--jobs", "1"], id="compare"),
        pytest.param(["validate", "dynamo", TINY, "--routers", "round_robin", "--repeats", "1"], id="validate-dynamo"),
        pytest.param(["validate", "vllm", TINY], id="validate-vllm"),
        pytest.param(
            ["tune", TINY, "--policy", "kv_router", "--space", "policy.params.router_temperature=0:1", "--objective", "calls_per_min"],
            id="tune",
            marks=NO_OPTUNA,
        ),
        pytest.param(
            ["calibrate", TINY, "--against", "measurements/none.yaml", "--fit", "cluster.perf.mfu=0.2:0.8", "--points", "a"],
            id="calibrate",
            marks=NO_OPTUNA,
        ),
        pytest.param(["live", TINY], id="live", marks=pytest.mark.skipif(not _live_installed(), reason="live needs the live extra")),
    ],
)
def test_every_command_blames_set(capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str]) -> None:
    line = error(capsys, *command, "--set", "workload.concurency=3", "--out", str(tmp_path / "out"))
    assert line == f"error: --set workload.concurency=3: workload.concurency: unknown key (allowed: {WORKLOAD_KEYS})"
    assert not (tmp_path / "out").exists()


@NO_OPTUNA
def test_tune_blames_its_policy_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    flags = ["--space", "workload.concurrency=2:4", "--objective", "calls_per_min", "--out", str(tmp_path)]
    allowed = "autellix, cache_aware, continuum, kv_router, least_loaded, random, round_robin, thunderagent"
    assert error(capsys, "tune", TINY, "--policy", "nope", *flags) == f"error: --policy nope: policy: unknown policy 'nope' (allowed: {allowed})"
