"""Host (CPU) KV tier sizing: how many blocks a scenario's ``cluster.engine.host_tier`` holds.
Paths cited are in vLLM 0.31's installed package (``cpu/`` is ``vllm/v1/kv_offload/cpu/``)."""

from __future__ import annotations

PAGE_BYTES = 4096  # vLLM rounds each host chunk up to a whole mmap page (cpu/shared_offload_region.py:87)


def host_capacity_blocks(
    block_size: int,
    *,
    blocks: int | None = None,
    gib: float | None = None,
    kv_bytes_per_token: int = 0,
    ratio: float | None = None,
    gpu_blocks: int = 0,
    sglang: bool = False,
) -> int:
    """Host slots from exactly one of:

    * ``blocks``: as given (Dynamo mocker's ``--num-host-blocks``);
    * ``gib``: vLLM's ``--kv-offloading-size`` (GiB, summed over TP ranks): ``int(gib * 2**30)``
      bytes over a block's ``block_size * kv_bytes_per_token`` bytes rounded up to a 4096-byte
      page (vllm/config/vllm.py:1124-1158, cpu/spec.py:104-120); with ``sglang``, SGLang's
      ``hicache_size`` arithmetic on those bytes instead (``HostKVCache.__init__``):
      ``(bytes // kv_bytes_per_token // page + 1) * page`` tokens, a page of one block;
    * ``ratio``: SGLang's ``hicache_ratio`` of the GPU pool, as Dynamo sizes SGLang's host cache
      (dynamo/sglang/capacity.py:181-225, the newer SGLang rounding): ``(int(G * ratio) // page
      + 1) * page`` tokens with ``G = gpu_blocks * block_size`` and a page of one block. Always
      one page more than the ratio when it divides evenly, as SGLang allocates.
    """
    if sum(size is not None for size in (blocks, gib, ratio)) != 1:
        raise ValueError("give exactly one of blocks, gib and ratio")
    if blocks is not None:
        return blocks
    if gib is not None:
        if kv_bytes_per_token <= 0:
            raise ValueError("sizing the host tier in GiB needs kv_bytes_per_token")
        if sglang:
            return int(gib * (1 << 30)) // kv_bytes_per_token // block_size + 1
        block_bytes = -(-block_size * kv_bytes_per_token // PAGE_BYTES) * PAGE_BYTES
        return int(gib * (1 << 30)) // block_bytes
    assert ratio is not None
    if gpu_blocks <= 0:
        raise ValueError("sizing the host tier by a ratio needs gpu_blocks")
    return int(gpu_blocks * block_size * ratio) // block_size + 1


def native_offload_tokens(gpu_tokens: int, host_tokens: int, write_policy: str) -> int:
    """The host KV capacity an SGLang worker publishes to Dynamo 1.6.1's router as
    ``native_offloading_capacity.total_tokens`` (dynamo/sglang/capacity.py:181-225): what its
    host tier of ``host_tokens`` holds beyond its GPU pool of ``gpu_tokens``, 0 for nothing.

    * ``write_back``: the whole host pool (a block leaves the GPU for the host: the pools are disjoint);
    * ``write_through``: ``host - GPU`` (every GPU block is mirrored on the host), nothing when
      that is not positive;
    * ``write_through_selective`` (or anything else): nothing, its overlap with the GPU being dynamic.

    Nothing either without a GPU or a host pool. Dynamo reads ``host_tokens`` from the scheduler
    (``hicache_host_total_tokens``) or, without it, sizes it as SGLang does from
    ``hicache_ratio``: ``(int(G * ratio) // page + 1) * page``, which is how
    `host_capacity_blocks` sizes a ``ratio`` tier.
    """
    if gpu_tokens <= 0 or host_tokens <= 0:
        return 0
    if write_policy == "write_back":
        return host_tokens
    if write_policy == "write_through":
        return max(host_tokens - gpu_tokens, 0)
    return 0
