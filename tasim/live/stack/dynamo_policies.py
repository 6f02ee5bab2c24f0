"""Dynamo 1.6.1's own Rust routing plug-ins as live baselines (``live.routing: dynamo-*``).

The frontend runs ``--router-mode kv --router-policy-config FILE`` and decides itself; no tasim
code is in the request path. Two plug-ins ship in the 1.6.1 frontend:

* ``dynamo-thunderagent``: its native ThunderAgent (program admission, pause and resume, and
  worker selection), the peer of tasim's ``thunderagent``;
* ``dynamo-two-tier``: ``dynamo-two-tier-cost-fn``, SGLang's cache-aware selection, the peer of
  tasim's ``cache_aware``.

A scenario names the tasim policy the plug-in is held against (``policy.name``), and the plug-in
gets that policy's values for every knob both have, so the comparison is of implementations, not
of settings; a knob set explicitly that the plug-in lacks is refused rather than dropped.
Durations are divided by the live ``time_scale``, because the frontend's clock is the wall's.
1.6.1 refuses unknown keys, so only keys it parses are written (checked against the wheel).

The Rust ThunderAgent reports nothing per request about holds; the only trace of its pauses is
its debug log line "ThunderAgent scheduler state changed" (written when its state changes, at
most once per scheduler pass), which `pause_snapshots` reads from the frontend's JSON log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasim.config.scenario import Scenario
from tasim.core.errors import LiveError
from tasim.policies import policy_class

# live.routing value → (tasim policy it is held against, the plug-in's instance type)
PLUGINS = {"dynamo-thunderagent": ("thunderagent", "thunderagent"), "dynamo-two-tier": ("cache_aware", "dynamo-two-tier-cost-fn")}

# tasim's ThunderAgent knob → the Rust classifier's (True: a duration, scaled by time_scale).
_THUNDERAGENT_KNOBS = {
    "pause_threshold": ("pause_threshold", False),
    "pause_target": ("pause_target", False),
    "resume_hysteresis": ("resume_hysteresis", False),
    "scheduler_interval_s": ("scheduler_interval_seconds", True),
    "acting_token_weight": ("acting_token_weight", False),
    "acting_decay_tau_s": ("acting_decay_tau_seconds", True),
    "buffer_per_program": ("buffer_per_program", False),
    "resume_timeout_s": ("resume_timeout_seconds", True),
}
_TWO_TIER_KNOBS = {name: (name, False) for name in ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold")}
# Knobs that say nothing about routing itself (tasim's session-affinity base of every policy is
# only used when set; the plug-ins have none).
_NEUTRAL = frozenset({"variant"})

STATE_CHANGED = "ThunderAgent scheduler state changed"


class PluginConfigError(LiveError):
    """The scenario cannot be run on Dynamo's plug-in; the message says what and why."""


def plugin_config(scenario: Scenario, time_scale: float) -> dict[str, Any]:
    """The ``--router-policy-config`` document for ``scenario.live.routing``."""
    routing = scenario.live.routing
    peer, plugin = PLUGINS[routing]
    if scenario.policy.name != peer:
        raise PluginConfigError(f"live.routing {routing} runs Dynamo's peer of tasim's {peer}: set policy.name={peer} (got {scenario.policy.name})")
    given = dict(scenario.policy.params)
    knobs = _THUNDERAGENT_KNOBS if peer == "thunderagent" else _TWO_TIER_KNOBS
    unmapped = sorted(set(given) - set(knobs) - _NEUTRAL)
    if unmapped:
        raise PluginConfigError(
            f"live.routing {routing}: Dynamo's plug-in has no counterpart of {peer} parameter(s) {', '.join(unmapped)} "
            f"(it takes: {', '.join(sorted(knobs))})"
        )
    effective = policy_class(peer).params_model.model_validate(given).model_dump()
    parameters: dict[str, Any] = {}
    for knob, (key, duration) in knobs.items():
        value = effective[knob]
        if value is not None:  # None: tasim's "off" (no decay), which the plug-in cannot express
            parameters[key] = value / time_scale if duration else value
    if peer == "cache_aware":
        return {"worker_selection": {"aggregated": "two_tier", "instances": [{"name": "two_tier", "type": plugin, "parameters": parameters}]}}
    ttl = scenario.live.program_idle_ttl_s
    if ttl is not None:  # the plug-in's forgetting of idle programs, as the tasim router's idle TTL
        parameters["session_retention_seconds"] = ttl / time_scale
    return {
        "request_classifier": {"type": plugin, "parameters": parameters},
        "worker_selection": {"aggregated": "thunderagent", "instances": [{"name": "thunderagent", "type": plugin}]},
    }


@dataclass(frozen=True, slots=True)
class PauseSnapshot:
    """One "state changed" record of the Rust ThunderAgent's scheduler."""

    programs: int
    active: int
    paused: int
    waiting_requests: int


def pause_snapshots(frontend_log: Path) -> Iterator[PauseSnapshot]:
    """The scheduler's state changes, from the frontend's JSON log (``DYN_LOGGING_JSONL``)."""
    with open(frontend_log, encoding="utf-8", errors="replace") as log:
        for line in log:
            if STATE_CHANGED not in line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("message") == STATE_CHANGED:
                yield PauseSnapshot(
                    int(record.get("programs", 0)),
                    int(record.get("active_programs", 0)),
                    int(record.get("paused_programs", 0)),
                    int(record.get("waiting_requests", 0)),
                )


def plugin_summary(frontend_log: Path) -> dict[str, Any]:
    """What the Rust ThunderAgent's log says of its pauses: how many state changes it logged,
    in how many of them programs were paused, and the most paused at once."""
    snapshots = list(pause_snapshots(frontend_log))
    return {
        "state_changes": len(snapshots),
        "with_paused_programs": sum(1 for s in snapshots if s.paused),
        "peak_paused_programs": max((s.paused for s in snapshots), default=0),
        "peak_waiting_requests": max((s.waiting_requests for s in snapshots), default=0),
    }
