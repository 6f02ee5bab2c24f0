"""Per-request records and the metrics both simulators are judged by, with the tolerances of
the fidelity target (output throughput 3 %, prefix reuse 2 pp, mean TTFT 10 %, mean TPOT 5 %)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from tasim.core.records import record


@record
class RequestRecord:
    """One completed request; times in ms from the start of the replay."""

    arrival_ms: float
    first_token_ms: float
    finish_ms: float
    input_tokens: int
    output_tokens: int
    reused_tokens: int  # largest prefix-cache hit over its admissions (Dynamo's definition)
    first_reused_tokens: int  # prefix-cache hit at the first admission


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    label: str
    unit: str
    tolerance: float | None = None  # relative, or absolute for a ratio metric
    absolute: bool = False  # tolerance and difference in absolute units (prefix reuse)


METRICS: tuple[Metric, ...] = (
    Metric("output_tok_s", "output throughput", "tok/s", 0.03),
    Metric("request_per_s", "request throughput", "req/s"),
    Metric("ttft_mean_ms", "TTFT mean", "ms", 0.10),
    Metric("ttft_p50_ms", "TTFT p50", "ms"),
    Metric("ttft_p99_ms", "TTFT p99", "ms"),
    Metric("tpot_mean_ms", "TPOT mean", "ms", 0.05),
    Metric("e2e_mean_ms", "E2E mean", "ms"),
    Metric("prefix_reuse", "prefix reuse", "ratio", 0.02, absolute=True),
    Metric("first_admission_reuse", "prefix reuse, 1st admission", "ratio", 0.02, absolute=True),
    Metric("wall_s", "wall time", "s"),
)


def summarize(records: Sequence[RequestRecord], wall_s: float) -> dict[str, float]:
    """The metrics of one run. Throughputs divide by the span from the first arrival to the
    last completion; TPOT is a request's (E2E − TTFT) / (output − 1), over requests with more
    than one output token; prefix reuse is reused over input tokens, all requests pooled, with
    a request's largest hit over its admissions (Dynamo's headline ratio; a readmission can hit
    its own generated blocks) and with its first admission's."""
    if not records:
        raise ValueError("no completed requests to summarize")
    arrival = np.array([r.arrival_ms for r in records])
    first = np.array([r.first_token_ms for r in records])
    finish = np.array([r.finish_ms for r in records])
    output = np.array([r.output_tokens for r in records])
    span_s = (finish.max() - arrival.min()) / 1000.0
    ttft = first - arrival
    several = output > 1
    tpot = (finish[several] - first[several]) / (output[several] - 1)
    input_tokens = sum(r.input_tokens for r in records)
    return {
        "requests": float(len(records)),
        "output_tok_s": float(output.sum() / span_s) if span_s > 0 else 0.0,
        "request_per_s": len(records) / span_s if span_s > 0 else 0.0,
        "ttft_mean_ms": float(ttft.mean()),
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_p99_ms": float(np.percentile(ttft, 99)),
        "tpot_mean_ms": float(tpot.mean()) if tpot.size else 0.0,
        "e2e_mean_ms": float((finish - arrival).mean()),
        "prefix_reuse": sum(r.reused_tokens for r in records) / input_tokens if input_tokens else 0.0,
        "first_admission_reuse": sum(r.first_reused_tokens for r in records) / input_tokens if input_tokens else 0.0,
        "wall_s": wall_s,
    }


@dataclass(frozen=True, slots=True)
class Difference:
    """``noise``: what run-to-run randomness alone can put between the two sides' means, in the
    units of `value` (two standard errors of the difference of means; 0 for single runs)."""

    metric: Metric
    dynamo: float
    tasim: float
    noise: float = 0.0

    @property
    def value(self) -> float:
        """tasim − Dynamo: absolute for ratio metrics, else relative to Dynamo."""
        if self.metric.absolute:
            return self.tasim - self.dynamo
        if self.dynamo == 0:
            return 0.0 if self.tasim == 0 else float("inf")
        return (self.tasim - self.dynamo) / self.dynamo

    @property
    def within(self) -> bool | None:
        """Whether the difference is inside the metric's tolerance, widened by the noise of
        randomized runs (None: no tolerance set)."""
        tolerance = self.metric.tolerance
        return None if tolerance is None else abs(self.value) <= tolerance + self.noise + 1e-12

    def shown(self) -> str:
        unit, scale, digits = ("pp", 100, 2) if self.metric.absolute else ("%", 100, 1)
        noise = f" ± {self.noise * scale:.{digits}f}" if self.noise else ""
        return f"{self.value * scale:+.{digits}f}{noise} {unit}"


def differences(
    dynamo: dict[str, float],
    tasim: dict[str, float],
    dynamo_runs: Sequence[dict[str, float]] = (),
    tasim_runs: Sequence[dict[str, float]] = (),
) -> list[Difference]:
    """Per metric, tasim − Dynamo on the means; given each side's runs, with the noise
    allowance of randomized runs (tie-breaks at random: Dynamo's are unseeded, tasim's seeded
    per run), so that a comparison of means is not failed by the luck of the draw."""
    return [Difference(metric, dynamo[metric.key], tasim[metric.key], _noise(metric, dynamo, dynamo_runs, tasim_runs)) for metric in METRICS]


def _noise(metric: Metric, dynamo: dict[str, float], dynamo_runs: Sequence[dict[str, float]], tasim_runs: Sequence[dict[str, float]]) -> float:
    if len(dynamo_runs) < 2 or len(tasim_runs) < 2:
        return 0.0
    variance = sum(statistics.variance([run[metric.key] for run in runs]) / len(runs) for runs in (dynamo_runs, tasim_runs))
    spread = 2.0 * math.sqrt(variance)
    if metric.absolute:
        return spread
    scale = abs(dynamo[metric.key])
    return spread / scale if scale else 0.0


def all_within(diffs: Iterable[Difference]) -> bool:
    return all(d.within is not False for d in diffs)
