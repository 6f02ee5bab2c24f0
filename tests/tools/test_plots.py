"""The PNGs of `tasim compare` (`tasim.tools.plots`): which are written, what their titles say, and a
layout in which no text collides, checked on the figures' rendered text extents."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
from conftest import SCENARIOS
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from tasim.cli import main
from tasim.config.scenario import Override, set_flags
from tasim.tools.comparison import Plan, parse_policies, parse_sweep, plan_runs
from tasim.tools.plots import figures

SCENARIO = str(SCENARIOS / "swe-agent.yaml")
# a few programs over two simulated minutes: each run takes a fraction of a second
SHORT = ("workload.programs=4", "duration_s=120", "metrics.warmup_s=10")
SPEC_LABELS = [
    "thunderagent[variant=dynamo,acting_decay_tau_s=2]",
    "kv_router[overlap_score_credit=2.5,router_temperature=0.5]",
    "least_loaded[session_affinity_ttl_s=30]",
    "round_robin",
]
LONG_SPECS = ",".join(SPEC_LABELS)
SET_LINE = "--set workload.programs=4, duration_s=120, metrics.warmup_s=10"
# without a sweep: two backends, so the policies differ
UNSWEPT = (*SHORT, "cluster.backends=2", "workload.concurrency=4")
SET_LINES = f"{SET_LINE},\ncluster.backends=2, workload.concurrency=4"


@dataclass(frozen=True)
class Compared:
    """A compare run's output directory, the plan and summaries it plotted, and its figures."""

    out: Path
    plan: Plan
    summaries: list[dict[str, Any]]
    figures: dict[str, Figure]


def sets(*overrides: str) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


def compared(out: Path, overrides: tuple[str, ...], specs: str, *, sweep: str | None = None, seeds: int = 1, seed: int | None = None) -> Compared:
    """``tasim compare`` run in this process (one job), and the plan and summaries it plotted."""
    argv = ["compare", SCENARIO, *sets(*overrides), "--policies", specs, "--jobs", "1", "--out", str(out), "--seeds", str(seeds)]
    argv += ["--sweep", sweep] if sweep else []
    argv += ["--seed", str(seed)] if seed is not None else []
    assert main(argv) == 0
    data = json.loads((out / "compare.json").read_text())
    summaries = [entry["summary"] for entry in (data["runs"] if seeds > 1 else data)]
    as_given = set_flags(overrides)  # as the CLI passes them on: each names its --set
    with_seed = [*as_given, Override(("seed",), seed, f"--seed {seed}")] if seed is not None else as_given
    plan = plan_runs(SCENARIO, parse_policies(specs), parse_sweep(sweep) if sweep else None, with_seed, seeds)
    return Compared(out, plan, summaries, figures(plan, summaries, out / "runs"))


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Compared:
    """Long specs over three seeds, no sweep: throughput bars with intervals."""
    return compared(tmp_path_factory.mktemp("seeded"), UNSWEPT, LONG_SPECS, seeds=3)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Compared:
    """Long specs at one seed (given by --seed), no sweep."""
    return compared(tmp_path_factory.mktemp("single"), UNSWEPT, LONG_SPECS, seed=3)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Compared:
    """Two specs over a numeric sweep at one seed."""
    return compared(tmp_path_factory.mktemp("swept"), SHORT, "round_robin,kv_router[router_temperature=0.5]", sweep="workload.concurrency=2,4")


