"""Published measurements as data (`tasim.validation.published`, ``validate published``): the file schema
and its one-line errors, the metric catalogue on a hand-built summary, the per-step latency
fold, policy specs, run planning and deduplication, a small end-to-end run against independent
``simulate`` runs, and the document span it writes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, TEST_DATA, TINY, assert_usage_error, tasim

from tasim.cli import main
from tasim.config.policy_spec import PolicySpec
from tasim.core import events as ev
from tasim.validation.published.document import BEGIN, END
from tasim.validation.published.evaluate import evaluate, plan, run
from tasim.validation.published.littles_law import between_steps_conflicts, closed_loop_conflicts
from tasim.validation.published.measurement_file import MEASUREMENT_DIR, MeasurementError, load_measurements
from tasim.validation.published.present import describe, sweep_x
from tasim.validation.published.quantities import METRICS, MetricUnavailable, Outcome
from tasim.validation.published.turn_latency import TurnLatencyFold

DATA = TEST_DATA
TINY_FILE = DATA / "published-tiny.yaml"
SHORT = ("--set", "duration_s=40")

GOOD = f"""
name: good
title: A good file
sources: {{s: {{cite: "somewhere"}}}}
scenario: {TINY}
systems: {{A: round_robin, B: "thunderagent[variant=dynamo]"}}
points:
  - id: a-2
    metric: calls_per_min
    of: {{system: A, set: {{workload.concurrency: 2}}}}
    value: 10
    source: s
    where: Table 1
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(MeasurementError) as caught:
        load_measurements(_write(tmp_path, text))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "m.yaml")), message
    return message


def test_a_good_file_loads_with_its_scenario_resolved(tmp_path: Path) -> None:
    m = load_measurements(_write(tmp_path, GOOD))
    assert m.name == "good" and m.systems["B"] == PolicySpec("thunderagent", {"variant": "dynamo"})
    assert m.scenario_of(m.points[0]) == Path(TINY).resolve()
    assert m.points[0].published.value == 10 and not m.points[0].published.approx


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("metric: calls_per_min", "metric: steps"), "points.a-2.metric: unknown metric 'steps' (allowed: calls_per_min, prefix_hit_pct,"),
        (("of: {system: A,", "of: {system: C,"), "points.a-2.of.system: unknown system 'C' (allowed: A, B)"),
        (("source: s\n", "source: t\n"), "points.a-2.source: unknown source 't' (allowed: s)"),
        (("value: 10", "value: 10\n    range: [1, 2]"), "points.a-2: give exactly one of value, range or derived: true (got value, range)"),
        (("value: 10", "range: [3, 2]"), "points.a-2: range must be [low, high] with low <= high (got [3.0, 2.0])"),
        (("value: 10", "derived: true"), "points.a-2: derived: true needs `over`"),
        (("value: 10", "valu: 10"), "points.a-2.valu: unknown key (allowed: id, metric, of, over, value, range, derived,"),
        (
            ("set: {workload.concurrency: 2}", "set: {policy.params.variant: dynamo}"),
            "points.a-2.of.set: Value error, policy.params.variant: the system chooses the policy",
        ),
        (("id: a-2", "id: a 2"), "points[0].id: String should match pattern"),
        (
            ('B: "thunderagent[variant=dynamo]"', 'B: "thunderagent[variant]"'),
            "systems: B: thunderagent[variant]: variant is not key=value (expected name or name[key=value,...])",
        ),
        ((f"scenario: {TINY}", "scenario: no-such-preset.yaml"), "scenario: no scenario file"),
        (("title: A good file\n", ""), "title: Field required"),
    ],
)
def test_schema_errors_are_one_line_naming_the_field(tmp_path: Path, change: tuple[str, str], expected: str) -> None:
    old, new = change
    assert old in GOOD
    message = _error(tmp_path, GOOD.replace(old, new))
    assert expected.replace("Value error, ", "") in message, message


