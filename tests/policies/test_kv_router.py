"""Dynamo KV router: cost formula, test vectors measured on live Dynamo, picking, indexes."""

from __future__ import annotations

import numpy as np
import pytest

from tasim.core.cluster_view import ClusterView, WorkerInfo
from tasim.core.model import RequestSpec
from tasim.policies import TurnEnd, make_policy
from tasim.policies.kv_router import KvRouter, KvRouterParams, worker_cost
from tasim.policies.prefix_index import ApproxIndex, EventIndex, PredictOnRouteIndex


def _view(workers: int = 2, block_size: int = 16, kv_blocks: int = 10_000) -> ClusterView:
    return ClusterView(tuple(WorkerInfo(f"w{i}", block_size, kv_blocks, 256, 8192) for i in range(workers)))


def _router(seed: int = 0, workers: int = 2, **params) -> KvRouter:
    policy = make_policy("kv_router", params, _view(workers), np.random.default_rng(seed))
    assert isinstance(policy, KvRouter)
    return policy


def _request(rid: str, tokens: int, base: int = 1000, program: str = "p") -> RequestSpec:
    return RequestSpec(rid, program, 0, tokens, 10, 0, tuple(base + i for i in range(tokens // 16)))


def test_live_dynamo_vectors_on_two_idle_workers() -> None:
    router = _router()
    # 36-token prompt: 36/16 prefill blocks + 2 new full blocks = 4.25 (measured on Dynamo 1.6.1)
    costs, _ = router.costs(_request("a", 36), now=0.0)
    assert costs == {"w0": 4.25, "w1": 4.25}
    cold = _request("b", 3515)
    costs, _ = router.costs(cold, now=0.0)
    assert costs["w0"] == pytest.approx(438.6875)  # 219.6875 + 219: Dynamo logged 438.69
    route = router.on_request(cold, now=0.0)
    router.on_first_token("b", route.worker, now=0.1)
    router.on_turn_end(TurnEnd("p", "b", route.worker, 3515, 10, 0), now=0.2)
    router.on_kv_stored(route.worker, cold.block_hashes[:219], now=0.05)
    costs, overlaps = router.costs(_request("c", 3515), now=1.0)
    assert overlaps[route.worker] == 219
    assert costs[route.worker] == pytest.approx(219.6875)  # (219.6875 - 219 cached) + 219 blocks: Dynamo 219.69
    other = "w1" if route.worker == "w0" else "w0"
    assert costs[other] == pytest.approx(438.6875)


def test_cost_formula_terms() -> None:
    p = KvRouterParams(prefill_load_scale=2.0, decode_active_request_weight=0.5, overlap_score_credit=1.0)
    # L * max(0, (P + ISL)/bs - credit) + (A + X) + r * N = 2 * (320 + 160)/16 - 10 ... exact:
    assert worker_cost(p, 16)(160, 320, 0, 10, 7, 3, 4) == 2.0 * ((320 + 160) / 16 - 10) + (7 + 3) + 0.5 * 4
    # prefill term is clamped at zero when the cached credit exceeds it
    assert worker_cost(p, 16)(32, 0, 0, 50, 0, 0, 0) == 0.0
    # decay shrinks credit on workers with more queued prefill than the least loaded one
    d = KvRouterParams(overlap_score_credit_decay=1.0)
    decay = 1 / (1 + 1.0 * ((640 - 0) / 16) / 10)  # request of 160 tokens = 10 blocks
    assert worker_cost(d, 16)(160, 640, 0, 8, 0, 0, 0) == pytest.approx((640 + 160) / 16 - 8 * decay)
    assert worker_cost(KvRouterParams(router_track_prefill_tokens=False), 16)(160, 640, 0, 8, 5, 2, 1) == 7.0


def test_bookings_track_prefill_until_first_token_and_blocks_until_end() -> None:
    router = _router()
    first = _request("a", 160, base=0)
    worker = router.on_request(first, now=0.0).worker
    assert router._prefill[worker] == 160 and router._active[worker].distinct == 10
    # a second request sharing 5 blocks: X counts only its 5 new blocks on that worker
    costs, _ = router.costs(RequestSpec("b", "q", 0, 160, 10, 0, tuple(range(5)) + tuple(range(500, 505))), now=0.0)
    assert costs[worker] == pytest.approx((160 + 160) / 16 + 10 + 5)
    router.on_first_token("a", worker, now=0.5)
    assert router._prefill[worker] == 0 and router._active[worker].distinct == 10
    router.on_turn_end(TurnEnd("p", "a", worker, 160, 10, 0), now=1.0)
    assert router._active[worker].distinct == 0 and router._requests[worker] == 0


def test_ties_broken_by_seeded_rng() -> None:
    picks = [_router(seed=s).on_request(_request("a", 64), 0.0).worker for s in range(12)]
    assert set(picks) == {"w0", "w1"}
    assert picks == [_router(seed=s).on_request(_request("a", 64), 0.0).worker for s in range(12)]
    # with load on w0 there is no tie: the idle worker wins regardless of seed
    router = _router(seed=3)
    router.on_request(_request("x", 1600, base=9000), 0.0)
    loaded = next(w for w in ("w0", "w1") if router._requests[w])
    assert router.on_request(_request("y", 64), 0.0).worker != loaded


def test_temperature_samples_cheaper_workers_more_often() -> None:
    router = _router(seed=1, router_temperature=0.5)
    router.on_request(_request("load", 3200, base=5000), 0.0)
    loaded = next(w for w in ("w0", "w1") if router._requests[w])
    counts = {"w0": 0, "w1": 0}
    for i in range(400):
        costs, _ = router.costs(_request(f"r{i}", 64, base=100), 0.0)
        counts[router._pick(costs)] += 1
    # costs ~ 4 vs ~404: p(loaded) = exp(-1 / 0.5) / (1 + exp(-2)) = 0.119
    assert counts[loaded] / 400 == pytest.approx(np.exp(-2) / (1 + np.exp(-2)), abs=0.05)


def test_approx_index_ttl_expiry_and_refresh() -> None:
    index = ApproxIndex(["w0", "w1"], ttl_s=120.0)
    index.routed("w0", (1, 2, 3), now=0.0)
    assert index.overlaps((1, 2, 3, 4), now=119.9) == {"w0": 3, "w1": 0}
    index.routed("w0", (1, 2), now=100.0)  # re-routing the prefix refreshes its TTL
    assert index.overlaps((1, 2, 3), now=120.0) == {"w0": 2, "w1": 0}  # block 3 expired at 120
    assert index.overlaps((1, 2, 3), now=220.0) == {"w0": 0, "w1": 0}
    assert index.size() == 0


def test_approx_index_size_guard_prunes_earliest_and_deepest() -> None:
    index = ApproxIndex(["w0"], ttl_s=10.0, max_size=10)
    index.routed("w0", tuple(range(8)), now=0.0)
    index.routed("w0", tuple(range(100, 104)), now=1.0)  # 12 blocks > 10: prune to 8
    assert index.size() == 8
    # the four earliest-expiring blocks go, deepest first: 7, 6, 5, 4
    assert index.overlaps(tuple(range(8)), now=2.0) == {"w0": 4}
    assert index.overlaps(tuple(range(100, 104)), now=2.0) == {"w0": 4}


def test_event_index_with_lag() -> None:
    index = EventIndex(["w0"], lag_s=0.5)
    index.stored("w0", (1, 2), now=1.0)
    assert index.overlaps((1, 2), now=1.2) == {"w0": 0}
    assert index.overlaps((1, 2), now=1.5) == {"w0": 2}
    index.removed("w0", (2,), now=2.0)
    assert index.overlaps((1, 2), now=2.6) == {"w0": 1}


def test_approximate_mode_routes_repeat_prompt_to_same_worker() -> None:
    router = _router(seed=0, use_kv_events=False)
    first = router.on_request(_request("a", 320), 0.0).worker
    router.on_first_token("a", first, 0.1)
    router.on_turn_end(TurnEnd("p", "a", first, 320, 10, 0), 0.2)
    assert not router.wants_kv_events
    assert all(router.on_request(_request(f"r{i}", 320), 1.0 + i).worker == first for i in range(1))


def test_predict_on_route_credits_a_routed_prefix_before_its_events() -> None:
    """--router-predicted-ttl-secs: the routed prompt counts as cached on its worker at once; a
    worker's overlap is the larger of the event index's and the prediction's, and the
    prediction lapses after its TTL (refreshed by a later routing of the same blocks)."""
    router = _router(seed=0, router_predicted_ttl_secs=10.0)
    assert isinstance(router.index, PredictOnRouteIndex) and router.wants_kv_events
    first = router.on_request(_request("a", 320), 0.0).worker  # 20 blocks, no KV event yet
    other = "w1" if first == "w0" else "w0"
    router.on_first_token("a", first, 0.1)
    router.on_turn_end(TurnEnd("p", "a", first, 320, 10, 0), 0.2)
    costs, overlaps = router.costs(_request("b", 320), 5.0)
    assert overlaps == {first: 20, other: 0}
    assert costs[first] == pytest.approx(20 - 20 + 20) and costs[other] == pytest.approx(20 + 20)
    router.on_kv_stored(other, _request("x", 160).block_hashes, 6.0)  # events name 10 blocks there
    assert router.costs(_request("b", 320), 6.0)[1] == {first: 20, other: 10}
    assert router.costs(_request("b", 320), 10.0)[1] == {first: 0, other: 10}  # 10 s after routing
    plain = _router(seed=0)
    plain.on_request(_request("a", 320), 0.0)
    assert plain.costs(_request("b", 320), 5.0)[1] == {"w0": 0, "w1": 0}
    with pytest.raises(ValueError, match="needs use_kv_events"):
        KvRouterParams(router_predicted_ttl_secs=5.0, use_kv_events=False)


def test_credit_zero_builds_no_index() -> None:
    router = _router(overlap_score_credit=0.0)
    assert router.index is None and not router.wants_kv_events


def test_session_affinity_hard_binds_until_idle_ttl() -> None:
    router = _router(seed=0, session_affinity_ttl_s=30.0)
    first = router.on_request(_request("a", 64, program="s"), 0.0).worker
    router.on_turn_end(TurnEnd("s", "a", first, 64, 10, 0), 1.0)
    # pile load on the bound worker: hard affinity still sends the session there
    for i in range(3):
        router.on_request(_request(f"x{i}", 3200, base=7000 + 1000 * i, program=f"o{i}"), 1.0)
    assert router.on_request(_request("b", 64, program="s"), 20.0).worker == first
    router.on_turn_end(TurnEnd("s", "b", first, 64, 10, 0), 21.0)
    assert router.sessions.get("s") is not None
    router.on_request(_request("c", 64, program="s"), 52.0)  # idle 31 s > 30 s: binding expired
    binding = router.sessions.get("s")
    assert binding is not None and binding.last_used == 52.0


def test_soft_affinity_leaves_a_busy_worker() -> None:
    router = _router(
        seed=0, session_affinity_ttl_s=30.0, session_affinity_mode="soft", active_decode_blocks_threshold=0.001
    )  # busy above 10 active blocks
    first = router.on_request(_request("a", 320, program="s"), 0.0).worker  # books 20 blocks
    assert router.on_request(_request("b", 64, program="s"), 1.0).worker != first


def test_booked_blocks_match_a_count_per_block() -> None:
    """The router's booked prompts kept as runs of blocks agree with a plain count per block on
    distinct blocks and booked prefixes, whatever the prompts share or where they diverge."""
    from collections import Counter

    from tasim.core.model import Segment, chained_block_hashes
    from tasim.policies.booked_blocks import BookedBlocks

    rng = np.random.default_rng(7)
    bs = 16

    system, task_lengths = 120, [0, 40, 170, 300, 333]  # an owner's content is the same everywhere

    tails = iter(range(100, 1 << 30))  # each private tail has an owner of its own

    def prompt() -> tuple[int, ...]:
        # the shared system prompt, one of 5 task prompts, then a private tail of random length
        task = int(rng.integers(5))
        end = system + task_lengths[task]
        segments = [Segment(system, 0), Segment(end, 1 + task), Segment(end + int(rng.integers(0, 300)), next(tails))]
        return tuple(chained_block_hashes(segments, bs)[: int(rng.integers(0, 40))])

    for _ in range(100):
        booked, counts, prompts = BookedBlocks(), Counter[int](), []
        for _ in range(int(rng.integers(0, 30))):
            if prompts and rng.random() < 0.4:
                gone = prompts.pop(int(rng.integers(len(prompts))))
                booked.unbook(gone)
                counts.subtract(gone)
                counts = +counts
            else:
                prompts.append(prompt())
                booked.book(prompts[-1])
                counts.update(prompts[-1])
            assert booked.distinct == len(counts)
            probe = prompt()
            assert booked.prefix(probe) == sum(h in counts for h in probe)


# --- host and disk tiers (Dynamo 1.6.1's lower-tier credit) ---------------------------------------


def test_host_only_prefix_is_credited_at_the_host_weight_as_in_dynamos_replay() -> None:
    """Dynamo 1.6.1's replay (2 workers, block 16, kv_router): an 80-token request whose 4-block
    prefix sat only in worker 1's host tier went there with reported_overlap_tokens 48 = 0.75 x 4
    blocks x 16. Costs: w0 = 80/16 + 5 new blocks = 10; w1 = (5 - 0.75 x 4) + 5 = 7."""
    router = _router()
    router.on_kv_stored("w1", (1, 2, 3, 4), 0.0, "host")
    request = RequestSpec("d", "p", 0, 80, 2, 0, (1, 2, 3, 4, 30))
    assert router.costs(request, 1.0) == ({"w0": 10.0, "w1": 7.0}, {"w0": 0, "w1": 0})
    assert router.tier_overlaps(request, 1.0) == {"w0": (0, 0, 0), "w1": (0, 4, 0)}
    assert router.cached_tokens(request, 1.0) == {"w0": 0, "w1": 48}
    assert router.on_request(request, 1.0).worker == "w1"
    # booked prefill = 80 - 48 = 32 tokens: a 1-block request now costs (32 + 16)/16 + 5 + 1 there
    costs, _ = router.costs(RequestSpec("e", "q", 0, 16, 2, 0, (99,)), 1.0)
    assert costs == {"w0": 2.0, "w1": 9.0}


def test_tiers_are_exclusive_and_walked_device_then_host_then_disk() -> None:
    """A block on the GPU and the host counts once, as device; the host run starts where the
    device match stopped and the disk run where the host run stopped, each without a gap."""
    router = _router(workers=1)
    router.on_kv_stored("w0", (1, 2), 0.0)
    router.on_kv_stored("w0", (1, 2, 3, 4), 0.0, "host")
    router.on_kv_stored("w0", (1, 5, 6, 8), 0.0, "disk")
    request = RequestSpec("r", "p", 0, 128, 2, 0, (1, 2, 3, 4, 5, 6, 7, 8))
    assert router.tier_overlaps(request, 1.0) == {"w0": (2, 2, 2)}
    # credit = 1 x 2 + 0.75 x 2 + 0.25 x 2 = 4 blocks: 128/16 - 4 + 8 new blocks
    assert router.costs(request, 1.0)[0] == {"w0": 12.0}
    assert router.cached_tokens(request, 1.0) == {"w0": 64}  # (2 + 1.5 + 0.5) x 16
    gap = RequestSpec("g", "p", 0, 64, 2, 0, (1, 9, 3, 4))  # block 9 nowhere: nothing after it counts
    assert router.tier_overlaps(gap, 1.0) == {"w0": (1, 0, 0)}


def test_device_removal_leaves_the_host_copy_and_host_removal_the_device_one() -> None:
    router = _router(workers=1)
    request = RequestSpec("r", "p", 0, 64, 2, 0, (1, 2, 3, 4))
    router.on_kv_stored("w0", (1, 2, 3, 4), 0.0)
    router.on_kv_stored("w0", (1, 2, 3, 4), 0.0, "host")
    assert router.tier_overlaps(request, 1.0) == {"w0": (4, 0, 0)}
    router.on_kv_removed("w0", (3, 4), 1.0)
    assert router.tier_overlaps(request, 1.0) == {"w0": (2, 2, 0)}
    router.on_kv_removed("w0", (1, 2, 3, 4), 2.0, "host")
    assert router.tier_overlaps(request, 2.0) == {"w0": (2, 0, 0)}
    router.on_kv_stored("w0", (3, 4), 3.0, "host")
    router.on_worker_lost("w0", 4.0)  # every tier of a lost worker goes
    assert router.index is not None and router.index.size() == 0


def test_tier_weights_are_parameters_and_the_credit_is_clamped() -> None:
    request = RequestSpec("r", "p", 0, 64, 2, 0, (1, 2, 3, 4))
    for weights, cost in (({}, 64 / 16 - 0.75 * 4 + 4), ({"host_cache_hit_weight": 0.0}, 4.0 + 4), ({"host_cache_hit_weight": 2.0}, 0.0 + 4)):
        router = _router(workers=1, **weights)
        router.on_kv_stored("w0", (1, 2, 3, 4), 0.0, "host")
        assert router.costs(request, 1.0)[0] == {"w0": cost}
    p = KvRouterParams(host_cache_hit_weight=0.5, disk_cache_hit_weight=0.125)
    # credit = 1 x 3 + 0.5 x 2 + 0.125 x 4 = 4.5 blocks of a 10-block prompt, + 10 new blocks
    assert worker_cost(p, 16)(160, 0, 0, 3, 0, 10, 0, 2, 4) == 10 - 4.5 + 10
    assert KvRouterParams().host_cache_hit_weight == 0.75 and KvRouterParams().disk_cache_hit_weight == 0.25


def test_cached_tokens_round_half_away_from_zero_as_rust_does() -> None:
    router = _router(workers=1, host_cache_hit_weight=0.40625)  # 13/32: one block is 6.5 tokens
    router.on_kv_stored("w0", (1,), 0.0, "host")
    assert router.cached_tokens(RequestSpec("r", "p", 0, 32, 2, 0, (1, 2)), 1.0) == {"w0": 7}


def test_lower_tier_events_keep_their_tier_through_the_event_lag() -> None:
    index = EventIndex(["w0"], lag_s=1.0)
    index.stored("w0", (1, 2), 0.0, "host")
    assert index.overlaps((1, 2), 0.5) == {"w0": 0} and not index.lower_tiers
    device = index.overlaps((1, 2), 1.0)
    assert device == {"w0": 0} and index.lower_tiers and index.lower_runs((1, 2), device) == {"w0": (2, 0)}


def test_approximate_and_predicted_indexes_with_lower_tiers() -> None:
    """Approximate mode hears no events, of any tier; predict-on-route continues the events'
    lower tiers from the merged device match."""
    approx = _router(use_kv_events=False)
    approx.on_kv_stored("w0", (1, 2), 0.0, "host")
    assert approx.tier_overlaps(RequestSpec("r", "p", 0, 32, 2, 0, (1, 2)), 1.0) == {"w0": (0, 0, 0), "w1": (0, 0, 0)}
    router = _router(seed=0, workers=1, router_predicted_ttl_secs=10.0)
    router.on_kv_stored("w0", (1, 2, 3, 4), 0.0, "host")
    router.on_request(RequestSpec("a", "p", 0, 32, 2, 0, (1, 2)), 0.0)  # predicted on w0: blocks 1, 2
    assert router.tier_overlaps(RequestSpec("b", "p", 0, 64, 2, 0, (1, 2, 3, 4)), 1.0) == {"w0": (2, 2, 0)}
