"""SGLang's cache-aware routing as Dynamo 1.6.1 ships it: the router plug-in
``dynamo-two-tier-cost-fn`` (``--router-mode kv --router-policy-config FILE`` with a
``worker_selection`` instance of that type; a port of sgl-router's ``cache_aware_zmq`` policy).

Per request, over the eligible workers, with ``A_w`` the requests this router has sent to
``w`` that have not ended and ``O_w`` the leading full prompt blocks ``w`` holds (its prefix
index, fed by KV events):

1. **Load tier**: if ``max A - min A > balance_abs_threshold`` and ``max A >
   balance_rel_threshold * min A`` (both strict), the least-loaded worker.
2. **Cache tier**: else, if ``max O / ceil(ISL / block size) > cache_threshold`` (strict), the
   least-loaded worker among those holding exactly ``max O`` blocks.
3. Else the least-loaded worker.

Least-loaded takes the first minimum in the order the router lists its workers. Dynamo lists them
from a hash map seeded anew in every process, so that order is arbitrary but fixed while the
workers stay the same; tasim draws it once per run from the policy's seeded stream. There is no
other randomness, no temperature and no prefill or block term: load is a request count, booked
when a request is routed and freed when it ends. The overlap is the device tier's, as the plug-in
reads it: host and disk tier events are ignored.

Source: ai-dynamo 1.6.1, ``lib/router-plugins/builtin/src/two_tier_cost_fn.rs`` (the three-knob
version; its defaults, validation and comparisons checked against the 1.6.1 wheel's compiled
router). With session affinity a program's later requests go to its worker, as in every Dynamo
router mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
from pydantic import ConfigDict, Field

from tasim.core.cluster_view import ClusterView
from tasim.core.kv_tier import KvTier
from tasim.core.model import BlockHash, RequestSpec, blocks_for
from tasim.policies.interface import ProgramDecision
from tasim.policies.prefix_index import EventIndex
from tasim.policies.session_affinity import AffinityParams, LoadCountingRouter


class CacheAwareParams(AffinityParams):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    cache_threshold: float = Field(0.5, ge=0, le=1, description="the cache tier applies above this share of the prompt's blocks cached")
    balance_abs_threshold: int = Field(32, ge=0, description="the load tier needs a spread of active requests above this")
    balance_rel_threshold: float = Field(1.1, ge=1, description="... and the busiest above this multiple of the least busy")


class CacheAware(LoadCountingRouter[CacheAwareParams]):
    name: ClassVar[str] = "cache_aware"
    summary: ClassVar[str] = "SGLang's cache-aware routing as Dynamo 1.6.1 ships it: balance load when skewed, else the best cache hit"
    params_model = CacheAwareParams
    wants_kv_events = True

    def __init__(self, view: ClusterView, params: CacheAwareParams, rng: np.random.Generator) -> None:
        super().__init__(view, params, rng)
        workers = view.worker_ids
        self.block_size = view.workers[0].block_size
        self.index = EventIndex(workers)
        # the fixed, arbitrary order in which the router lists its workers (see the module docstring)
        self._order = [workers[i] for i in rng.permutation(len(workers))]

    def choose(self, request: RequestSpec, now: float) -> str:
        p = self.params
        serving = set(self.serving)
        rows = [w for w in self._order if w in serving]
        active = self.active
        loads = [active[w] for w in rows]
        low, high = min(loads), max(loads)
        if high - low > p.balance_abs_threshold and high > p.balance_rel_threshold * low:
            return self._least_loaded(rows)
        overlaps = self.index.overlaps(request.prompt_block_hashes(self.block_size), now)
        best = max(overlaps[w] for w in rows)
        blocks = blocks_for(request.prompt_tokens, self.block_size)
        if (best / blocks if blocks else 0.0) > p.cache_threshold:
            return self._least_loaded([w for w in rows if overlaps[w] == best])
        return self._least_loaded(rows)

    def _least_loaded(self, rows: list[str]) -> str:
        """The first worker with the fewest active requests."""
        active = self.active
        return min(rows, key=active.__getitem__)

    def on_worker_lost(self, worker: str, now: float) -> Sequence[ProgramDecision]:
        super().on_worker_lost(worker, now)
        self.index.forget(worker)
        return ()

    def on_kv_stored(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        if tier == "device":
            self.index.stored(worker, blocks, now)

    def on_kv_removed(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        if tier == "device":
            self.index.removed(worker, blocks, now)