def test_duplicate_ids_and_missing_scenarios_are_refused(tmp_path: Path) -> None:
    point = GOOD.split("points:\n", 1)[1]
    assert "points.a-2: id given twice" in _error(tmp_path, GOOD + point)
    no_scenario = GOOD.replace(f"scenario: {TINY}\n", "")
    assert "points.a-2.scenario: no scenario (give one here or at the top of the file)" in _error(tmp_path, no_scenario)


def test_yaml_errors_name_file_line_and_column(tmp_path: Path) -> None:
    assert re.search(r"m\.yaml:4:\d+: YAML syntax error", _error(tmp_path, GOOD.replace("sources: {s:", "sources: {s: [")))
    assert "duplicate key 'name' (first on line 2); give each key once" in _error(tmp_path, GOOD + "name: again\n")


def test_a_derived_ratio_is_the_quotient_of_the_files_points() -> None:
    m = load_measurements(TINY_FILE)
    derived = next(p for p in m.points if p.derived)
    assert derived.published.value == 90 / 50
    assert derived.published.approx  # one side was read off a plot


def test_a_derived_ratio_needs_both_points(tmp_path: Path) -> None:
    text = (
        GOOD
        + """  - id: ratio
    metric: calls_per_min
    of: {system: A, set: {workload.concurrency: 4}}
    over: {system: A, set: {workload.concurrency: 2}}
    derived: true
    source: s
    where: quotient
"""
    )
    assert "points.ratio.derived: needs exactly one point with a value (not a range) of calls_per_min for its `of` side, found 0" in _error(
        tmp_path, text
    )


def test_shipped_measurement_files_load_and_name_existing_presets() -> None:
    files = sorted(MEASUREMENT_DIR.glob("*.yaml"))
    assert {f.name for f in files} >= {"thunderagent-paper.yaml", "verl-recipe-h20.yaml"}
    for path in files:
        m = load_measurements(path)
        for point in m.points:
            assert m.scenario_of(point).parent == REPO / "scenarios"


def test_host_tier_points_compare_the_preset_with_and_without_its_tier() -> None:
    """Every ratio of host-tier.yaml divides a run with the preset's host tier by the same run without it."""
    planned = plan([load_measurements(MEASUREMENT_DIR / "host-tier.yaml")])
    ratios = [pp for pp in planned.points if pp.over is not None]
    assert ratios
    for pp in ratios:
        assert pp.over is not None
        with_tier, without = planned.runs[pp.of].scenario, planned.runs[pp.over].scenario
        assert with_tier.cluster.engine.host_tier is not None and without.cluster.engine.host_tier is None
        assert with_tier.model_copy(update={"cluster": without.cluster}) == without
        assert with_tier.cluster.model_copy(update={"engine": without.cluster.engine}) == without.cluster
        assert with_tier.cluster.engine.model_copy(update={"host_tier": None}) == without.cluster.engine
        assert describe(pp.measurements, pp.point).endswith("the preset / host_tier=None")  # the tier-on side sets nothing of its own
    assert all(sweep_x(pp.point) is None for pp in planned.points)  # seeds are repeats, not a sweep


# --- metrics ------------------------------------------------------------------------------------


def _summary(**changes: Any) -> dict[str, Any]:
    rollout = {
        "steps": 2,
        "rollout_time_s": {"mean": 300.0},
        "step_time_s": {"mean": 480.0},
        "rollout_tokens_per_s": 2500.0,
        "step_tokens_per_s": 1562.5,
    }
    base = {
        "calls_per_min": 120.5,
        "prefix_hit_rate": 0.875,
        "prefix_hit_rate_since_start": 0.75,
        "e2e_s": {"mean": 4.25},
        "ttft_s": {"mean": 0.75},
        "requests_completed": 3000,
        "requests_unfinished": 0,
        "rollout": rollout,
    }
    return {**base, **changes}


