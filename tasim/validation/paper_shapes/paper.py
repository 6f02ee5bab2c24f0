"""What the ThunderAgent paper compares and the values it publishes (arXiv 2602.13692 §6, as
transcribed in ``shared/reference/thunderagent.md`` §6.2-6.4)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

PAPER_NAMES = {
    "round_robin": "vLLM",
    "continuum": "Continuum",
    "thunderagent": "ThunderAgent",
    "kv_router": "vLLM + SGLang Model Gateway",
}
SERVING_POLICIES = ("round_robin", "continuum", "thunderagent")

# The RL baseline: the paper's vLLM + SGLang Model Gateway routes with SMG's default policy,
# `cache_aware` (a per-worker radix tree of routed prompts, highest prefix match above a 0.3
# threshold, shortest queue otherwise, rebalancing past a load gap). tasim's `kv_router` is the
# nearest model of that (prefix overlap against load per request); `round_robin` ignores prefixes.
RL_BASELINE = "kv_router"


@dataclass(frozen=True)
class Paper:
    """A paper value or range (``high``); ``approx``: read off a plot (shown with ≈)."""

    low: float
    high: float | None = None
    approx: bool = True

    @property
    def value(self) -> float:
        """The point a ratio is taken against: the value, or a range's midpoint."""
        return self.low if self.high is None else (self.low + self.high) / 2

    def text(self, fmt: Callable[[float], str], unit: str = "") -> str:
        """The value as the paper gives it: ≈ when read off a plot, a range as low–high."""
        body = fmt(self.low) if self.high is None else f"{fmt(self.low)}–{fmt(self.high)}"
        return f"{'≈' if self.approx else ''}{body}{unit}"


@dataclass(frozen=True)
class ServingCase:
    """One serving preset of paper Fig. 4: its concurrency sweep and the paper's values."""

    preset: str
    title: str
    concurrency: tuple[int, ...]
    throughput: dict[str, dict[int, Paper]]  # policy -> {concurrency: steps/min}
    ratios: dict[str, Paper]  # policy -> labelled throughput ratio vs vLLM at the largest point
    hit_rates: dict[tuple[str, int], Paper]  # (policy, concurrency) -> prefix hit rate (§6.4)
    latency: dict[str, Paper] = field(default_factory=dict)  # policy -> per-step s at the largest point (Fig. 10)
    latency_ratio: Paper | None = None  # labelled ThunderAgent / vLLM per-step latency (Fig. 10)


def _trend(*values: float) -> dict[int, Paper]:
    return dict(zip((24, 48, 72, 96), (Paper(v) for v in values)))


# §6.4 coding workloads: vLLM ≈97 % -> ≈30-38 %, ThunderAgent ≈93-97 % throughout, Continuum
# -> ≈55-67 % at the top (its ">90 %" at the bottom is a bound, not a value, so it is left out).
def _coding_hits(low: int, high: int) -> dict[tuple[str, int], Paper]:
    return {
        ("round_robin", low): Paper(97),
        ("round_robin", high): Paper(30, 38),
        ("continuum", high): Paper(55, 67),
        ("thunderagent", low): Paper(93, 97),
        ("thunderagent", high): Paper(93, 97),
    }


SERVING: tuple[ServingCase, ...] = (
    ServingCase(
        "swe-agent", "SWE-agent (mini-SWE-agent), GLM-4.6 FP8, one 8×H100 TP8 backend", (24, 48, 72, 96),
        {"round_robin": _trend(220, 275, 160, 140), "continuum": _trend(220, 303, 282, 213),
         "thunderagent": _trend(220, 350, 383, 372)},
        {"thunderagent": Paper(2.65, approx=False), "continuum": Paper(1.52, approx=False)},
        _coding_hits(24, 96),
        {"round_robin": Paper(47), "thunderagent": Paper(9)}, Paper(0.19, approx=False),
    ),
    ServingCase(
        "openhands", "OpenHands on SWE-bench, GLM-4.6 FP8, one 8×H100 TP8 backend", (24, 48, 72, 96),
        {"round_robin": {96: Paper(52)}, "continuum": {96: Paper(57)}, "thunderagent": {96: Paper(187)}},
        {"thunderagent": Paper(3.58, approx=False), "continuum": Paper(1.08, approx=False)},
        _coding_hits(24, 96),
        {"round_robin": Paper(56), "thunderagent": Paper(13)}, Paper(0.24, approx=False),
    ),
    ServingCase(
        "toolorchestra", "ToolOrchestra on HLE, Qwen3-8B FP16, one RTX 5090", (24, 32, 40, 48),
        {"round_robin": {48: Paper(4.8)}, "continuum": {48: Paper(3.1)}, "thunderagent": {48: Paper(7.1)}},
        {"thunderagent": Paper(1.48, approx=False), "continuum": Paper(0.65, approx=False)},
        {("round_robin", 48): Paper(12), ("continuum", 48): Paper(22, 29),
         ("thunderagent", 24): Paper(28), ("thunderagent", 48): Paper(18)},
    ),
)


def serving_case(preset: str) -> ServingCase:
    return next(case for case in SERVING if case.preset == preset)


# Fig. 1b: plain vLLM on SWE-agent, GLM-4.6; "up to 7.14x" latency inflation is the text's figure.
THRASHING_PRESET = "swe-agent"
THRASHING_HIT = {24: Paper(98), 48: Paper(49), 72: Paper(32), 96: Paper(32)}
THRASHING_E2E = {24: Paper(7.7), 48: Paper(41), 72: Paper(55), 96: Paper(56)}
THRASHING_INFLATION = Paper(7.14, approx=False)


@dataclass(frozen=True)
class RlCase:
    """One row pair of paper Table 2; ``serving`` is the preset with the same program shape."""

    preset: str
    title: str
    serving: str
    baseline: Paper  # vLLM + SGLang Model Gateway, steps/min
    thunderagent: Paper

    @property
    def ratio(self) -> Paper:
        """ThunderAgent over the baseline, exact since both sides are table values."""
        return Paper(self.thunderagent.value / self.baseline.value, approx=False)


RL: tuple[RlCase, ...] = (
    RlCase("rl-mini-swe-agent", "mini-SWE-agent", "swe-agent", Paper(375.4, approx=False), Paper(671.8, approx=False)),
    RlCase("rl-openhands", "OpenHands", "openhands", Paper(69.1, approx=False), Paper(270.8, approx=False)),
)
