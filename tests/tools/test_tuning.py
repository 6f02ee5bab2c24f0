"""`tasim tune`: a seeded TPE search over paired seeds, stored in SQLite and resumed, its report
(default, best, paired ratio, importances) and the tuned scenario file; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY, assert_usage_error, tasim

from tasim.config.scenario import load_scenario

pytest.importorskip("optuna")

SPACE = ("--space", "policy.params.overlap_score_credit=0:2", "--space", "policy.params.router_temperature=0|0.5")
ARGS = ("--policy", "kv_router", *SPACE, "--objective", "prefix_hit_rate:max", "--set", "duration_s=40", "--seeds", "2", "--jobs", "2")


def tune(out: Path, *extra: str) -> tuple[dict[str, Any], str, str]:
    result = tasim("tune", TINY, *ARGS, "--out", str(out), *extra)
    assert result.returncode == 0, result.stderr
    return json.loads((out / "tune.json").read_text()), result.stdout, result.stderr


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("tune")
    record, stdout, _ = tune(out, "--trials", "4")
    return out, record, stdout


def test_the_report_holds_default_best_ratio_and_importances(tuned: tuple[Path, dict[str, Any], str]) -> None:
    out, record, stdout = tuned
    assert record["trials"] == 4 and record["seeds"] == [1, 2] and record["interval"] == "Student t, 95 %"
    assert record["objective"] == {"metric": "prefix_hit_rate", "direction": "max"}
    assert record["storage"] == f"sqlite:///{(out / 'study.db').resolve()}" and (out / "study.db").stat().st_size > 0
    best, default = record["best"], record["default"]
    assert set(best["params"]) == {"policy.params.overlap_score_credit", "policy.params.router_temperature"}
    assert best["low"] <= best["mean"] <= best["high"] and default["low"] <= default["mean"] <= default["high"]
    assert best["mean"] >= default["mean"] or record["best_over_default"]["mean"] < 1
    assert set(record["importances"]) == set(best["params"])
    assert "best / default (paired by seed)" in stdout


def test_the_tuned_scenario_file_loads_with_the_best_configuration(tuned: tuple[Path, dict[str, Any], str]) -> None:
    out, record, _ = tuned
    scenario = load_scenario(out / "tiny-tuned.yaml")
    assert scenario.name == "tiny-tuned" and scenario.policy.name == "kv_router"
    params = scenario.policy.effective_params
    if record["tuned_file_keeps_default"]:  # no trial beat the scenario's own values
        assert "overlap_score_credit" not in params and record["best"]["mean"] <= record["default"]["mean"]
    else:
        assert params["overlap_score_credit"] == pytest.approx(record["best"]["params"]["policy.params.overlap_score_credit"])
        assert params["router_temperature"] == float(record["best"]["params"]["policy.params.router_temperature"])
    assert scenario.duration_s == 40


def test_the_scenarios_own_values_are_the_first_trial(tuned: tuple[Path, dict[str, Any], str]) -> None:
    import optuna

    out, record, _ = tuned
    study = optuna.load_study(study_name=record["study"], storage=record["storage"])
    first = study.trials[0]
    assert first.params == {"policy.params.overlap_score_credit": 1.0, "policy.params.router_temperature": "0"}
    assert first.user_attrs["objective"] == study.user_attrs["default"]["objective"]  # the same runs, the same numbers


def test_a_rerun_resumes_the_study_up_to_the_new_trial_count(tmp_path: Path, tuned: tuple[Path, dict[str, Any], str]) -> None:
    out, first, _ = tuned
    copy = tmp_path / "again"
    copy.mkdir()
    (copy / "study.db").write_bytes((out / "study.db").read_bytes())
    record, _, stderr = tune(copy, "--trials", "6")
    assert record["trials"] == 6 and record["study"] == first["study"]
    # the default and the first four trials are not run again: two configurations, no more
    assert [line for line in stderr.splitlines() if line.startswith("tune:")] == [
        "tune: 1 configurations evaluated",
        "tune: 2 configurations evaluated",
    ]
    assert record["default"] == first["default"]


def test_the_same_question_gives_the_same_answer(tmp_path: Path, tuned: tuple[Path, dict[str, Any], str]) -> None:
    _, first, _ = tuned
    record, _, _ = tune(tmp_path, "--trials", "4")
    assert record["best"] == first["best"] and record["default"] == first["default"]


def test_a_constraint_no_trial_meets_is_reported(tmp_path: Path) -> None:
    record, stdout, _ = tune(tmp_path, "--trials", "2", "--constraint", "ttft_s.mean<=0")
    assert record["best"] is None and record["constraints"] == ["ttft_s.mean<=0"]
    assert "no trial met the constraints" in stdout


# a field only live mode reads: every trial is the default's simulation, so none beats it
UNCHANGED = ("--policy", "round_robin", "--space", "live.max_retries=0:3", "--objective", "ttft_s.mean:min", "--set=duration_s=40", "--trials", "2")


def test_one_seed_gives_no_interval_and_no_verdict(tmp_path: Path) -> None:
    result = tasim("tune", TINY, *UNCHANGED, "--seeds", "1", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "tune.json").read_text())
    mean = record["default"]["mean"]
    point = {"mean": mean, "low": None, "high": None, "no_interval": "1 seed: no interval"}
    assert record["default"] == point and record["best"] == {"params": {"live.max_retries": 3}, **point}
    assert record["best_over_default"] == {"mean": 1.0, "low": None, "high": None, "no_interval": "1 seed: no interval", "significant": None}
    assert record["tuned_file_keeps_default"] is True
    shown = " ".join(result.stdout.split())  # the console wraps at 80 columns
    assert (
        f"default: {mean:.4g} (1 seed: no interval) "
        "best: no trial beats the scenario's own values: the tuned file keeps them "
        f"closest: {mean:.4g} (1 seed: no interval) with live.max_retries=3 "
        "closest / default (paired by seed): 1.000× (1 seed: no interval) "
    ) in shown
    assert "intervals: none with 1 seed (--seeds N, N > 1, gives Student t, 95 % intervals)" in shown
    assert "significant" not in shown and "[" not in shown.split("seeds [1]")[1].split("wrote")[0]


def test_a_ratio_the_seeds_do_not_change_has_no_verdict(tmp_path: Path) -> None:
    result = tasim("tune", TINY, *UNCHANGED, "--seeds", "2", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "tune.json").read_text())
    default = record["default"]
    assert default["low"] < default["mean"] < default["high"] and default["no_interval"] is None  # the seeds change the runs
    no_spread = "the seeds did not change it: no interval"
    assert record["best_over_default"] == {"mean": 1.0, "low": None, "high": None, "no_interval": no_spread, "significant": None}
    shown = " ".join(result.stdout.split())
    assert f"closest / default (paired by seed): 1.000× ({no_spread})" in shown and "significant" not in shown


def test_a_range_follows_the_fields_declared_type_not_its_bounds(tmp_path: Path) -> None:
    import optuna

    from tasim.tools import tuning

    space = tuning.parse_space(["policy.params.scheduler_interval_s=1:20:log", "workload.concurrency=8:64", "workload.output_tokens.median=50:200"])
    objective = tuning.parse_objective("calls_per_min")
    # tiny's own policy is round_robin: the float knob is typed by thunderagent's params model
    request = tuning.check(tuning.Request(TINY, "thunderagent", space, objective, (), 1, (1,), (), 0, "sqlite://", tmp_path))
    trial = optuna.create_study().ask()
    for dimension in request.space:
        dimension.suggest(trial)
    assert trial.distributions == {
        "policy.params.scheduler_interval_s": optuna.distributions.FloatDistribution(1.0, 20.0, log=True),
        "workload.concurrency": optuna.distributions.IntDistribution(8, 64),
        "workload.output_tokens.median": optuna.distributions.FloatDistribution(50.0, 200.0),
    }


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--space", "policy.params.nope=0:1"], "--space policy.params.nope=0:1:"),
        (["--space", "workload.concurrency=4:4"], "--space workload.concurrency=4:4: an empty range (LOW must be below HIGH)"),
        (["--space", "workload.concurrency=a:b"], "--space workload.concurrency=a:b: 'a' is not a number"),
        (["--space", "seed=1:3"], "--space seed: the policy comes from --policy and seeds from --seeds"),
        (["--space", "cluster.gpu=1:2"], "--space cluster.gpu=1:2: cluster.gpu holds str, not a number (a range needs an int or float; give choices"),
        (["--space", "workload.concurrency=8.5:64"], "--space workload.concurrency=8.5:64: workload.concurrency is an integer; give integer bounds"),
        (["--space", "policy.params.router_temperature=0|0"], "needs two or more distinct, non-empty choices"),
        (["--objective", "throughput"], "--objective throughput: not a summary metric (allowed: "),
        (["--objective", "calls_per_min:up"], "--objective calls_per_min:up: the direction is max or min"),
        (["--constraint", "ttft_s.mean<0.5"], "--constraint ttft_s.mean<0.5: expected METRIC<=X or METRIC>=X"),
        (["--objective", "calls_per_min", "--ray", "127.0.0.1:1"], "--ray 127.0.0.1:1: no Ray cluster answers there"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], fragment: str) -> None:
    base = ["--policy", "kv_router", "--set", "duration_s=40", "--trials", "1", "--out", str(tmp_path)]
    if "--space" not in args:
        base += ["--space", "policy.params.overlap_score_credit=0:2"]
    if "--objective" not in args:
        base += ["--objective", "calls_per_min"]
    assert_usage_error(tasim("tune", TINY, *base, *args), fragment)
    assert not (tmp_path / "study.db").exists()