def _latency_point(ident: str, system: str, concurrency: int, seconds: float) -> str:
    return f"""
  - id: {ident}
    metric: turn_latency_s
    of: {{system: {system}, set: {{workload.concurrency: {concurrency}}}}}
    value: {seconds}
    source: s
    where: Fig. 2
"""


def test_closed_loop_conflicts_are_pairs_whose_product_exceeds_the_programs(tmp_path: Path) -> None:
    # a-2: 10 steps/min of A at N = 2; a 15 s step puts 10/60 * 15 = 2.5 programs in a step (> 2),
    # a 12 s step exactly 2 (allowed), B's 30 s step has no steps/min of B to pair with
    text = (
        GOOD
        + _latency_point("lat-15", "A", 2, 15)
        + _latency_point("lat-12", "A", 2, 12)
        + _latency_point("lat-b", "B", 2, 30)
        + _latency_point("lat-n4", "A", 4, 30)
    )
    conflicts = closed_loop_conflicts(load_measurements(_write(tmp_path, text)))
    assert [(c.latency.id, c.throughput.id) for c in conflicts] == [("lat-15", "a-2")]
    assert conflicts[0].occupancy == pytest.approx(1.25)
    assert conflicts[0].latency_bound_s == pytest.approx(12.0)


def test_the_papers_swe_agent_vllm_latencies_exceed_what_its_throughputs_allow() -> None:
    # Fig. 1b's per-step latencies against Fig. 4's steps/min for vLLM: 220 x 7.7 / 60 / 24 and so on
    conflicts = closed_loop_conflicts(load_measurements(MEASUREMENT_DIR / "thunderagent-paper.yaml"))
    assert [(c.latency.id, c.throughput.id, round(c.occupancy, 3)) for c in conflicts] == [
        ("fig1b-vllm-step-latency-24", "fig4-swe-agent-vllm-24", 1.176),
        ("fig1b-vllm-step-latency-48", "fig4-swe-agent-vllm-48", 3.915),
        ("fig1b-vllm-step-latency-72", "fig4-swe-agent-vllm-72", 2.037),
        ("fig1b-vllm-step-latency-96", "fig4-swe-agent-vllm-96", 1.361),
        ("fig10-swe-agent-vllm-step-latency-96", "fig4-swe-agent-vllm-96", 1.142),
    ]
    assert closed_loop_conflicts(load_measurements(MEASUREMENT_DIR / "verl-recipe-h20.yaml")) == []


def test_a_system_that_holds_nothing_back_may_not_spend_longer_between_steps(tmp_path: Path) -> None:
    # A (round_robin) at N = 2: 10 steps/min and a 6 s step leave 2 * 60 / 10 - 6 = 6 s between
    # steps. B (thunderagent, which holds requests) at 20 steps/min: a 4 s step leaves 2 s (conflict),
    # a 5 s step on another line at N = 2 leaves 1 s (conflict); nothing is compared across N
    b_steps = GOOD.split("points:")[1].replace("a-2", "b-2").replace("system: A", "system: B").replace("value: 10", "value: 20")
    text = (
        GOOD
        + b_steps
        + _latency_point("lat-a", "A", 2, 6)
        + _latency_point("lat-b4", "B", 2, 4)
        + _latency_point("lat-b5", "B", 2, 5)
        + _latency_point("lat-a4", "A", 4, 1)
    )
    conflicts = between_steps_conflicts(load_measurements(_write(tmp_path, text)))
    assert [(c.unheld.latency.id, c.held.latency.id) for c in conflicts] == [("lat-a", "lat-b4"), ("lat-a", "lat-b5")]
    assert [c.held.between_steps_s for c in conflicts] == [pytest.approx(2.0), pytest.approx(1.0)]
    assert conflicts[0].unheld.between_steps_s == pytest.approx(6.0)
    # a holding system longer between steps than the no-hold one is what holding allows
    assert (
        between_steps_conflicts(
            load_measurements(_write(tmp_path, GOOD + b_steps + _latency_point("lat-a1", "A", 2, 11) + _latency_point("lat-b", "B", 2, 4)))
        )
        == []
    )


