"""Dynamo 1.6.1's ``DefaultWorkerScorer``: the cost of sending a request to one worker (the
formula is in `tasim.policies.kv_router`), host and disk tier credit included. Its weights are plain numbers here, taken once from
the router's parameters, so that the cost is compiled with the simulator's core
(`tasim.native`): the KV router asks it for every worker on every request, and a pydantic
parameter model, which holds the weights in the router, is not mypyc's to compile."""

from __future__ import annotations


class WorkerCost:
    def __init__(
        self,
        block_size: int,
        overlap_score_credit: float,
        overlap_score_credit_decay: float,
        prefill_load_scale: float,
        decode_active_request_weight: float,
        track_prefill_tokens: bool,
        host_cache_hit_weight: float = 0.75,
        disk_cache_hit_weight: float = 0.25,
    ) -> None:
        self.block_size = block_size
        self.credit = overlap_score_credit  # c
        self.decay = overlap_score_credit_decay  # d
        self.prefill_scale = prefill_load_scale  # L
        self.request_weight = decode_active_request_weight  # r
        self.track_prefill = track_prefill_tokens
        self.host_weight = host_cache_hit_weight  # h
        self.disk_weight = disk_cache_hit_weight  # k

    def __call__(
        self,
        prompt_tokens: int,
        prefill_tokens: int,
        min_prefill_tokens: int,
        overlap_blocks: int,
        active_blocks: int,
        new_blocks: int,
        active_requests: int,
        host_blocks: int = 0,
        disk_blocks: int = 0,
    ) -> float:
        """The cost (lower is better). Each operation in the order Dynamo's scorer (and the
        interpreted version of this) takes them, so compiled and plain give the same float.
        ``overlap_blocks`` is the device match; ``host_blocks`` and ``disk_blocks`` the lower
        tiers' runs beyond it (`tasim.policies.prefix_index.EventIndex.lower_runs`). Adding
        their zero credit leaves a device-only credit's float as it was."""
        bs = self.block_size
        decay = 1.0
        d = self.decay
        if d > 0:
            request_blocks = max(1, -(-prompt_tokens // bs))
            decay = 1.0 / (1.0 + d * ((prefill_tokens - min_prefill_tokens) / bs) / request_blocks)
        credit = self.credit * decay * overlap_blocks + self.host_weight * host_blocks + self.disk_weight * disk_blocks
        raw = (prefill_tokens + prompt_tokens) / bs if self.track_prefill else 0.0
        uncached = raw - credit
        if not uncached > 0.0:  # max(0.0, raw - credit), -0.0 and NaN included
            uncached = 0.0
        return self.prefill_scale * uncached + (active_blocks + new_blocks) + self.request_weight * active_requests
