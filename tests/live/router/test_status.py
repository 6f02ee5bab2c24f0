"""`tasim.live.router.status`: the router's Prometheus metrics and JSON status snapshot."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

# the live extra
pytest.importorskip("msgpack")
pytest.importorskip("zmq")
pytest.importorskip("xxhash")

from conftest import kv_event_frames as _frames  # noqa: E402
from conftest import live_host as _host  # noqa: E402
from conftest import tokens as _tokens  # noqa: E402

from tasim.live.router.kv_events import KvEventSubscriber  # noqa: E402
from tasim.live.router.status import prometheus_text, status_snapshot  # noqa: E402


def _router() -> SimpleNamespace:
    host, clock, _ = _host()
    kv = KvEventSubscriber({}, host.kv_event)
    decisions = SimpleNamespace(calls={"q.0": None}, unreported=2)  # pin mode's calls handed out and not reported
    return SimpleNamespace(host=host, instance_of={"w0": 101, "w1": 102}, kv=kv, decisions=decisions, ready=True, clock=clock)


def test_prometheus_text_and_status_snapshot() -> None:
    router = _router()
    host = router.host

    async def go() -> None:
        host.finish(await host.admit("p", _tokens(20), 4), 20, 4, 0)
        await host.admit("p", _tokens(40), 4)

    asyncio.run(go())
    for program in ("gone1", "gone2", "gone3"):
        assert host.session_final(program) is False
    router.kv._receive("w0", _frames(1, [{"type": "BlockStored", "block_hashes": [1, 2]}]))
    router.kv._receive("w0", _frames(3, [{"type": "BlockRemoved", "block_hashes": [2]}]))
    router.kv._receive("w1", _frames(1, [{"type": "BlockStored", "block_hashes": [7, 8, 9]}]))
    router.clock.t = 12.5
    assert host.worker_lost("w1", "test") and not host.worker_lost("w1", "again")
    text = prometheus_text(router)
    assert text.endswith("\n")
    lines = text.splitlines()
    for line in (
        'tasim_router_requests_routed_total{worker="w0"} 1',
        'tasim_router_requests_routed_total{worker="w1"} 1',
        "tasim_router_requests_finished_total 1",
        "tasim_router_requests_failed_total 0",
        "tasim_router_requests_in_flight 1",
        "tasim_router_programs_live 1",
        "tasim_router_programs_held 0",
        "tasim_router_pauses_total 0",
        "tasim_router_resumes_total 0",
        "tasim_router_session_finals_total 3",
        "tasim_router_session_finals_unknown_total 3",
        "tasim_router_programs_expired_total 0",
        "tasim_router_weight_sync_in_progress 0",
        "tasim_router_weight_syncs_total 0",
        'tasim_router_cached_blocks{worker="w0"} 1',
        'tasim_router_cached_blocks{worker="w1"} 0',  # a lost worker's cache went with it
        'tasim_router_kv_event_gaps_total{worker="w0"} 1',
        "tasim_router_requests_retried_total 0",
        "tasim_router_requests_refused_total 0",
        'tasim_router_worker_serving{worker="w0"} 1',
        'tasim_router_worker_serving{worker="w1"} 0',
        'tasim_router_worker_requests_in_flight{worker="w1"} 1',
        "# TYPE tasim_router_requests_routed_total counter",
        "# TYPE tasim_router_requests_in_flight gauge",
    ):
        assert line in lines, line
    assert [line.split(" ")[0] for line in lines if line.startswith("tasim_router_decision")] == [
        'tasim_router_decision_ms{quantile="0.5"}',
        'tasim_router_decision_ms{quantile="0.99"}',
        "tasim_router_decision_max_ms",
    ]
    assert all(line.startswith("# ") or len(line.split(" ")) == 2 for line in lines)

    snapshot = status_snapshot(router)
    decision = snapshot.pop("decision_ms")
    assert set(decision) == {"p50", "p99", "max"} and all(v is not None and v >= 0 for v in decision.values())
    assert snapshot == {
        "ready": True,
        "policy": "round_robin",
        "time_s": 12.5,
        "workers": {
            "w0": {"instance_id": 101, "serving": True, "routed": 1, "in_flight": 0, "cached_blocks": 1},
            "w1": {"instance_id": 102, "serving": False, "routed": 1, "in_flight": 1, "cached_blocks": 0},
        },
        "programs": {
            "live": 1,
            "held": 0,
            "expired": 0,
            "unknown_finals": 3,
            "table": {"p": {"parent": None, "turn": 1, "history_tokens": 24, "in_flight": 1, "held": False}},
        },
        "requests": {"in_flight": 1, "finished": 1, "failed": 0, "retried": 0, "refused": 0, "session_finals": 3},
        "pinned_calls": {"unreported": 1, "expired": 2},
        "weight_sync": {"in_progress": False, "version": None, "since_s": None, "synced_version": None, "syncs": 0},
        "pauses": 0,
        "resumes": 0,
        "ignored_pins": 0,
        "kv_events": {"messages": 3, "gaps": {"w0": 1}},
    }


def test_status_with_no_decisions_yet() -> None:
    router = _router()
    assert status_snapshot(router)["decision_ms"] == {"p50": None, "p99": None, "max": None}
    assert "decision_ms{" not in prometheus_text(router)


def test_prometheus_counters_are_exact_above_a_million() -> None:
    router = _router()
    router.host.routed["w0"] = 1_234_567
    assert 'tasim_router_requests_routed_total{worker="w0"} 1234567' in prometheus_text(router).splitlines()


def test_status_shows_a_weight_sync_in_progress_and_the_last_one_synced() -> None:
    router = _router()
    host = router.host
    router.clock.t = 3.0
    assert host.begin_weight_sync(4)
    assert status_snapshot(router)["weight_sync"] == {"in_progress": True, "version": 4, "since_s": 3.0, "synced_version": None, "syncs": 0}
    assert "tasim_router_weight_sync_in_progress 1" in prometheus_text(router).splitlines()
    router.clock.t = 5.0
    assert host.end_weight_sync(4) == 0
    assert status_snapshot(router)["weight_sync"] == {"in_progress": False, "version": None, "since_s": None, "synced_version": 4, "syncs": 1}
    lines = prometheus_text(router).splitlines()
    assert "tasim_router_weight_sync_in_progress 0" in lines and "tasim_router_weight_syncs_total 1" in lines
