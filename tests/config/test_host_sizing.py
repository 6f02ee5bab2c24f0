"""Host tier sizing: blocks, GiB (vLLM) or a ratio of the GPU pool (SGLang)."""

from __future__ import annotations

import re

import pytest

from tasim.config.host_sizing import host_capacity_blocks, native_offload_tokens
from tasim.config.scenario import ScenarioError, parse_scenario

BS = 16


def test_host_capacity() -> None:
    assert host_capacity_blocks(BS, blocks=100) == 100
    # 16 tokens x 128 KiB = 2 MiB a block: 512 in a GiB.
    assert host_capacity_blocks(BS, gib=1, kv_bytes_per_token=131072) == 512
    # vLLM's CPU oracle: a 64-byte block takes a 4096-byte page, so N pages give N blocks.
    assert host_capacity_blocks(BS, gib=64 * 4096 / 2**30, kv_bytes_per_token=4) == 64
    # SGLang's hicache_ratio: (int(G * ratio) // page + 1) * page tokens.
    assert host_capacity_blocks(BS, ratio=2.0, gpu_blocks=8) == 17
    assert host_capacity_blocks(BS, ratio=0.5, gpu_blocks=10) == 6
    # SGLang's hicache_size arithmetic on GiB: bytes // bytes per token, a page more
    assert host_capacity_blocks(BS, gib=1, kv_bytes_per_token=131072, sglang=True) == 513
    assert host_capacity_blocks(BS, gib=1, kv_bytes_per_token=100_000, sglang=True) == 10737 // 16 + 1
    for bad in ({}, {"blocks": 1, "ratio": 2.0}, {"gib": 1.0}, {"ratio": 2.0}):
        with pytest.raises(ValueError):
            host_capacity_blocks(BS, **bad)  # type: ignore[arg-type]


def _cluster(**tier: object) -> dict[str, object]:
    return {"model": "Llama-3.1-8B", "engine": {"block_size": 16, "kv_blocks": 1001, "host_tier": tier}}


def test_a_scenario_sizes_its_host_tier() -> None:
    raw = {"workload": {"concurrency": 1}}
    # 1000 GPU blocks beside vLLM's null block; SGLang's ratio sizing adds a page
    assert parse_scenario({**raw, "cluster": _cluster(ratio=2)}, "s.yaml").cluster.host_blocks_per_worker() == 2001
    # Llama-3.1-8B in bf16: 128 KiB a token, 2 MiB a block
    assert parse_scenario({**raw, "cluster": _cluster(gib=1)}, "s.yaml").cluster.host_blocks_per_worker() == 512
    assert parse_scenario({**raw, "cluster": _cluster(gib=1, kv_bytes_per_token=4096)}, "s.yaml").cluster.host_blocks_per_worker() == 16384
    sglang = parse_scenario({**raw, "cluster": _cluster(gib=1, semantics="sglang")}, "s.yaml")
    assert sglang.cluster.host_blocks_per_worker() == 513
    plain = parse_scenario(raw, "s.yaml")
    assert plain.cluster.engine.host_tier is None and plain.cluster.host_blocks_per_worker() == 0
    # --set makes the mapping under the unset field
    tiered = parse_scenario(raw, "s.yaml", ["cluster.engine.host_tier.ratio=2"])
    assert tiered.cluster.engine.host_tier is not None and tiered.cluster.engine.host_tier.d2h_gbps == 32.0