def extents(fig: Figure, texts: Sequence[Text]) -> list[Bbox]:
    """The ``texts``' extents in display pixels, as the figure's renderer draws them (layout done)."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    return [text.get_window_extent(renderer) for text in texts]


def suptitle(fig: Figure) -> Text:
    (text,) = [t for t in fig.findobj(Text) if t.get_text() == fig.get_suptitle()]
    return text


def assert_nothing_cut_off(fig: Figure) -> None:
    """Everything drawn (texts, legends, tick labels) lies wholly inside the figure."""
    fig.draw_without_rendering()
    drawn = fig.get_tightbbox(fig.canvas.get_renderer())  # type: ignore[attr-defined]  # in inches
    size = fig.bbox_inches
    assert size.x0 <= drawn.x0 and drawn.x1 <= size.x1 and size.y0 <= drawn.y0 and drawn.y1 <= size.y1, (drawn, size)


def test_long_specs_tick_labels_do_not_overlap(seeded: Compared, single: Compared) -> None:
    """Long specs break between their params, and the figure widens until neighbours clear."""
    for result in (seeded, single):
        fig = result.figures["throughput.png"]
        labels = fig.axes[0].get_xticklabels()
        boxes = extents(fig, labels)
        for a, b in combinations(boxes, 2):
            assert not a.overlaps(b), (a, b)
        assert [label.get_text() for label in labels] == [
            "thunderagent[\nvariant=dynamo,\nacting_decay_tau_s=2]",
            "kv_router[\noverlap_score_credit=2.5,\nrouter_temperature=0.5]",
            "least_loaded[\nsession_affinity_ttl_s=30]",
            "round_robin",
        ]
        assert_nothing_cut_off(fig)


def test_categorical_sweep_values_do_not_overlap(tmp_path: Path) -> None:
    values = "{kind: lognormal, median: 1.0, sigma: 0.6, min: 0.05, max: 60},{kind: lognormal, median: 30.0, sigma: 0.6, min: 0.05, max: 60}"
    result = compared(tmp_path, SHORT, "round_robin", sweep=f"workload.tools.shell.latency_s={values}")
    fig = result.figures["throughput.png"]
    labels = fig.axes[0].get_xticklabels()
    first, second = extents(fig, labels)
    assert not first.overlaps(second)
    assert [label.get_text() for label in labels] == [
        "{kind: lognormal,\nmedian: 1.0, sigma: 0.6,\nmin: 0.05, max: 60}",
        "{kind: lognormal,\nmedian: 30.0,\nsigma: 0.6, min: 0.05,\nmax: 60}",
    ]
    assert_nothing_cut_off(fig)


def test_titles_name_the_set_overrides(swept: Compared, seeded: Compared, single: Compared) -> None:
    assert swept.figures["throughput.png"].axes[0].get_title() == f"Throughput · swe-agent · seed 0\n{SET_LINE}"
    assert swept.figures["hit_rate.png"].axes[0].get_title() == f"Prefix cache hit rate · swe-agent · seed 0\n{SET_LINE}"
    # --seed is said as the seed, not as an override
    assert single.figures["throughput.png"].axes[0].get_title() == f"Throughput · swe-agent · seed 3\n{SET_LINES}"
    assert seeded.figures["throughput.png"].axes[0].get_title() == (f"Throughput · swe-agent · mean and 95 % interval over seeds 0-2\n{SET_LINES}")
    assert (
        swept.figures["kv_utilization.png"].get_suptitle() == f"KV utilisation per worker · swe-agent · seed 0 · workload.concurrency=4\n{SET_LINE}"
    )
    for result in (swept, seeded, single):
        for fig in result.figures.values():
            assert_nothing_cut_off(fig)


def test_many_overrides_are_cut_to_two_title_lines(tmp_path: Path) -> None:
    many = (
        *SHORT,
        "workload.task_prompt_tokens={kind: lognormal, median: 1500, sigma: 0.4, min: 300, max: 6000}",
        "workload.concurrency=4",
        "cluster.engine.max_num_seqs=128",
        "cluster.engine.max_num_batched_tokens=4096",
        "metrics.sample_interval_s=10",
        "workload.system_prompt_tokens=1000",
    )
    result = compared(tmp_path, many, "round_robin")
    fig = result.figures["throughput.png"]
    assert fig.axes[0].get_title() == (
        f"Throughput · swe-agent · seed 0\n{SET_LINE},\n"
        "workload.task_prompt_tokens={kind: lognormal, m…, … 5 more"  # an override cut to 48 characters
    )
    assert_nothing_cut_off(fig)


def test_kv_plot_of_several_seeds_says_which_seed_it_shows(seeded: Compared) -> None:
    fig = seeded.figures["kv_utilization.png"]
    assert fig.get_suptitle() == f"KV utilisation per worker · swe-agent · seed 0 of 0-2\n{SET_LINES}"
    # the panels are the first seed's runs
    assert [ax.get_title() for ax in fig.axes] == SPEC_LABELS


def test_single_seed_without_sweep_writes_throughput_bars(single: Compared) -> None:
    assert sorted(path.name for path in single.out.glob("*.png")) == ["kv_utilization.png", "throughput.png"]
    assert list(single.figures) == ["throughput.png", "kv_utilization.png"]
    ax = single.figures["throughput.png"].axes[0]
    assert [bar.get_height() for bar in ax.patches] == [summary["calls_per_min"] for summary in single.summaries]
    (bars,) = ax.containers
    assert isinstance(bars, BarContainer) and bars.errorbar is None  # one seed: no interval to draw


def test_seeded_bars_carry_the_interval(seeded: Compared) -> None:
    from tasim.results.stats import mean_interval

    ax = seeded.figures["throughput.png"].axes[0]
    expected = [mean_interval([s["calls_per_min"] for s in seeded.summaries[i * 3 : i * 3 + 3]]) for i in range(len(SPEC_LABELS))]
    assert [bar.get_height() for bar in ax.patches] == pytest.approx([i.mean for i in expected])
    (bars,) = [container for container in ax.containers if isinstance(container, BarContainer)]
    assert bars.errorbar is not None
    (segments,) = bars.errorbar.lines[2]
    ends = [value for segment in segments.get_segments() for value in segment[:, 1]]
    assert ends == pytest.approx([value for i in expected for value in (i.low, i.high)])


def test_suptitle_clears_the_first_panels_title(seeded: Compared, swept: Compared) -> None:
    for result in (seeded, swept):
        fig = result.figures["kv_utilization.png"]
        top, first_panel = extents(fig, [suptitle(fig), fig.axes[0].title])
        assert not top.overlaps(first_panel)
        # below the figure's title by at least a line of their 12 pt text, in points
        assert (top.y0 - first_panel.y1) * 72 / fig.dpi >= 12 - 1e-9
        assert_nothing_cut_off(fig)
