"""Perf models: how long one engine step takes. Chosen by ``cluster.perf.model``. They may be
compiled: see `tasim.native`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasim.native import search_path

__path__ = search_path(__name__, __path__)

from tasim.sim.perf.fixed import FixedStep
from tasim.sim.perf.perf_model import PerfModel, StepShape
from tasim.sim.perf.polynomial import DynamoPolynomial
from tasim.sim.perf.roofline import Roofline

if TYPE_CHECKING:
    from tasim.config.scenario import ClusterConfig


def make_perf_model(cluster: ClusterConfig) -> PerfModel:
    from tasim.config import hardware

    perf = cluster.perf
    if perf.model == "dynamo_polynomial":
        return DynamoPolynomial(perf.speedup_ratio)
    if perf.model == "fixed":
        return FixedStep(perf.step_ms, perf.speedup_ratio)
    return Roofline(
        hardware.models()[cluster.model],
        hardware.gpus()[cluster.gpu],
        cluster.tp,
        cluster.weight_dtype,
        cluster.kv_cache_dtype,
        perf.mfu,
        perf.bandwidth_efficiency,
        perf.step_overhead_ms,
        perf.allreduce_latency_us,
        perf.speedup_ratio,
    )


__all__ = ["DynamoPolynomial", "FixedStep", "PerfModel", "Roofline", "StepShape", "make_perf_model"]