def test_the_papers_openhands_latencies_need_vllm_to_spend_longer_between_steps_than_thunderagent() -> None:
    # Fig. 10 with Fig. 4 at 96: vLLM 96 * 60 / 52 - 56 = 54.77 s between steps, ThunderAgent
    # 96 * 60 / 187 - 13 = 17.80 s, though only ThunderAgent holds requests back
    conflicts = between_steps_conflicts(load_measurements(MEASUREMENT_DIR / "thunderagent-paper.yaml"))
    assert [(c.unheld.latency.id, c.held.latency.id) for c in conflicts] == [
        ("fig10-openhands-vllm-step-latency-96", "fig10-openhands-ta-step-latency-96")
    ]
    assert conflicts[0].unheld.between_steps_s == pytest.approx(96 * 60 / 52 - 56)
    assert conflicts[0].held.between_steps_s == pytest.approx(96 * 60 / 187 - 13)
    assert between_steps_conflicts(load_measurements(MEASUREMENT_DIR / "verl-recipe-h20.yaml")) == []


def test_metrics_of_a_hand_built_summary() -> None:
    outcome = Outcome(_summary(), turn_latency_s=7.5, rollout_steps=2)
    values = {name: metric.of(outcome) for name, metric in METRICS.items()}
    assert values == {
        "calls_per_min": 120.5,
        "prefix_hit_pct": 87.5,
        "prefix_hit_pct_since_start": 75.0,
        "e2e_mean_s": 4.25,
        "ttft_mean_s": 0.75,
        "turn_latency_s": 7.5,
        "rollout_steps_per_min": 3000 / (300.0 * 2) * 60,  # 300 calls per minute of rollout
        "rollout_tokens_per_s": 2500.0,
        "full_step_tokens_per_s": 1562.5,
        "rollout_time_s": 300.0,
        "step_time_s": 480.0,
    }
    assert METRICS["prefix_hit_pct"].text(87.5) == "88 %" and METRICS["turn_latency_s"].text(41) == "41.0 s"


def test_metrics_a_run_lacks_say_why() -> None:
    serving = Outcome(_summary(rollout=None), turn_latency_s=None, rollout_steps=None)
    for name, reason in (("rollout_tokens_per_s", "no rollout step completed"), ("turn_latency_s", "no step in the measurement window")):
        with pytest.raises(MetricUnavailable, match=reason):
            METRICS[name].of(serving)
    cut = Outcome(_summary(), turn_latency_s=None, rollout_steps=3)
    with pytest.raises(MetricUnavailable, match=r"ended before its last rollout step \(2 of 3 completed\)"):
        METRICS["rollout_steps_per_min"].of(cut)


def test_turn_latency_runs_from_a_call_to_the_programs_next_call() -> None:
    fold = TurnLatencyFold(warmup_s=5.0)
    for event in (
        ev.RequestArrived(0.0, "r0", "p", 0, 10, 0, 5),
        ev.RequestFinished(2.0, "r0", "p", "w0", 10, 5, 0),
        ev.RequestArrived(4.0, "r1", "p", 1, 20, 15, 5),  # step 1: 0 -> 4, ends before the window
        ev.RequestFinished(6.0, "r1", "p", "w0", 20, 5, 15),
        ev.RequestArrived(9.0, "r2", "p", 2, 30, 25, 5),  # step 2: 4 -> 9
        ev.RequestFinished(12.0, "r2", "p", "w0", 30, 5, 25),
        ev.ProgramFinished(13.0, "p", 35, True),  # step 3: 9 -> 12, the last call's finish
    ):
        fold.apply(event)
    assert fold.mean_s == (5.0 + 3.0) / 2
    assert TurnLatencyFold(0.0).mean_s is None


