"""The scenario's workers as the policies see them (`ClusterView`): built alike by the
simulator and the live router, so a policy meets the same cluster in both worlds."""

from __future__ import annotations

from tasim.config.scenario import Scenario
from tasim.core.cluster_view import ClusterView, WorkerInfo


def cluster_view(scenario: Scenario) -> ClusterView:
    """The scenario's workers, named ``w0 … wN-1``: identical in simulation and live mode."""
    cluster = scenario.cluster
    engine = cluster.engine
    blocks = cluster.cache_blocks_per_worker()
    return ClusterView(
        tuple(WorkerInfo(f"w{i}", engine.block_size, blocks, engine.max_num_seqs, engine.max_num_batched_tokens) for i in range(cluster.backends))
    )
