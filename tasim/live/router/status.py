"""What the router reports about itself: a JSON status snapshot and Prometheus metrics.

Metrics are rendered from the router's own counters on each scrape (no global registry), so
several routers in one test process never collide.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import numpy as np

from tasim.live.router.decisions import Decisions
from tasim.live.router.kv_events import KvEventSubscriber
from tasim.live.router.live_host import PolicyHost


class RouterState(Protocol):
    """What the status reads of the router (`tasim.live.router.service`), which calls it."""

    @property
    def host(self) -> PolicyHost: ...
    @property
    def ready(self) -> bool: ...
    @property
    def instance_of(self) -> Mapping[str, int]: ...
    @property
    def decisions(self) -> Decisions: ...
    @property
    def kv(self) -> KvEventSubscriber: ...


def _percentiles_ms(seconds: Iterable[float]) -> dict[str, float | None]:
    arr = np.fromiter(seconds, dtype=float) * 1e3
    if not arr.size:
        return {"p50": None, "p99": None, "max": None}
    p50, p99 = np.percentile(arr, [50, 99])
    return {"p50": float(p50), "p99": float(p99), "max": float(arr.max())}


def _number(value: float) -> str:
    """Exact integers (counters stay exact past a million); floats in full precision."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def status_snapshot(router: RouterState) -> dict[str, Any]:
    host = router.host
    return {
        "ready": router.ready,
        "policy": host.policy.name,
        "time_s": host.clock(),
        "workers": {
            w: {
                "instance_id": router.instance_of.get(w),
                "serving": w not in host.lost,
                "routed": host.routed[w],
                "in_flight": host.in_flight_on[w],
                "cached_blocks": host.cached_blocks(w),
            }
            for w in host.routed
        },
        "programs": {
            "live": len(host.programs),
            "held": sum(1 for p in host.programs.values() if p.held),
            "expired": host.expired,
            "unknown_finals": host.unknown_finals,
            "table": {
                p.id: {"parent": p.parent, "turn": p.turn, "history_tokens": p.history_tokens, "in_flight": p.in_flight, "held": bool(p.held)}
                for p in host.programs.values()
            },
        },
        "requests": {
            "in_flight": host.in_flight,
            "finished": host.finished,
            "failed": host.failed,
            "retried": host.retried,
            "refused": host.refused,
            "session_finals": host.session_finals,
        },
        "pinned_calls": {"unreported": len(router.decisions.calls), "expired": router.decisions.unreported},
        "weight_sync": {
            "in_progress": host.syncing is not None,
            "version": host.syncing[0] if host.syncing else None,
            "since_s": host.syncing[1] if host.syncing else None,
            "synced_version": host.synced_version,
            "syncs": host.weight_syncs,
        },
        "pauses": host.pauses,
        "resumes": host.resumes,
        "ignored_pins": host.ignored_pins,
        "decision_ms": _percentiles_ms(host.decision_seconds),
        "kv_events": {"messages": router.kv.messages, "gaps": dict(router.kv.gaps)},
    }


def prometheus_text(router: RouterState) -> str:
    host = router.host
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP tasim_router_{name} {help_text}")
        lines.append(f"# TYPE tasim_router_{name} {kind}")
        lines.extend(f"tasim_router_{name}{labels} {_number(value)}" for labels, value in samples)

    metric("requests_routed_total", "counter", "Requests routed, by worker.", [(f'{{worker="{w}"}}', n) for w, n in host.routed.items()])
    metric("requests_finished_total", "counter", "Requests that completed.", [("", host.finished)])
    metric("requests_failed_total", "counter", "Requests that failed or were cancelled.", [("", host.failed)])
    metric("requests_retried_total", "counter", "Requests sent again because their worker was lost.", [("", host.retried)])
    metric("requests_refused_total", "counter", "Requests refused because no worker was serving.", [("", host.refused)])
    metric(
        "worker_serving", "gauge", "1 while the worker serves, 0 while it is lost.", [(f'{{worker="{w}"}}', w not in host.lost) for w in host.routed]
    )
    metric("requests_in_flight", "gauge", "Requests routed and not yet finished.", [("", host.in_flight)])
    metric("worker_requests_in_flight", "gauge", "Requests in flight, by worker.", [(f'{{worker="{w}"}}', n) for w, n in host.in_flight_on.items()])
    metric("programs_live", "gauge", "Programs in the router's table.", [("", len(host.programs))])
    metric("programs_held", "gauge", "Programs whose call waits for a resume.", [("", sum(bool(p.held) for p in host.programs.values()))])
    metric("pauses_total", "counter", "Program pauses.", [("", host.pauses)])
    metric("resumes_total", "counter", "Program resumes.", [("", host.resumes)])
    metric("session_finals_total", "counter", "Session-final requests (program ends).", [("", host.session_finals)])
    metric("session_finals_unknown_total", "counter", "Session-finals for programs not in the table.", [("", host.unknown_finals)])
    metric("programs_expired_total", "counter", "Programs ended by the idle TTL.", [("", host.expired)])
    metric("weight_sync_in_progress", "gauge", "1 between a trainer's weight sync begin and its end.", [("", host.syncing is not None)])
    metric("weight_syncs_total", "counter", "Weight syncs ended.", [("", host.weight_syncs)])
    metric(
        "cached_blocks",
        "gauge",
        "Blocks each worker reports cached (KV events).",
        [(f'{{worker="{w}"}}', host.cached_blocks(w)) for w in host.routed],
    )
    metric("kv_event_gaps_total", "counter", "Gaps in a worker's KV event sequence.", [(f'{{worker="{w}"}}', n) for w, n in router.kv.gaps.items()])
    decisions = _percentiles_ms(host.decision_seconds)
    quantiles = [(f'{{quantile="{q}"}}', decisions[key]) for q, key in (("0.5", "p50"), ("0.99", "p99"))]
    metric("decision_ms", "gauge", "Routing decision time over the last 100,000 requests.", [(label, v) for label, v in quantiles if v is not None])
    if decisions["max"] is not None:
        metric("decision_max_ms", "gauge", "Slowest routing decision of the last 100,000 requests.", [("", decisions["max"])])
    return "\n".join(lines) + "\n"
