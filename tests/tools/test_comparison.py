"""`tasim compare` and `tasim policies`: run layout, compare.json, plots, parallel determinism,
validation before any run, and the generic parameter listing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
from conftest import SCENARIOS, TINY, assert_usage_error, tasim
from pydantic import BaseModel, Field, PositiveInt

from tasim.results.render import param_rows

SHORT = ("--set", "duration_s=40")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def compare(out: Path, *args: str) -> list[dict[str, Any]]:
    result = tasim("compare", TINY, *SHORT, "--out", str(out), *args)
    assert result.returncode == 0, result.stderr
    return json.loads((out / "compare.json").read_text())


def without_wall_time(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**e, "summary": {k: v for k, v in e["summary"].items() if k != "wall_time_s"}} for e in entries]


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """One sweep, given out of order, shared by the tests that only read its results."""
    out = tmp_path_factory.mktemp("swept")
    return out, compare(out, "--policies", "round_robin", "--sweep", "workload.concurrency=4,2", "--jobs", "2")


def test_sweep_writes_ordered_entries_matching_each_run(swept: tuple[Path, list[dict[str, Any]]]) -> None:
    out, entries = swept
    # numeric sweep values are run and listed in ascending order
    assert [(e["policy"], e["overrides"]) for e in entries] == [
        ("round_robin", {"workload.concurrency": 2}),
        ("round_robin", {"workload.concurrency": 4}),
    ]
    for entry, concurrency in zip(entries, (2, 4)):
        run_dir = out / "runs" / f"round_robin-workload.concurrency={concurrency}"
        assert entry["summary"] == json.loads((run_dir / "summary.json").read_text())
        assert (run_dir / "events.jsonl").stat().st_size > 0
        resolved = json.loads((run_dir / "run.json").read_text())["scenario"]
        assert resolved["workload"]["concurrency"] == concurrency
        assert resolved["duration_s"] == 40
        assert entry["summary"]["sim_time_s"] == 40
    assert entries[0]["summary"]["calls_per_min"] != entries[1]["summary"]["calls_per_min"]


def test_sweep_writes_non_empty_pngs(swept: tuple[Path, list[dict[str, Any]]]) -> None:
    out, _ = swept
    for name in ("throughput.png", "hit_rate.png", "kv_utilization.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000, name


def test_without_sweep_one_run_per_policy_and_throughput_bars(tmp_path: Path) -> None:
    entries = compare(tmp_path, "--policies", "round_robin", "--seed", "3")
    assert [(e["policy"], e["overrides"], e["summary"]["seed"]) for e in entries] == [("round_robin", {}, 3)]
    assert (tmp_path / "runs" / "round_robin" / "summary.json").exists()
    for name in ("throughput.png", "kv_utilization.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC), name
    assert not (tmp_path / "hit_rate.png").exists()  # a hit rate against a sweep only


def test_rl_rollouts_are_compared_by_rollout_throughput_and_step_time(tmp_path: Path) -> None:
    """For rl_rollout workloads the table shows what a training step costs (and how long its
    GRPO groups take to complete), and the throughput plot is rollout throughput, not calls per
    minute."""
    small = ["workload.prompts_per_step=2", "workload.samples_per_prompt=2", "workload.steps=1", "workload.training_s=5", "workload.turns=3"]
    args = [arg for o in small for arg in ("--set", o)]
    result = tasim(
        "compare",
        str(SCENARIOS / "rl-rollout.yaml"),
        *args,
        "--policies",
        "round_robin,thunderagent",
        "--sweep",
        "workload.max_concurrency=2,4",
        "--out",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    top = next(i for i, line in enumerate(lines) if "strag-" in line)
    assert lines[top].split()[:4] == ["rollout", "step", "strag-", "group"]
    assert " ".join(lines[top + 1].split()).startswith("max concurrency policy tok/s mean s gler p99 s")
    assert "TTFT" not in result.stdout
    entries = json.loads((tmp_path / "compare.json").read_text())
    rollout = entries[0]["summary"]["rollout"]
    first_row = lines[top + 3].split()
    assert first_row[:6] == [
        "2",
        "round_robin",
        f"{rollout['rollout_tokens_per_s']:,.1f}",
        f"{rollout['step_time_s']['mean']:,.0f}",
        f"{rollout['straggler_share']:.3f}",
        f"{rollout['group_completion_s']['p99']:,.0f}",
    ]
    assert (tmp_path / "throughput.png").read_bytes().startswith(PNG_MAGIC)


def test_results_do_not_depend_on_jobs(tmp_path: Path, swept: tuple[Path, list[dict[str, Any]]]) -> None:
    _, parallel = swept
    inline = compare(tmp_path, "--policies", "round_robin", "--sweep", "workload.concurrency=4,2", "--jobs", "1")
    assert without_wall_time(inline) == without_wall_time(parallel)


def test_categorical_sweep_keeps_the_given_order(tmp_path: Path) -> None:
    entries = compare(
        tmp_path, "--policies", "round_robin", "--sweep", "cluster.engine.eviction=lru,lineage", "--set", "cluster.engine.flavour=mocker"
    )
    assert [e["overrides"]["cluster.engine.eviction"] for e in entries] == ["lru", "lineage"]
    assert (tmp_path / "throughput.png").read_bytes().startswith(PNG_MAGIC)


def test_a_set_complete_only_with_the_swept_field(tmp_path: Path) -> None:
    """A host tier's semantics set while its size is swept: the --set alone names no size, so it
    is checked with the sweep's first value; a --set wrong either way is still blamed."""
    tier = ("--set", "cluster.engine.host_tier.semantics=sglang", "--sweep", "cluster.engine.host_tier.ratio=1,2")
    entries = compare(tmp_path / "ok", "--policies", "round_robin", *tier)
    assert [e["overrides"]["cluster.engine.host_tier.ratio"] for e in entries] == [1, 2]
    assert all(e["summary"]["host_tier"]["host_blocks_per_worker"] > 0 for e in entries)
    result = tasim(
        "compare",
        TINY,
        *SHORT,
        "--out",
        str(tmp_path / "bad"),
        "--policies",
        "round_robin",
        "--set",
        "cluster.engine.host_tier.semantics=hicache",
        "--sweep",
        "cluster.engine.host_tier.ratio=1,2",
    )
    assert_usage_error(result, "--set cluster.engine.host_tier.semantics=hicache", "'vllm', 'sglang' or 'dynamo_mocker'")


