"""The command line: determinism, report round-trip, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TINY, assert_usage_error, tasim


def test_same_seed_gives_byte_identical_events(tmp_path: Path) -> None:
    for name in ("a", "b"):
        assert tasim("simulate", TINY, "--seed", "7", "--out", str(tmp_path / name), "--quiet").returncode == 0
    first = (tmp_path / "a" / "events.jsonl").read_bytes()
    assert first == (tmp_path / "b" / "events.jsonl").read_bytes()
    assert len(first.splitlines()) > 500
    other = tmp_path / "c"
    assert tasim("simulate", TINY, "--seed", "8", "--out", str(other), "--quiet").returncode == 0
    assert (other / "events.jsonl").read_bytes() != first


def test_gzip_log_is_deterministic_and_reportable(tmp_path: Path) -> None:
    for name in ("a", "b"):
        assert tasim("simulate", TINY, "--seed", "7", "--gzip", "--out", str(tmp_path / name), "--quiet").returncode == 0
    assert (tmp_path / "a" / "events.jsonl.gz").read_bytes() == (tmp_path / "b" / "events.jsonl.gz").read_bytes()
    result = tasim("report", str(tmp_path / "a"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads((tmp_path / "a" / "summary.json").read_text())


def test_report_reproduces_summary_exactly(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = tasim("simulate", TINY, "--seed", "7", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "calls_per_min" in result.stdout  # the summary table
    summary = json.loads((out / "summary.json").read_text())
    report = tasim("report", str(out), "--json")
    assert report.returncode == 0, report.stderr
    assert report.stdout == json.dumps(summary, indent=2) + "\n"
    for key in (
        "policy",
        "requests_completed",
        "programs_completed",
        "calls_per_min",
        "output_tokens_per_s",
        "prefix_hit_rate",
        "ttft_s",
        "tpot_s",
        "e2e_s",
        "recomputed_tokens",
        "preemptions",
        "pauses",
        "resumes",
        "sim_time_s",
        "wall_time_s",
    ):
        assert key in summary
    assert summary["policy"] == "round_robin"
    assert summary["requests_completed"] > 50
    assert set(summary["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    assert summary["sim_time_s"] == 120


def test_set_and_policy_overrides(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = tasim(
        "simulate", TINY, "--policy", "round_robin", "--set", "workload.concurrency=2", "--set", "duration_s=60", "--out", str(out), "--quiet"
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sim_time_s"] == 60
    run = json.loads((out / "run.json").read_text())
    assert run["scenario"]["workload"]["concurrency"] == 2


def test_schema_is_json() -> None:
    result = tasim("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert {"cluster", "workload", "policy", "metrics", "seed", "duration_s"} <= set(schema["properties"])


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("workload: {concurrency: 4, bogus: 1}\n", ["workload.bogus", "unknown key", "allowed:", "concurrency"]),
        ("workload: {concurrency: many}\n", ["workload.concurrency", "integer", "'many'"]),
        ("workload: {concurrency: -3}\n", ["workload.concurrency", "greater than 0", "-3"]),
        ("cluster: {engine: {kv_blocks: -1}}\n", ["cluster.engine.kv_blocks"]),
        ("cluster: {gpu: TPUv9}\n", ["cluster.gpu", "unknown GPU", "H100"]),
        ("workload: {turns: {kind: zipf, a: 2}}\n", ["workload.turns", "lognormal"]),
        ("workload: {turns: {kind: uniform, low: 5, high: 2}}\n", ["workload.turns", "high"]),
        ("policy: {name: nope}\n", ["policy", "unknown policy", "round_robin"]),
        ("policy: {name: round_robin, params: {x: 1}}\n", ["policy", "params.x"]),
        ("policy: {defaults: {kv_routr: {}}}\n", ["policy: defaults.kv_routr: unknown policy", "kv_router"]),
        (
            "policy: {defaults: {kv_router: {router_temperature: -1}}}\n",
            ["policy: defaults.kv_router.router_temperature", "greater than or equal to 0", "-1"],
        ),
        ("policy: {defaults: {random: {ttl: 5}}}\n", ["defaults.random.ttl: unknown parameter of random", "allowed: session_affinity_ttl_s"]),
        ("policy: {defaults: {random: 3}}\n", ["policy.defaults.random", "dictionary"]),
        ("duration_s: 10\nmetrics: {warmup_s: 20}\n", ["warmup_s"]),
        ("workload: [1, 2\n", ["YAML syntax error", ":2:"]),
        ("policy: {name: round_robin}\nseed: 1\npolicy: {name: kv_router}\n", [":3:1: duplicate key 'policy' (first on line 1)"]),
        ("cluster: {backends: 2, backends: 3}\n", [":1:24: duplicate key 'backends' (first on line 1)"]),
        ("- just\n- a list\n", ["top level must be a mapping"]),
    ],
)
def test_bad_scenario_files_exit_2_with_one_line(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = _write(tmp_path, text)
    assert_usage_error(tasim("simulate", path, "--out", str(tmp_path / "out")), path, *fragments)
    assert not (tmp_path / "out" / "summary.json").exists()


def test_missing_file_and_bad_flags(tmp_path: Path) -> None:
    assert_usage_error(tasim("simulate", str(tmp_path / "nope.yaml")), "nope.yaml", "file not found")
    assert_usage_error(tasim("simulate", TINY, "--seed", "abc"), "--seed", "invalid int value")
    assert_usage_error(tasim("simulate", TINY, "--set", "workload.nope=3"), "workload.nope", "unknown key")
    assert_usage_error(tasim("simulate", TINY, "--set", "novalue"), "novalue", "dotted.key=value")
    assert_usage_error(tasim("simulate", TINY, "--policy", "magic"), "unknown policy", "round_robin")
    assert_usage_error(tasim("bogus-command"), "invalid choice", "simulate")
    assert_usage_error(tasim("report", str(tmp_path)), "no events.jsonl")


def test_a_preset_name_stands_for_its_file(tmp_path: Path) -> None:
    """Outside the checkout, simulate and compare take a preset's name; a file of that name wins."""
    out = tmp_path / "out"
    result = tasim("simulate", "mooncake-synthetic", "--set", "workload.max_requests=30", "--out", str(out), "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "run.json").read_text())["scenario"]["name"] == "mooncake-synthetic"
    compared = tmp_path / "compared"
    args = ("--policies", "round_robin", "--set", "workload.max_requests=30", "--out", str(compared))
    result = tasim("compare", "mooncake-synthetic.yaml", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (compared / "compare.json").is_file()
    (tmp_path / "mooncake-synthetic.yaml").write_text(Path(TINY).read_text())
    result = tasim("simulate", "mooncake-synthetic.yaml", "--out", str(out), "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "run.json").read_text())["scenario"]["name"] == "tiny"
    for command in (["simulate"], ["compare", "--policies", "round_robin"], ["validate", "dynamo"], ["live"]):
        result = tasim(*command, "no-such-preset", cwd=tmp_path)
        assert_usage_error(result, "no-such-preset: file not found, nor a preset name", "`python -m tasim scenarios` lists the presets")


def test_failed_run_keeps_earlier_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert tasim("simulate", TINY, "--out", str(out), "--quiet").returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = _write(tmp_path, "workload: {concurrency: 0}\n")
    assert tasim("simulate", bad, "--out", str(out)).returncode == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_corrupt_event_log_is_reported_with_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert tasim("simulate", TINY, "--out", str(out), "--quiet", "--set", "duration_s=20").returncode == 0
    events = out / "events.jsonl"
    lines = events.read_text().splitlines()
    lines[3] = '{"type": "no_such_event", "t": 1.0}'
    events.write_text("\n".join(lines) + "\n")
    assert_usage_error(tasim("report", str(out)), "events.jsonl:4", "unknown event type")


def test_out_below_a_file_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "somefile"
    blocker.write_text("kept\n")
    result = tasim("simulate", TINY, "--out", str(blocker / "sub"), "--quiet")
    assert_usage_error(result, f"--out {blocker / 'sub'}: {blocker} exists and is not a directory")
    assert blocker.read_text() == "kept\n"


def test_set_policy_params_reach_the_policy_given_by_policy(tmp_path: Path) -> None:
    """--policy replaces the scenario's params; a --set policy.params.X lands on top, and the
    spec form gives the same run."""
    short = ("--set", "duration_s=20", "--quiet")
    by_set, by_spec = tmp_path / "set", tmp_path / "spec"
    result = tasim("simulate", TINY, "--policy", "thunderagent", "--set", "policy.params.variant=dynamo", *short, "--out", str(by_set))
    assert result.returncode == 0, result.stderr
    assert json.loads((by_set / "run.json").read_text())["scenario"]["policy"] == {
        "name": "thunderagent",
        "params": {"variant": "dynamo"},
        "defaults": {},
    }
    result = tasim("simulate", TINY, "--policy", "thunderagent[variant=dynamo]", *short, "--out", str(by_spec))
    assert result.returncode == 0, result.stderr
    assert (by_spec / "events.jsonl").read_bytes() == (by_set / "events.jsonl").read_bytes()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["simulate", TINY, "--policy", "thunderagent", "--set", "policy.name=kv_router"],
            "error: --set policy.name=kv_router: would replace what --policy thunderagent sets",
        ),
        (
            ["simulate", TINY, "--policy", "thunderagent[variant=dynamo]", "--set", "policy.params.variant=upstream"],
            "error: --set policy.params.variant=upstream: would replace what --policy thunderagent[variant=dynamo] sets",
        ),
        (
            ["simulate", TINY, "--policy", "thunderagent[variant=dynamo]", "--set", "policy.defaults.thunderagent.variant=upstream"],
            "error: --set policy.defaults.thunderagent.variant=upstream: would do nothing: --policy thunderagent[variant=dynamo] sets variant itself",
        ),
        (["simulate", TINY, "--seed", "3", "--set", "seed=4"], "error: --set seed=4: --seed 3 sets seed too (give one of them)"),
        (
            ["simulate", TINY, "--policy", "thunderagent[variant]"],
            "error: --policy thunderagent[variant]: variant is not key=value (expected name or name[key=value,...])",
        ),
        (
            ["live", TINY, "--policy", "thunderagent", "--set", "policy.name=kv_router"],
            "error: --set policy.name=kv_router: would replace what --policy thunderagent sets",
        ),
        (
            ["live", TINY, "--programs", "3", "--set", "workload.programs=4"],
            "error: --set workload.programs=4: --programs 3 sets workload.programs too (give one of them)",
        ),
        # validate dynamo runs each router with Dynamo's defaults and the mocker's models
        (
            ["validate", "dynamo", TINY, "--set", "policy.params.variant=dynamo"],
            "error: --set policy.params.variant=dynamo: validate dynamo sets policy itself (each router in --routers runs with Dynamo's defaults)",
        ),
        (
            ["validate", "dynamo", TINY, "--set", "cluster.perf.model=roofline"],
            "error: --set cluster.perf.model=roofline: validate dynamo sets cluster.perf.model to dynamo_polynomial itself (the mocker's step times)",
        ),
        (
            ["validate", "dynamo", TINY, "--set", "cluster.engine.host_tier.semantics=vllm"],
            "error: --set cluster.engine.host_tier.semantics=vllm: validate dynamo sets cluster.engine.host_tier.semantics to "
            "dynamo_mocker itself (Dynamo's replay runs the mocker's host tier)",
        ),
    ],
)
def test_an_override_that_would_be_lost_is_refused(tmp_path: Path, args: list[str], line: str) -> None:
    out = tmp_path / "out"
    result = tasim(*args, "--out", str(out))
    assert_usage_error(result, line)
    assert result.stderr.strip() == line
    assert not out.exists()