# --- planning -------------------------------------------------------------------------------


def test_plan_runs_each_distinct_scenario_once() -> None:
    planned = plan([load_measurements(TINY_FILE)], ["duration_s=40"])
    assert [r.label for r in planned.runs] == [
        "tiny/round_robin/workload.concurrency=2",
        "tiny/round_robin/workload.concurrency=4",
        "tiny/round_robin/workload.concurrency=6",
        "tiny/thunderagent[scheduler_interval_s=2]/workload.concurrency=4",
    ]
    sides = {pp.point.id: (pp.of, pp.over) for pp in planned.points}
    assert sides == {
        "sticky-steps-2": (0, None),
        "sticky-steps-4": (1, None),
        "sticky-steps-6": (2, None),
        "aware-hit-4": (3, None),
        "aware-over-sticky-4": (3, 1),
        "sticky-6-over-2": (2, 0),
    }
    aware = planned.runs[3].scenario
    assert (aware.policy.name, aware.policy.params, aware.duration_s) == ("thunderagent", {"scheduler_interval_s": 2}, 40)
    assert aware.workload.concurrency == 4


def test_plan_remaps_a_system_and_takes_a_base_scenario() -> None:
    m = load_measurements(TINY_FILE)
    remapped = plan([m], systems={"Aware": PolicySpec("kv_router")})
    assert [r.label for r in remapped.runs][3] == "tiny/kv_router/workload.concurrency=4"
    base = remapped.runs[0].scenario.model_copy(update={"name": "mine", "duration_s": 30.0})
    on_base = plan([m], ["seed=5"], base=base)
    assert {(r.scenario.name, r.scenario.duration_s, r.scenario.seed) for r in on_base.runs} == {("mine", 30.0, 5)}


@pytest.mark.parametrize(
    ("overrides", "systems", "expected"),
    [
        (["workload.concurrency=8"], {}, "--set workload.concurrency: "),
        (["workload=x"], {}, "point sticky-steps-2 sets workload.concurrency itself"),
        (["policy.params.variant=dynamo"], {}, "each system of a measurement file chooses its run's policy"),
        ([], {"Nobody": PolicySpec("random")}, "--system Nobody: no measurement file has that system (systems: Aware, Sticky)"),
        ([], {"Aware": PolicySpec("thunderagent", {"varaint": "dynamo"})}, "points.aware-hit-4.of (Aware = thunderagent[varaint=dynamo]): "),
        (["workload.turns=-1"], {}, "tiny.yaml: workload.turns"),
    ],
)
def test_plan_refuses_what_would_be_lost_or_invalid(overrides: list[str], systems: dict[str, PolicySpec], expected: str) -> None:
    with pytest.raises(MeasurementError, match=re.escape(expected)) as caught:
        plan([load_measurements(TINY_FILE)], overrides, systems)
    assert "\n" not in str(caught.value)


# --- end to end -----------------------------------------------------------------------------