def test_one_policy_twice_with_different_params(tmp_path: Path) -> None:
    """Each spec's params merge over the scenario's defaults for that policy, a policy param can
    still be swept, and runs, records, table and progress lines are told apart by spec."""
    scenario = tmp_path / "tiny-defaults.yaml"
    scenario.write_text(Path(TINY).read_text() + "policy: {defaults: {thunderagent: {idle_ttl_s: 30}}}\n")
    out = tmp_path / "out"
    upstream, dynamo = "thunderagent[variant=upstream]", "thunderagent[variant=dynamo,acting_decay_tau_s=2]"
    result = tasim(
        "compare",
        str(scenario),
        *SHORT,
        "--out",
        str(out),
        "--jobs",
        "2",
        "--policies",
        f"{upstream},{dynamo}",
        "--sweep",
        "policy.params.scheduler_interval_s=2,1",
    )
    assert result.returncode == 0, result.stderr
    entries = json.loads((out / "compare.json").read_text())
    upstream_params, dynamo_params = {"variant": "upstream"}, {"variant": "dynamo", "acting_decay_tau_s": 2}
    assert [(e["policy"], e["spec"], e["params"], e["overrides"]) for e in entries] == [
        ("thunderagent", upstream, {"idle_ttl_s": 30, **upstream_params, "scheduler_interval_s": 1}, {"policy.params.scheduler_interval_s": 1}),
        ("thunderagent", dynamo, {"idle_ttl_s": 30, **dynamo_params, "scheduler_interval_s": 1}, {"policy.params.scheduler_interval_s": 1}),
        ("thunderagent", upstream, {"idle_ttl_s": 30, **upstream_params, "scheduler_interval_s": 2}, {"policy.params.scheduler_interval_s": 2}),
        ("thunderagent", dynamo, {"idle_ttl_s": 30, **dynamo_params, "scheduler_interval_s": 2}, {"policy.params.scheduler_interval_s": 2}),
    ]
    dirs = {"thunderagent-variant=upstream": upstream_params, "thunderagent-variant=dynamo-acting_decay_tau_s=2": dynamo_params}
    assert sorted(path.name for path in (out / "runs").iterdir()) == sorted(
        f"{d}-policy.params.scheduler_interval_s={i}" for d in dirs for i in (1, 2)
    )
    for name, params in dirs.items():
        policy = json.loads((out / "runs" / f"{name}-policy.params.scheduler_interval_s=1" / "run.json").read_text())["scenario"]["policy"]
        assert policy == {"name": "thunderagent", "params": {**params, "scheduler_interval_s": 1}, "defaults": {"thunderagent": {"idle_ttl_s": 30}}}
    rows = [line.split()[:3] for line in result.stdout.splitlines() if line.split()[1:2] in ([upstream], [dynamo])]
    assert rows == [[str(e["overrides"]["policy.params.scheduler_interval_s"]), e["spec"], f"{e['summary']['calls_per_min']:,.1f}"] for e in entries]
    assert sorted(line.split("] ", 1)[1].split(":")[0] for line in result.stderr.splitlines()) == sorted(
        f"{spec}-policy.params.scheduler_interval_s={i}" for spec in (upstream, dynamo) for i in (1, 2)
    )
    assert (out / "throughput.png").read_bytes().startswith(PNG_MAGIC)


