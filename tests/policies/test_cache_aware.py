"""SGLang's cache-aware routing as Dynamo 1.6.1 ships it (`dynamo-two-tier-cost-fn`): the load
tier, the cache tier and the fallback, each at its strict threshold, least-loaded ties in a fixed
seeded worker order, request counts booked at routing and freed at the turn's end."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from tasim.core.cluster_view import ClusterView, WorkerInfo
from tasim.core.model import RequestSpec
from tasim.policies import TurnEnd, make_policy, validate_params
from tasim.policies.cache_aware import CacheAware

BS = 16


def _policy(workers: int = 3, seed: int = 0, **params: object) -> CacheAware:
    view = ClusterView(tuple(WorkerInfo(f"w{i}", BS, 10_000, 256, 8192) for i in range(workers)))
    policy = make_policy("cache_aware", params, view, np.random.default_rng(seed))
    assert isinstance(policy, CacheAware)
    return policy


def _request(rid: str, tokens: int, program: str | None = None) -> RequestSpec:
    return RequestSpec(rid, program or rid, 0, tokens, 10, 0, tuple(1000 + i for i in range(tokens // BS)))


def _load(policy: CacheAware, worker: str, requests: int) -> None:
    """``requests`` requests routed to ``worker`` and still running."""
    policy.active[worker] += requests


def _cache(policy: CacheAware, worker: str, request: RequestSpec, blocks: int) -> None:
    policy.on_kv_stored(worker, request.block_hashes[:blocks], 0.0)


def test_ties_go_to_the_first_worker_of_a_fixed_seeded_order() -> None:
    policy = _policy(seed=0)
    order = [f"w{i}" for i in np.random.default_rng(0).permutation(3)]
    assert policy._order == order
    first = policy.on_request(_request("a", 160), 0.0).worker
    assert first == order[0]
    # the first is now busier: the next tie is between the other two, in the same order
    assert policy.on_request(_request("b", 160), 0.0).worker == order[1]
    policy.on_turn_end(TurnEnd("a", "a", first, 160, 10, 0), 1.0)
    assert policy.active == {order[0]: 0, order[1]: 1, order[2]: 0}


def test_cache_tier_above_the_threshold_only() -> None:
    policy = _policy()
    warm, *cold = policy._order
    request = _request("r", 160)  # 10 blocks
    _load(policy, warm, 5)
    _cache(policy, warm, request, 6)
    assert policy.choose(request, 0.0) == warm  # 6/10 > 0.5: the warm worker despite 5 requests
    policy.on_kv_removed(warm, request.block_hashes[5:6], 0.0)
    assert policy.choose(request, 0.0) == cold[0]  # 5/10 is not above 0.5: least loaded


def test_the_request_length_rounds_up_and_overlap_counts_full_blocks() -> None:
    policy = _policy(cache_threshold=0.9)
    warm, cold, _ = policy._order
    _load(policy, warm, 1)
    assert policy.choose(_cache_request(policy, warm, 170, 10), 0.0) == warm  # 10 of ceil(170/16) = 11 blocks: 0.909 > 0.9
    policy = _policy(cache_threshold=0.91)
    warm, cold, _ = policy._order
    _load(policy, warm, 1)
    assert policy.choose(_cache_request(policy, warm, 170, 10), 0.0) == cold  # 0.909 is not above 0.91


def _cache_request(policy: CacheAware, worker: str, tokens: int, blocks: int) -> RequestSpec:
    request = _request("c", tokens)
    _cache(policy, worker, request, blocks)
    return request


def test_cache_tier_takes_the_least_loaded_of_the_exact_best_only() -> None:
    policy = _policy(workers=4)
    a, b, c, d = policy._order
    request = _request("r", 160)
    _cache(policy, a, request, 8)
    _cache(policy, b, request, 8)
    _cache(policy, c, request, 7)  # one block short of the best: out, although idle
    _load(policy, a, 3)
    _load(policy, b, 2)
    assert policy.choose(request, 0.0) == b


def test_load_tier_needs_both_gates_strictly() -> None:
    policy = _policy(workers=2)
    warm, cold = policy._order
    request = _request("r", 160)
    _cache(policy, warm, request, 10)
    _load(policy, warm, 32)
    assert policy.choose(request, 0.0) == warm  # spread 32 is not above 32: the cache tier
    _load(policy, warm, 1)
    assert policy.choose(request, 0.0) == cold  # spread 33 and 33 > 1.1 x 0: least loaded
    _load(policy, cold, 400)
    _load(policy, warm, 400)  # 433 against 400: spread 33, but 433 is not above 1.1 x 400
    assert policy.choose(request, 0.0) == warm


def test_session_affinity_binds_and_still_counts() -> None:
    policy = _policy(session_affinity_ttl_s=60.0)
    first = policy.on_request(_request("s.0", 160, program="s"), 0.0).worker
    assert policy.on_request(_request("s.1", 160, program="s"), 1.0).worker == first
    assert policy.active[first] == 2


def test_a_lost_worker_is_neither_chosen_nor_remembered() -> None:
    policy = _policy(workers=2)
    warm, cold = policy._order
    request = _request("r", 160)
    _cache(policy, warm, request, 10)
    policy.on_worker_lost(warm, 0.0)
    assert policy.choose(request, 0.0) == cold
    policy.on_worker_joined(warm, 1.0)
    _load(policy, cold, 1)
    assert policy.index.overlaps(request.prompt_block_hashes(BS), 1.0)[warm] == 0
    assert policy.choose(request, 1.0) == warm  # idle, and its cache is gone


@pytest.mark.parametrize(
    ("params", "field"),
    [({"cache_threshold": 1.5}, "cache_threshold"), ({"balance_rel_threshold": 0.9}, "balance_rel_threshold"), ({"balance_abs": 3}, "balance_abs")],
)
def test_bad_parameters_are_refused(params: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        validate_params("cache_aware", params)
