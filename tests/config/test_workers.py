"""`tasim.config.workers`: the cluster as policies see it, host capacity published included."""

from __future__ import annotations

from conftest import TINY

from tasim.config.scenario import load_scenario
from tasim.config.workers import cluster_view, native_offload_tokens


def test_workers_publish_no_host_capacity_without_a_tier_or_with_vllms() -> None:
    """Dynamo 1.6.1's vLLM worker publishes no native offloading capacity, offloading or not; only
    a tier with SGLang's semantics does (by write policy: tasim.config.host_sizing)."""
    plain = cluster_view(load_scenario(TINY))
    assert {w.native_offload_tokens for w in plain.workers} == {0}
    tiered = load_scenario(TINY, ["cluster.engine.host_tier.ratio=2"])
    assert tiered.cluster.host_blocks_per_worker() > 0
    assert {w.native_offload_tokens for w in cluster_view(tiered).workers} == {0}


def test_a_tier_with_sglang_semantics_publishes_by_its_write_policy() -> None:
    """By the tier's write policy (SGLang's default write_through when unset): G = the GPU pool,
    H = the tier's slots, both in tokens."""
    base = ["cluster.engine.host_tier.ratio=2", "cluster.engine.host_tier.semantics=sglang"]
    cluster = load_scenario(TINY, base).cluster
    bs = cluster.engine.block_size
    gpu, host = cluster.cache_blocks_per_worker() * bs, cluster.host_blocks_per_worker() * bs
    assert host > gpu
    for write_policy, published in ((None, host - gpu), ("write_through", host - gpu), ("write_back", host), ("write_through_selective", 0)):
        chosen = [f"cluster.engine.host_tier.write_policy={write_policy}"] if write_policy else []
        assert native_offload_tokens(load_scenario(TINY, base + chosen).cluster) == published
