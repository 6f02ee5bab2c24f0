"""The scenario's workers as the policies see them (`ClusterView`): built alike by the
simulator and the live router, so a policy meets the same cluster in both worlds."""

from __future__ import annotations

from tasim.config.host_sizing import native_offload_tokens as published_offload_tokens
from tasim.config.scenario import ClusterConfig, Scenario
from tasim.core.cluster_view import ClusterView, WorkerInfo


def cluster_view(scenario: Scenario) -> ClusterView:
    """The scenario's workers, named ``w0 … wN-1``: identical in simulation and live mode."""
    cluster = scenario.cluster
    engine = cluster.engine
    blocks = cluster.cache_blocks_per_worker()
    offload = native_offload_tokens(cluster)
    return ClusterView(
        tuple(
            WorkerInfo(f"w{i}", engine.block_size, blocks, engine.max_num_seqs, engine.max_num_batched_tokens, offload)
            for i in range(cluster.backends)
        )
    )


def native_offload_tokens(cluster: ClusterConfig) -> int:
    """The host KV capacity each worker publishes beyond its GPU pool, as Dynamo 1.6.1's workers
    do: only its SGLang worker publishes one (dynamo/sglang/capacity.py, by HiCache write policy:
    `tasim.config.host_sizing.native_offload_tokens`); its vLLM worker publishes none, with
    ``--kv-offloading-size`` or without. So a host tier with ``semantics: vllm`` counts for
    nothing here, and one with SGLang's semantics by its write policy. The host pool is the tier's size as tasim sizes it, as if
    the engine reported it (``hicache_host_total_tokens``); Dynamo computes the same figure itself
    for a ``ratio`` tier."""
    tier = cluster.engine.host_tier
    if tier is None or tier.semantics != "sglang":
        return 0
    block_size = cluster.engine.block_size
    gpu_tokens = cluster.cache_blocks_per_worker() * block_size
    return published_offload_tokens(gpu_tokens, cluster.host_blocks_per_worker() * block_size, tier.sglang_write_policy())