LONG = "a" * 300


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--policies", "round_robin,nope"], ["--policies", "unknown policy 'nope'", "allowed:", "round_robin"]),
        (
            ["--policies", "thunderagent[variant]"],
            ["--policies thunderagent[variant]: variant is not key=value (expected name or name[key=value,...])"],
        ),
        (
            ["--policies", "least_loaded,thunderagent[nope=1]"],
            [f"--policies thunderagent[nope=1]: {TINY}: policy: params.nope: unknown parameter of thunderagent (allowed: variant, "],
        ),
        (
            ["--policies", "thunderagent[variant=dynamo"],
            ["--policies thunderagent[variant=dynamo: no closing ']' (expected name or name[key=value,...])"],
        ),
        (
            ["--policies", "thunderagent[variant=dynamo],least_loaded,thunderagent[variant=dynamo]"],
            ["--policies thunderagent[variant=dynamo],least_loaded,thunderagent[variant=dynamo]: thunderagent[variant=dynamo] is given twice"],
        ),
        (
            ["--policies", "thunderagent[variant=dynamo,pause_target=0.99]"],
            [
                f"--policies thunderagent[variant=dynamo,pause_target=0.99]: {TINY}: policy: params: "
                "pause_target (0.99) must be <= pause_threshold (0.95)"
            ],
        ),
        (
            ["--policies", "thunderagent", "--set", "policy.params.variant=dynamo"],
            ["--set policy.params.variant=dynamo: policies and their params come from --policies"],
        ),
        (
            ["--policies", "thunderagent[variant=dynamo],thunderagent", "--sweep", "policy.params.variant=upstream,dynamo"],
            ["--sweep policy.params.variant: would replace what thunderagent[variant=dynamo] sets"],
        ),
        (
            ["--policies", "round_robin", "--sweep", "workload.concurrency=2,4", "--set", "workload.concurrency=3"],
            ["--set workload.concurrency=3: --sweep workload.concurrency sets it in every run"],
        ),
        (["--policies", "round_robin", "--sweep", "seed=1,2", "--seed", "3"], ["--seed 3: --sweep seed sets the seed in every run"]),
        (
            ["--policies", "round_robin", "--sweep", f"description={LONG},b"],
            ["'round_robin-...aaaaaaaaaaaaa': its run directory name would be over 255 bytes"],
        ),
        (["--policies", "round_robin", "--sweep", "workload.nope=1,2"], ["--sweep workload.nope=1", "unknown key", "allowed:", "concurrency"]),
        # the bad value is the last one: nothing may run for the good ones first
        (["--policies", "round_robin", "--sweep", "workload.concurrency=2,-3"], ["--sweep workload.concurrency=-3", "greater than 0"]),
        (["--policies", "round_robin", "--sweep", "workload.concurrency"], ["--sweep", "dotted.key=v1,v2"]),
        (["--policies", "round_robin", "--sweep", "policy.name=round_robin"], ["--sweep policy.name", "--policies"]),
        (["--policies", "round_robin", "--jobs", "0"], ["--jobs", "at least 1"]),
        (["--policies", "round_robin", "--seeds", "0"], ["--seeds", "at least 1"]),
        (["--policies", "round_robin", "--seeds", "101"], ["--seeds 101: expected 1 to 100"]),
        (["--policies", "round_robin,kv_router", "--baseline", "kv_router"], ["--baseline kv_router: ratios with intervals need --seeds N (N > 1)"]),
        (
            ["--policies", "round_robin,kv_router", "--seeds", "2", "--baseline", "nope"],
            ["--baseline nope: not one of --policies (allowed: round_robin, kv_router)"],
        ),
        (["--policies", "round_robin", "--seeds", "2", "--sweep", "seed=1,2"], ["--sweep seed: --seeds already runs every cell at several seeds"]),
    ],
)
def test_bad_input_exits_2_before_running_anything(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    out = tmp_path / "out"
    assert_usage_error(tasim("compare", TINY, *SHORT, "--out", str(out), *args), *fragments)
    assert not (out / "runs").exists()


def test_policies_lists_round_robin() -> None:
    result = tasim("policies")
    assert result.returncode == 0, result.stderr
    assert "round_robin" in result.stdout
    assert "each request to the next worker in turn" in result.stdout


class _Params(BaseModel):
    rate: float = Field(0.5, gt=0, le=1, description="a fraction")
    count: PositiveInt = 3
    mode: Literal["fast", "slow"] = "fast"
    cap: int | None = None
    weights: list[int] = Field(default_factory=lambda: [1, 2])
    enabled: bool = True
    needed: str


def test_param_rows_describe_any_params_model() -> None:
    assert param_rows(_Params) == [
        ("rate", "float (> 0, <= 1)", "0.5", "a fraction"),
        ("count", "int (> 0)", "3", ""),
        ("mode", "'fast' | 'slow'", "'fast'", ""),
        ("cap", "int | None", "None", ""),
        ("weights", "list[int]", "[1, 2]", ""),
        ("enabled", "bool", "True", ""),
        ("needed", "str", "required", ""),
    ]


# --- several seeds ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("seeded")
    result = tasim("compare", TINY, *SHORT, "--out", str(out), "--policies", "round_robin,kv_router", "--seeds", "3", "--seed", "4")
    assert result.returncode == 0, result.stderr
    return out, json.loads((out / "compare.json").read_text()), result.stdout


def test_seeds_pair_every_policy_over_the_same_seeds(seeded: tuple[Path, dict[str, Any], str]) -> None:
    out, data, _ = seeded
    assert data["seeds"] == [4, 5, 6] and data["baseline"] == "round_robin" and data["interval"] == "Student t, 95 %"
    assert [(r["spec"], r["seed"]) for r in data["runs"]] == [(spec, seed) for spec in ("round_robin", "kv_router") for seed in (4, 5, 6)]
    for record in data["runs"]:
        run_dir = out / "runs" / f"{record['spec']}-seed{record['seed']}"
        assert record["summary"] == json.loads((run_dir / "summary.json").read_text())
        assert json.loads((run_dir / "run.json").read_text())["scenario"]["seed"] == record["seed"]


def test_a_seeded_run_is_the_plain_run_at_that_seed(tmp_path: Path, seeded: tuple[Path, dict[str, Any], str]) -> None:
    out, data, _ = seeded
    plain = compare(tmp_path, "--policies", "kv_router", "--seed", "5")
    seeded_run = next(r for r in data["runs"] if r["spec"] == "kv_router" and r["seed"] == 5)
    assert without_wall_time([{"summary": seeded_run["summary"]}]) == without_wall_time([{"summary": plain[0]["summary"]}])
    assert (out / "runs" / "kv_router-seed5" / "events.jsonl").read_bytes() == (tmp_path / "runs" / "kv_router" / "events.jsonl").read_bytes()


def test_cells_hold_per_seed_values_their_t_interval_and_the_paired_ratio(seeded: tuple[Path, dict[str, Any], str]) -> None:
    from tasim.results.stats import t_quantile

    _, data, stdout = seeded
    by_spec = {(r["spec"], r["seed"]): r["summary"] for r in data["runs"]}
    baseline, other = data["cells"]
    assert "ratio_to_baseline" not in baseline
    for cell in (baseline, other):
        metric = cell["metrics"]["calls_per_min"]
        values = [by_spec[(cell["spec"], seed)]["calls_per_min"] for seed in (4, 5, 6)]
        assert metric["values"] == values
        mean = sum(values) / 3
        sd = (sum((v - mean) ** 2 for v in values) / 2) ** 0.5
        half = t_quantile(0.975, 2) * sd / 3**0.5
        assert metric["mean"] == pytest.approx(mean) and metric["high"] - metric["low"] == pytest.approx(2 * half)
    ratio = other["ratio_to_baseline"]
    expected = [by_spec[("kv_router", s)]["calls_per_min"] / by_spec[("round_robin", s)]["calls_per_min"] for s in (4, 5, 6)]
    assert ratio["values"] == pytest.approx(expected)
    assert ratio["significant"] == (not ratio["low"] <= 1.0 <= ratio["high"])
    row = next(line for line in stdout.splitlines() if line.split()[:1] == ["kv_router"])
    assert f"{ratio['mean']:.3f}× [{ratio['low']:.3f}, {ratio['high']:.3f}]" in row
    assert row.rstrip().endswith("n.s.") == (not ratio["significant"])
    assert "3 paired seeds (4-6)" in stdout


# nothing left to chance: every seed gives the same run
FIXED = tuple(f"--set=workload.{key}" for key in ("task_prompt_tokens=500", "turns=3", "output_tokens=100", "tool_latency_s=1"))
NO_SPREAD = "the seeds did not change it: no interval"


@pytest.fixture(scope="module")
def unchanged(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("unchanged")
    specs = ("--policies", "thunderagent,thunderagent[variant=dynamo]", "--baseline", "thunderagent[variant=dynamo]")
    result = tasim("compare", TINY, *SHORT, *FIXED, "--out", str(out), *specs, "--seeds", "2")
    assert result.returncode == 0, result.stderr
    return json.loads((out / "compare.json").read_text()), result.stdout


def test_seeds_that_change_nothing_give_no_interval_and_no_verdict(unchanged: tuple[dict[str, Any], str]) -> None:
    data, stdout = unchanged
    calls = {(r["spec"], r["seed"]): r["summary"]["calls_per_min"] for r in data["runs"]}
    value, baseline = calls[("thunderagent", 1)], calls[("thunderagent[variant=dynamo]", 1)]
    assert (calls[("thunderagent", 2)], calls[("thunderagent[variant=dynamo]", 2)]) == (value, baseline)
    other = data["cells"][0]
    assert other["metrics"]["calls_per_min"] == {"mean": value, "low": None, "high": None, "no_interval": NO_SPREAD, "values": [value, value]}
    ratio = value / baseline
    point = {"mean": ratio, "low": None, "high": None, "no_interval": NO_SPREAD, "values": [ratio, ratio]}
    assert other["ratio_to_baseline"] == {**point, "significant": None}
    row = next(line for line in stdout.splitlines() if line.split()[:1] == ["thunderagent"])
    assert row.split()[1] == f"{value:.1f}" and row.split()[-3:] == [f"{ratio:.3f}×", "(no", "spread)"] and "±" not in row
    caption = "the seeds did not change the run: every seed gave the same numbers, so there are no intervals and no significance verdicts"
    assert caption in " ".join(stdout.split())


def test_the_ratio_column_names_the_baseline(unchanged: tuple[dict[str, Any], str]) -> None:
    _, stdout = unchanged
    header = next(line for line in stdout.splitlines() if line.split()[:1] == ["policy"])
    assert header.split()[-2:] == ["vs", "thunderagent[variant=dynamo]"]  # not the first spec's name


def test_seeded_comparison_plots_throughput_with_intervals(seeded: tuple[Path, dict[str, Any], str]) -> None:
    out, _, _ = seeded
    for name in ("throughput.png", "kv_utilization.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000, name
