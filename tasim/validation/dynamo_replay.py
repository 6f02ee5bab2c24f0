"""Dynamo's side: its offline replay (mocker engines + the real Rust router in virtual time)."""

from __future__ import annotations

import gc
import os
import time
from typing import Any, Literal

from tasim.config.scenario import ClusterConfig
from tasim.live.stack.engines import PREEMPTION_MODE
from tasim.validation import ValidationUnavailable
from tasim.validation.measures import RequestRecord
from tasim.validation.workload_trace import ReplayTrace

Router = Literal["round_robin", "kv_router"]
ROUTERS: tuple[Router, ...] = ("round_robin", "kv_router")


class DynamoUnavailable(ValidationUnavailable):
    """Dynamo's replay cannot be imported here; the message says how to install it."""


def engine_args(cluster: ClusterConfig) -> dict[str, Any]:
    """The mocker engine configuration equal to the scenario's engine (polynomial timing)."""
    engine = cluster.engine
    args: dict[str, Any] = {
        "engine": {
            "block_size": engine.block_size,
            "num_gpu_blocks": cluster.kv_blocks_per_worker(),
            "max_num_seqs": engine.max_num_seqs,
            "max_num_batched_tokens": engine.max_num_batched_tokens,
            "enable_prefix_caching": engine.enable_prefix_caching,
            "enable_chunked_prefill": engine.enable_chunked_prefill,
            "preemption_mode": PREEMPTION_MODE[engine.preemption],
            "speedup_ratio": cluster.perf.speedup_ratio,
            "timing_model": {"type": "polynomial"},
        }
    }
    if engine.host_tier is not None:
        args["engine"].update(host_offload_args(cluster))
    return args


def host_offload_args(cluster: ClusterConfig) -> dict[str, Any]:
    """The mocker's native G2 tier equal to the scenario's host tier: its size in blocks, both
    lanes' bandwidths, and the KV bytes per token that time a copy. The mocker copies
    ``block_size x kv_cache_bytes_per_token`` bytes per block; tasim copies one TP rank's share
    (`tasim.sim.runner.host_tier_setup`), so the figure given is a rank's."""
    tier = cluster.engine.host_tier
    assert tier is not None
    per_rank, remainder = divmod(cluster.kv_bytes_per_token(), cluster.tp)
    if remainder:
        raise DynamoUnavailable(f"cluster.tp {cluster.tp} does not divide the {cluster.kv_bytes_per_token()} KV bytes per token")
    return {
        "native_host_offload": {
            "num_host_blocks": cluster.host_blocks_per_worker(),
            "d2h_bandwidth_gbps": tier.d2h_gbps,
            "h2d_bandwidth_gbps": tier.h2d_gbps,
        },
        "kv_cache_bytes_per_token": per_rank,
    }


def run_dynamo(trace: ReplayTrace, cluster: ClusterConfig, router: Router) -> tuple[list[RequestRecord], int, float]:
    """Completed requests, the number that did not complete, and the wall time in seconds."""
    os.environ.setdefault("DYN_LOG", "error")  # its warnings repeat per rejected request
    try:
        from dynamo.replay.api import run_trace_replay
    except ImportError as exc:
        raise DynamoUnavailable(f"Dynamo's replay is not importable ({exc}); install the optional extra: make install (see README)") from None
    gc.collect()  # as tasim's side does before its run
    started = time.perf_counter()
    try:
        report = run_trace_replay(
            [str(trace.path)],
            num_workers=cluster.backends,
            router_mode=router,
            trace_block_size=trace.trace_block_size,
            arrival_speedup_ratio=trace.arrival_speedup,
            extra_engine_args=engine_args(cluster),
            capture_per_request=True,
        )
    except Exception as exc:  # the Rust side raises plain Exceptions, e.g. its invariant checks
        raise DynamoUnavailable(f"Dynamo's replay failed ({router}): {exc}") from None
    wall = time.perf_counter() - started
    per_request = report.per_request
    assert per_request is not None  # asked for with capture_per_request=True
    records = [
        RequestRecord(
            arrival_ms=r["arrival_time_ms"],
            first_token_ms=r["first_token_ms"],
            finish_ms=r["terminal_time_ms"],
            input_tokens=r["input_length"],
            output_tokens=r["output_length"],
            reused_tokens=r["reused_input_tokens"],
            first_reused_tokens=r["admission_history"][0]["reused_input_tokens"],
        )
        for r in per_request
        if r["terminal_status"] == "completed"
    ]
    return records, len(per_request) - len(records), wall
