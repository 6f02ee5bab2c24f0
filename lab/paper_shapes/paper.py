"""What the suite compares and the ThunderAgent paper's values, read from
``measurements/thunderagent-paper.yaml`` (the paper's §6 as data, with its sources).

The suite's own design stays here: which presets, with which titles, over which concurrency
axes. The values are the file's points, selected by preset, metric, system and the figure their
``where`` names first (Fig. 1b's plain-vLLM thrashing curve and Figs. 4, 5 and 10 give values for
the same systems and concurrencies, so the figure tells them apart).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from tasim.validation.published.measurement_file import MEASUREMENT_DIR, Point, Published, load_measurements

PAPER = load_measurements(MEASUREMENT_DIR / "thunderagent-paper.yaml")
CONCURRENCY = "workload.concurrency"

# the paper's name of each system, by the policy that models it (its RL baseline, vLLM + SGLang
# Model Gateway, routes with SMG's `cache_aware`: tasim's kv_router, see the file)
PAPER_NAMES = {spec.name: name for name, spec in PAPER.systems.items()}
SERVING_POLICIES = ("round_robin", "continuum", "thunderagent")
RL_BASELINE = PAPER.systems["vLLM + SGLang Model Gateway"].name
HIT_METRICS = ("prefix_hit_pct", "prefix_hit_pct_since_start")


def _policy(system: str) -> str:
    return PAPER.systems[system].name


def _points(preset: str, figure: str, metric: str, ratio: bool) -> list[Point]:
    """The file's points of ``preset`` from ``figure`` (the first part of their ``where``)."""
    return [
        p
        for p in PAPER.points
        if Path(PAPER.scenario_of(p)).stem == preset
        and p.where.split(",")[0].endswith(figure)
        and p.metric == metric
        and (p.over is not None) == ratio
    ]


@cache  # the file is read once at import; the suite asks once per value it reads
def hit_metric(preset: str) -> str:
    """The hit-rate metric the file's points of ``preset`` are held to: since the server started
    where the paper's harness read vLLM's cumulative counters, else the window's (also for a
    preset with no hit-rate points)."""
    metrics = {p.metric for p in PAPER.points if Path(PAPER.scenario_of(p)).stem == preset and p.metric in HIT_METRICS}
    if len(metrics) > 1:
        raise ValueError(f"{preset}: its hit-rate points mix {sorted(metrics)}; one preset's harness measures one way")
    return metrics.pop() if metrics else "prefix_hit_pct"


def _concurrency(point: Point) -> int:
    return int(point.of.set[CONCURRENCY])


@dataclass(frozen=True)
class ServingCase:
    """One serving preset of paper Fig. 4: its concurrency sweep and the paper's values."""

    preset: str
    title: str
    concurrency: tuple[int, ...]
    throughput: dict[str, dict[int, Published]]  # policy -> {concurrency: steps/min}
    ratios: dict[str, Published]  # policy -> labelled throughput ratio vs vLLM at the largest point
    hit_rates: dict[tuple[str, int], Published]  # (policy, concurrency) -> prefix hit rate (§6.4)
    latency: dict[str, Published] = field(default_factory=dict)  # policy -> per-step s at the largest point (Fig. 10)
    latency_ratio: Published | None = None  # labelled ThunderAgent / vLLM per-step latency (Fig. 10)


def _serving(preset: str, title: str, concurrency: tuple[int, ...]) -> ServingCase:
    throughput: dict[str, dict[int, Published]] = {policy: {} for policy in SERVING_POLICIES}
    for p in _points(preset, "Fig. 4", "calls_per_min", ratio=False):
        throughput[_policy(p.of.system)][_concurrency(p)] = p.published
    latency_ratio = _points(preset, "Fig. 10", "turn_latency_s", ratio=True)
    return ServingCase(
        preset,
        title,
        concurrency,
        throughput,
        {_policy(p.of.system): p.published for p in _points(preset, "Fig. 4", "calls_per_min", ratio=True)},
        {(_policy(p.of.system), _concurrency(p)): p.published for p in _points(preset, "Fig. 5", hit_metric(preset), ratio=False)},
        {_policy(p.of.system): p.published for p in _points(preset, "Fig. 10", "turn_latency_s", ratio=False)},
        latency_ratio[0].published if latency_ratio else None,
    )


SERVING: tuple[ServingCase, ...] = (
    _serving("swe-agent", "SWE-agent (mini-SWE-agent), GLM-4.6 FP8, one 8×H100 TP8 backend", (24, 48, 72, 96)),
    _serving("openhands", "OpenHands on SWE-bench, GLM-4.6 FP8, one 8×H100 TP8 backend", (24, 48, 72, 96)),
    _serving("toolorchestra", "ToolOrchestra on HLE, Qwen3-8B FP16, one RTX 5090", (24, 32, 40, 48)),
)


def serving_case(preset: str) -> ServingCase:
    return next(case for case in SERVING if case.preset == preset)


# Fig. 1b: plain vLLM on SWE-agent, GLM-4.6; "up to 7.14x" latency inflation is the text's figure.
THRASHING_PRESET = "swe-agent"
THRASHING_HIT = {_concurrency(p): p.published for p in _points(THRASHING_PRESET, "Fig. 1b", hit_metric(THRASHING_PRESET), False)}
THRASHING_E2E = {_concurrency(p): p.published for p in _points(THRASHING_PRESET, "Fig. 1b", "turn_latency_s", False)}
THRASHING_INFLATION = _points(THRASHING_PRESET, "Fig. 1b", "turn_latency_s", True)[0].published


@dataclass(frozen=True)
class RlCase:
    """One row pair of paper Table 2; ``serving`` is the preset with the same program shape."""

    preset: str
    title: str
    serving: str
    baseline: Published  # vLLM + SGLang Model Gateway, steps/min
    thunderagent: Published
    ratio: Published  # ThunderAgent over the baseline, as §6.2 prints it


def _rl(preset: str, title: str, serving: str) -> RlCase:
    values = {_policy(p.of.system): p.published for p in _points(preset, "Table 2", "rollout_steps_per_min", False)}
    (ratio,) = _points(preset, "Table 2", "rollout_steps_per_min", True)
    return RlCase(preset, title, serving, values[RL_BASELINE], values["thunderagent"], ratio.published)


RL: tuple[RlCase, ...] = (
    _rl("rl-mini-swe-agent", "mini-SWE-agent", "swe-agent"),
    _rl("rl-openhands", "OpenHands", "openhands"),
)
