"""`ClusterView`: the read-only picture of the cluster a policy may consult.

It holds what both worlds know up front about each worker (its KV pool and batch limits);
anything dynamic a policy needs (load, cached prefixes) it builds from the notifications it
receives, exactly as Dynamo's router builds its view from its own bookings and KV events.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """``native_offload_tokens``: the host KV capacity the worker publishes beyond its GPU pool,
    as an SGLang worker publishes Dynamo 1.6.1's ``native_offloading_capacity`` (0: none; see
    `tasim.config.workers.native_offload_tokens`)."""

    id: str
    block_size: int
    kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    native_offload_tokens: int = 0

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_blocks * self.block_size


@dataclass(frozen=True, slots=True)
class ClusterView:
    workers: tuple[WorkerInfo, ...]

    @property
    def worker_ids(self) -> tuple[str, ...]:
        return tuple(w.id for w in self.workers)

    def worker(self, worker_id: str) -> WorkerInfo:
        for info in self.workers:
            if info.id == worker_id:
                return info
        raise KeyError(worker_id)