# What simulate and report must never load: every command module is imported to build the parser,
# so a heavy import at the top of one (rather than in its handler) would slow every command.
_HEAVY = "matplotlib optuna torch dynamo verl ray tasim.tools.comparison tasim.tools.tuning tasim.tools.parallel tasim.tools.plots tasim.live.run"
_LOADED_HEAVY = f"""
import sys
from tasim.cli import main
assert main(sys.argv[1:]) == 0
print(sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in {_HEAVY.split()!r})))
"""


@pytest.mark.parametrize("command", ["simulate", "report"])
def test_simulate_and_report_import_no_pool_plotting_optuna_or_live_stack(tmp_path: Path, command: str) -> None:
    out = tmp_path / "run"
    assert tasim("simulate", TINY, "--quiet", "--out", str(out)).returncode == 0
    args = ["simulate", TINY, "--quiet", "--out", str(tmp_path / "again")] if command == "simulate" else ["report", str(out), "--json"]
    result = subprocess.run([sys.executable, "-c", _LOADED_HEAVY, *args], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"


def test_a_write_policy_without_sglang_semantics_is_refused_in_one_line(tmp_path: Path) -> None:
    result = tasim("simulate", TINY, "--set", "cluster.engine.host_tier.blocks=64", "--set", "cluster.engine.host_tier.write_policy=write_back")
    assert_usage_error(result, "write_policy is SGLang HiCache's: set semantics: sglang, or leave it unset")


# The swe-agent scenario with SGLang's host tier (write-through, twice the GPU pool), on a GPU pool
# small enough for the host to be hit within 300 s (the default pool holds the whole working set).
_SGLANG_TIER = [
    "--set", "cluster.engine.host_tier.semantics=sglang",
    "--set", "cluster.engine.host_tier.ratio=2",
    "--set", "cluster.engine.kv_blocks=6000",
    "--set", "duration_s=300",
    "--set", "metrics.warmup_s=60",
]  # fmt: skip


@pytest.mark.slow
def test_swe_agent_with_an_sglang_host_tier_hits_the_host_and_is_deterministic(tmp_path: Path) -> None:
    logs = []
    for run in ("first", "second"):
        result = tasim("simulate", "swe-agent", *_SGLANG_TIER, "--check", "--quiet", "--out", str(tmp_path / run))
        assert result.returncode == 0, result.stderr
        logs.append((tmp_path / run / "events.jsonl").read_bytes())
    tier = json.loads((tmp_path / "first" / "summary.json").read_text())["host_tier"]
    assert tier["host_hit_tokens"] > 0 and tier["stored_tokens"] > 0 and tier["h2d_busy_s"] > 0
    assert logs[0] == logs[1]