DOC_HEAD = "# Validation\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n\n## 4. Published measurements\n\n"
DOC_TAIL = "\n\n## 5. Later\n\nMore text.\n"


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ``validate published`` of the tiny file, with a document."""
    root = tmp_path_factory.mktemp("published")
    (root / "docs").mkdir()
    (root / "docs" / "validation.md").write_text(f"{DOC_HEAD}{BEGIN}\nstale\n{END}{DOC_TAIL}")
    result = tasim(
        "validate",
        "published",
        str(TINY_FILE),
        *SHORT,
        "--jobs",
        "2",
        "--out",
        str(root / "out"),
        "--label",
        "first",
        "--doc",
        str(root / "docs" / "validation.md"),
        "--plots",
        str(root / "docs" / "published"),
    )
    assert result.returncode == 0, result.stderr
    return root


def _record(root: Path, out: str = "out") -> dict[str, Any]:
    return json.loads((root / out / "published.json").read_text())


def _summary_of(tmp: Path, *overrides: str) -> dict[str, Any]:
    out = tmp / re.sub(r"\W", "_", "-".join(overrides))
    result = tasim("simulate", TINY, *SHORT, "--quiet", "--out", str(out), *(a for o in overrides for a in ("--set", o)))
    assert result.returncode == 0, result.stderr
    return json.loads((out / "summary.json").read_text())


def test_record_holds_what_independent_simulate_runs_give(published: Path, tmp_path: Path) -> None:
    record = _record(published)
    points = {p["id"]: p for p in record["files"][0]["points"]}
    sticky4 = _summary_of(tmp_path, "workload.concurrency=4", "policy.name=round_robin")
    aware4 = _summary_of(tmp_path, "workload.concurrency=4", "policy.name=thunderagent", "policy.params.scheduler_interval_s=2")
    assert points["sticky-steps-4"]["tasim"] == sticky4["calls_per_min"]
    assert points["aware-hit-4"]["tasim"] == aware4["prefix_hit_rate"] * 100
    assert points["aware-over-sticky-4"]["tasim"] == aware4["calls_per_min"] / sticky4["calls_per_min"]
    assert points["sticky-steps-4"]["tasim_over_published"] == sticky4["calls_per_min"] / 80
    assert points["aware-hit-4"]["tasim_over_published"] == aware4["prefix_hit_rate"] * 100 / 70  # the range's midpoint
    assert points["sticky-6-over-2"]["value"] == 90 / 50 and points["sticky-6-over-2"]["derived"]
    assert points["aware-over-sticky-4"]["runs"] == [
        "tiny/thunderagent[scheduler_interval_s=2]/workload.concurrency=4",
        "tiny/round_robin/workload.concurrency=4",
    ]
    assert record["label"] == "first" and record["overrides"] == ["duration_s=40"] and record["systems"] == {}
    assert record["files"][0]["path"] == "tests/data/published-tiny.yaml"  # relative to the working directory
    run_metrics = {r["label"]: r["metrics"] for r in record["runs"]}
    assert run_metrics["tiny/round_robin/workload.concurrency=4"]["calls_per_min"] == sticky4["calls_per_min"]
    assert run_metrics["tiny/round_robin/workload.concurrency=4"]["rollout_tokens_per_s"] is None


def test_record_does_not_depend_on_jobs(published: Path) -> None:
    result = tasim("validate", "published", str(TINY_FILE), *SHORT, "--jobs", "1", "--out", str(published / "serial"), "--label", "first")
    assert result.returncode == 0, result.stderr
    assert (published / "serial" / "published.json").read_bytes() == (published / "out" / "published.json").read_bytes()


def test_table_shows_published_tasim_and_ratio(published: Path) -> None:
    result = tasim("validate", "published", str(TINY_FILE), "--from-record", str(published / "out" / "published.json"))
    assert result.returncode == 0, result.stderr
    record = {p["id"]: p for p in _record(published)["files"][0]["points"]}
    row = next(line for line in result.stdout.splitlines() if line.strip().startswith("sticky-steps-6 "))
    assert "≈90.0" in row and f"{record['sticky-steps-6']['tasim']:,.1f}" in row
    assert row.split()[-1] == f"{record['sticky-steps-6']['tasim_over_published']:.2f}"
    assert "≈60–80 %" in next(line for line in result.stdout.splitlines() if "aware-hit-4" in line)
    assert "wrote nothing" in result.stdout  # a record re-rendered without --doc writes no file


def _span(doc: Path) -> str:
    return doc.read_text().split(BEGIN, 1)[1].split(END, 1)[0]


def test_document_span_tables_and_plots(published: Path) -> None:
    doc = published / "docs" / "validation.md"
    text = doc.read_text()
    # the old span is gone ("stale" on a line of its own: the command line's paths may hold the word)
    assert text.startswith(DOC_HEAD + BEGIN + "\n") and text.endswith(END + DOC_TAIL) and "\nstale\n" not in text
    span = _span(doc)
    rows = [line for line in span.splitlines() if line.startswith("| ")]
    assert rows[0] == "| point | what | source: where | published | now | now/published |"
    record = {p["id"]: p for p in _record(published)["files"][0]["points"]}
    sticky4 = next(r for r in rows if r.startswith("| sticky-steps-4 "))
    assert sticky4 == (
        f"| sticky-steps-4 | Sticky, calls/min, concurrency=4 | table: Table 1 | 80.0 | "
        f"{record['sticky-steps-4']['tasim']:,.1f} | {record['sticky-steps-4']['tasim_over_published']:.2f} |"
    )
    links = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", span)
    assert links == ["published/tiny-source.png", "published/tiny-source-tiny-calls_per_min-concurrency.png"]
    for link in links:
        assert (doc.parent / link).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_document_shows_earlier_records_as_columns(published: Path) -> None:
    earlier = _record(published)
    for point in earlier["files"][0]["points"]:
        point["tasim"] = 1.5 if point["id"] == "sticky-steps-4" else None
    (published / "earlier.json").write_text(json.dumps({**earlier, "label": "before (abc1234)", "systems": {"Aware": "kv_router"}}))
    shutil.copy(published / "docs" / "validation.md", published / "docs" / "again.md")
    result = tasim(
        "validate",
        "published",
        str(TINY_FILE),
        "--from-record",
        str(published / "out" / "published.json"),
        "--before",
        str(published / "earlier.json"),
        "--doc",
        str(published / "docs" / "again.md"),
        "--plots",
        str(published / "docs" / "published"),
    )
    assert result.returncode == 0, result.stderr
    span = _span(published / "docs" / "again.md")
    rows = [line for line in span.splitlines() if line.startswith("| ")]
    assert rows[0] == ("| point | what | source: where | published | before (abc1234) (Aware = kv_router, duration_s=40) | now | now/published |")
    assert next(r for r in rows if r.startswith("| sticky-steps-4 ")).split(" | ")[4] == "1.5"
    assert next(r for r in rows if r.startswith("| sticky-steps-2 ")).split(" | ")[4] == "—"
    # re-rendered from the run's own record: the rows of "now" are the run's
    now_rows = [line for line in _span(published / "docs" / "validation.md").splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[-2] for r in rows[2:]] == [r.split(" | ")[-2] for r in now_rows[2:]]


def test_cli_errors_are_one_line(published: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY_FILE.read_text().replace("metric: calls_per_min", "metric: steps", 1))
    # as a user runs it: exit status 2, one line, no traceback
    assert_usage_error(tasim("validate", "published", str(bad)), "points.sticky-steps-2.metric: unknown metric 'steps'")
    record = str(published / "out" / "published.json")
    for args, fragments in (
        (("--set", "workload.concurrency=3"), ("--set workload.concurrency: ", "sets workload.concurrency itself")),
        (("--system", "Aware"), ("--system 'Aware': expected NAME=POLICY",)),
        (("--system", "Aware=kv_router", "--system", "Aware=random"), ("--system: a system is remapped twice",)),
        (("--before", str(tmp_path / "none.json")), ("--before", "cannot read")),
        (("--from-record", record, *SHORT), ("--from-record: its runs were made with the record's own --set",)),
    ):
        assert main(["validate", "published", str(TINY_FILE), *args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and all(f in lines[0] for f in fragments), lines


def test_evaluate_api_agrees_with_the_command(published: Path) -> None:
    planned = plan([load_measurements(TINY_FILE)], ["duration_s=40"])
    results = evaluate(planned, run(planned, jobs=1))
    recorded = {p["id"]: p["tasim"] for p in _record(published)["files"][0]["points"]}
    assert {r.point.id: r.tasim for r in results} == recorded
    assert all(r.error == r.ratio - 1 for r in results if r.ratio is not None)
