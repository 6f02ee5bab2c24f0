"""``tasim calibrate``: the fit space, the loss, and a small calibration end to end on the tiny
scenario against a made-up source (tests/data/published-tiny.yaml)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from conftest import TEST_DATA, TINY, assert_usage_error, tasim

from tasim.config.scenario import load_scenario
from tasim.tools.search import Dimension, own_values
from tasim.validation.calibration import CalibrationError
from tasim.validation.calibration.fit import MISSING_PENALTY, loss
from tasim.validation.calibration.outcome import interval
from tasim.validation.calibration.space import parse_space
from tasim.validation.published.evaluate import PointResult
from tasim.validation.published.measurement_file import load_measurements

PUBLISHED = str(TEST_DATA / "published-tiny.yaml")


def test_knobs_parse_and_take_the_field_type_from_the_scenario() -> None:
    scenario = load_scenario(TINY)
    knobs = parse_space(["cluster.perf.mfu=0.1:0.9", "cluster.engine.kv_blocks=500:4000,workload.observation_tokens=100:2000:log"], scenario)
    assert knobs == (
        Dimension("cluster.perf.mfu", 0.1, 0.9, integer=False),
        Dimension("cluster.engine.kv_blocks", 500, 4000, integer=True),
        Dimension("workload.observation_tokens", 100, 2000, integer=False, log=True),  # a fixed distribution: its value
    )
    assert [k.override(v) for k, v in zip(knobs, (0.25, 1234.0, 400.0))] == [
        "cluster.perf.mfu=0.25",
        "cluster.engine.kv_blocks=1234",
        "workload.observation_tokens=400.0",
    ]
    assert own_values(scenario, knobs) == {"cluster.perf.mfu": 0.5, "cluster.engine.kv_blocks": 2000, "workload.observation_tokens": 400.0}
    assert own_values(scenario, (Dimension("cluster.perf.mfu", 0.6, 0.9),)) is None  # 0.5 lies outside


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["cluster.perf.mfu"], "--fit cluster.perf.mfu: expected key=LOW:HIGH[:log] or key=A|B|C"),
        (["cluster.perf.mfu=0.9:0.1"], "--fit cluster.perf.mfu=0.9:0.1: an empty range (LOW must be below HIGH)"),
        (["cluster.perf.mfu=a:1"], "'a' is not a number"),
        (["cluster.perf.mfu=inf:1"], "'inf' is not finite"),
        (["cluster.perf.mfu=0.1|0.2"], "--fit cluster.perf.mfu=0.1|0.2: a calibration fits numbers (key=LOW:HIGH), not choices"),
        (["cluster.perf=0:1,cluster.perf.mfu=0.1:0.2"], "--fit cluster.perf: cluster.perf.mfu lies inside it"),
        (["cluster.perf.mfu=0:1:log"], "a log scale needs LOW > 0"),
        (["cluster.perf.mfu=0.1:0.2:lin"], "expected LOW:HIGH or LOW:HIGH:log"),
        (["cluster.perf.mfu=0.1:0.2,cluster.perf.mfu=0.3:0.4"], "--fit cluster.perf.mfu: given twice"),
        (["workload.turns=1:5"], "--fit workload.turns: not a number in tiny (it holds dict"),
        (["cluster.engine.kv_blocks=500.5:900"], "cluster.engine.kv_blocks is an integer; give integer bounds"),
        (["cluster.nothing=1:2"], "not a number in tiny (it holds nothing)"),
        ([], "--fit: name at least one"),
    ],
)
def test_bad_fit_specs_are_one_line(texts: list[str], message: str) -> None:
    with pytest.raises(CalibrationError, match=re.escape(message)):
        parse_space(texts, load_scenario(TINY))


def test_loss_is_the_mean_squared_log_ratio_and_penalises_missing_values() -> None:
    m = load_measurements(PUBLISHED)
    two, four = m.points[0], m.points[1]  # published 50 and 80
    results = [PointResult(m, two, 100.0), PointResult(m, four, 40.0)]
    assert loss(results) == pytest.approx((math.log(2) ** 2 + math.log(0.5) ** 2) / 2)
    assert loss([PointResult(m, two, None, "no rollout step completed")]) == MISSING_PENALTY


def test_interval_is_the_student_t_95_percent_half_width() -> None:
    mean, half = interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert interval([5.0]) == (5.0, None)


def test_calibration_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "cal"
    args = [
        "calibrate",
        TINY,
        "--against",
        PUBLISHED,
        "--fit",
        "cluster.perf.mfu=0.1:0.9,cluster.perf.step_overhead_ms=1:20",
        "--points",
        "sticky-steps-2,sticky-steps-6",
        "--trials",
        "6",
        "--seeds",
        "2",
        "--out",
        str(out),
        "--jobs",
        "2",
    ]
    result = tasim(*args)
    assert result.returncode == 0, result.stderr
    assert "held out: 4 points" in result.stdout and "leave-one-out: 2 fitted points" in result.stdout
    record = json.loads((out / "calibration.json").read_text())
    assert [p["id"] for p in record["points"] if p["fitted"]] == ["sticky-steps-2", "sticky-steps-6"]
    assert len(record["points"]) == 6 and record["seeds"] == [1, 2]
    fitted = record["fitted_values"]
    assert 0.1 <= fitted["cluster.perf.mfu"] <= 0.9 and 1 <= fitted["cluster.perf.step_overhead_ms"] <= 20
    for point in record["points"]:
        assert len(point["after"]) == 2
        assert (point["leave_one_out"] is not None) == point["fitted"]
    calibrated = out / "tiny-calibrated.yaml"
    text = calibrated.read_text()
    assert text.startswith("# Calibrated from tiny.yaml by `python -m tasim calibrate ")
    assert "Fitted to 2 points of published-tiny.yaml" in text and "sticky-steps-4: published 80.0, error" in text
    raw = yaml.safe_load(text)
    assert raw["name"] == "tiny-calibrated"
    assert raw["cluster"]["perf"] == {"mfu": fitted["cluster.perf.mfu"], "step_overhead_ms": fitted["cluster.perf.step_overhead_ms"]}
    assert load_scenario(calibrated).cluster.perf.mfu == fitted["cluster.perf.mfu"]  # a valid scenario
    from lab.calibration_doc import markdown

    section = markdown([out / "calibration.json"])
    assert "Fitted to 2 of 6 points (6 trials" in section
    assert "| sticky-steps-4 | held out | 80.0 |" in section and "| sticky-steps-2 | fitted | 50.0 |" in section
    assert "| aware-over-sticky-4 | held out | 1.20× |" in section  # a ratio is shown as one, not in its metric's units
    assert "aware-over-sticky-4: published 1.20×, error" in text
    # a record made before the file changed a point's metric says so under its table
    assert "This record measured" not in section
    first = record["points"][0]
    now = first["metric"]
    first["metric"] = "prefix_hit_pct" if now != "prefix_hit_pct" else "calls_per_min"
    (tmp_path / "older.json").write_text(json.dumps(record))
    older = markdown([tmp_path / "older.json"])
    assert f"This record measured {first['id']} as `{first['metric']}`; the file now holds them to `{now}`." in older
    # the same request gives the same fit, whatever the number of processes
    again = tasim(*args[:-2], "--jobs", "1", "--out", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "again" / "calibration.json").read_text())["fitted_values"] == fitted


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--points", "nope"], ("--points nope: no such point",)),
        (
            ["--points", "sticky-steps-2,sticky-steps-4,sticky-steps-6,aware-hit-4,aware-over-sticky-4,sticky-6-over-2"],
            ("every point of the set-up is fitted",),
        ),
        (
            ["--points", "sticky-steps-2", "--fit", "workload.concurrency=2:6"],
            ("--fit workload.concurrency: point sticky-steps-2 sets workload.concurrency itself",),
        ),
        (["--points", "sticky-steps-2", "--fit", "cluster.perf.mfu=2:1"], ("an empty range (LOW must be below HIGH)",)),
    ],
)
def test_calibrate_refuses_bad_requests_in_one_line(tmp_path: Path, extra: list[str], fragments: tuple[str, ...]) -> None:
    base = ["calibrate", TINY, "--against", PUBLISHED, "--trials", "2", "--out", str(tmp_path / "cal")]
    if "--fit" not in extra:
        base += ["--fit", "cluster.perf.mfu=0.1:0.9"]
    assert_usage_error(tasim(*base, *extra), *fragments)


def test_a_trial_the_scenario_cannot_hold_fails_alone_and_only_an_all_invalid_search_stops() -> None:
    from tasim.validation.calibration.fit import Problem, search

    # Llama-3.1-8B's 15 GiB of weights on an 80 GiB H100: below utilisation 0.19 nothing is left for KV
    scenario = load_scenario(TINY)
    problem = Problem(scenario, load_measurements(PUBLISHED), ("cluster.engine.kv_blocks=auto",))
    knobs = parse_space(["cluster.engine.gpu_memory_utilization=0.02:0.4"], scenario)
    found = search(problem, knobs, ["sticky-steps-2"], trials=8, fit_seed=0, jobs=1)
    assert found.trials == 8 and 1 <= found.invalid < 8
    assert found.values["cluster.engine.gpu_memory_utilization"] > 0.19
    hopeless = parse_space(["cluster.engine.gpu_memory_utilization=0.02:0.1"], scenario)
    with pytest.raises(CalibrationError, match=r"none of the 2 trials gave a valid scenario \(first: .*leaves no KV memory"):
        search(problem, hopeless, ["sticky-steps-2"], trials=2, fit_seed=0, jobs=1)