@pytest.mark.parametrize(
    ("tier", "engine", "message"),
    [
        ({"blocks": 8, "ratio": 2}, {}, "give exactly one of blocks, gib and ratio (got blocks, ratio)"),
        ({}, {}, "give exactly one of blocks, gib and ratio (got none)"),
        ({"ratio": 2}, {"enable_prefix_caching": False}, "host_tier needs enable_prefix_caching"),
        ({"gib": 1e-6}, {}, "engine.host_tier holds no block"),
        ({"ratio": 2, "semantics": "lmcache"}, {}, "Input should be 'vllm', 'sglang' or 'dynamo_mocker'"),
        ({"ratio": 2, "write_policy": "write_back"}, {}, "write_policy is SGLang HiCache's: set semantics: sglang, or leave it unset"),
        ({"ratio": 2, "load_back_threshold": 5}, {}, "load_back_threshold is SGLang HiCache's: set semantics: sglang, or leave it unset"),
        ({"ratio": 2, "semantics": "sglang", "store_threshold": 2}, {}, "store_threshold is vLLM's: SGLang writes by write_policy"),
        ({"ratio": 2, "semantics": "sglang", "write_policy": "write_around"}, {}, "Input should be 'write_through'"),
    ],
)
def test_a_bad_host_tier_is_refused_in_one_line(tier: dict[str, object], engine: dict[str, object], message: str) -> None:
    cluster = _cluster(**tier)
    cluster["engine"] = {**cluster["engine"], **engine}  # type: ignore[dict-item]
    with pytest.raises(ScenarioError, match=re.escape(message)) as error:
        parse_scenario({"workload": {"concurrency": 1}, "cluster": cluster}, "s.yaml")
    assert "\n" not in str(error.value)


def test_rl_rollouts_that_empty_caches_take_only_a_tier_that_is_emptied_with_them() -> None:
    """A weight update empties vLLM's and SGLang's host tiers with the GPU caches; Dynamo
    mocker's has no reset: refused with one, taken without."""
    rollout = {"kind": "rl_rollout", "prompts_per_step": 2, "samples_per_prompt": 2, "steps": 1}
    for semantics in ("vllm", "sglang"):
        parsed = parse_scenario({"workload": rollout, "cluster": _cluster(ratio=2, semantics=semantics)}, "s.yaml")
        assert parsed.cluster.engine.host_tier is not None
    expected = "cluster.engine.host_tier.semantics dynamo_mocker with workload.reset_prefix_cache: a weight update does not empty that tier"
    with pytest.raises(ScenarioError, match=re.escape(expected)) as error:
        parse_scenario({"workload": rollout, "cluster": _cluster(ratio=2, semantics="dynamo_mocker")}, "s.yaml")
    assert "\n" not in str(error.value)
    kept = parse_scenario({"workload": {**rollout, "reset_prefix_cache": False}, "cluster": _cluster(ratio=2, semantics="dynamo_mocker")}, "s.yaml")
    assert kept.cluster.engine.host_tier is not None


def test_native_offload_tokens_by_write_policy() -> None:
    """dynamo/sglang/capacity.py: write_back publishes H, write_through H - G (nothing when not
    positive), write_through_selective nothing; nothing without a GPU or host pool."""
    assert native_offload_tokens(1600, 3216, "write_back") == 3216
    assert native_offload_tokens(1600, 3216, "write_through") == 1616
    assert native_offload_tokens(1600, 1600, "write_through") == 0
    assert native_offload_tokens(1600, 800, "write_through") == 0
    assert native_offload_tokens(1600, 800, "write_back") == 800
    assert native_offload_tokens(1600, 3216, "write_through_selective") == 0
    assert native_offload_tokens(0, 3216, "write_back") == 0
    assert native_offload_tokens(1600, 0, "write_back") == 0


def test_ratio_tier_holds_what_dynamo_computes_for_sglang() -> None:
    """Dynamo's fallback when SGLang does not report its host pool: H = (int(G x ratio) // page + 1)
    x page; with a page of one block, G = 100 blocks of 16 tokens and ratio 2: (3200 // 16 + 1) x
    16 = 3216 tokens = 201 blocks; published under write_through: 3216 - 1600 = 1616."""
    blocks = host_capacity_blocks(16, ratio=2.0, gpu_blocks=100)
    assert blocks * 16 == (int(1600 * 2.0) // 16 + 1) * 16 == 3216
    assert native_offload_tokens(1600, blocks * 16, "write_through") == 1616
