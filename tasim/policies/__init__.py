"""Policies and their registry: scenario files and the CLI name policies by these keys.

A policy is pure decision logic: no I/O, no clock, no knowledge of the world that hosts it.
May import: `tasim.core` only (the host, simulation and live mode import policies, never the
reverse).
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel

from tasim.native import search_path

__path__ = search_path(__name__, __path__)

from tasim.core.cluster_view import ClusterView
from tasim.policies.autellix import Autellix
from tasim.policies.baselines import LeastLoaded, RandomRouting
from tasim.policies.cache_aware import CacheAware
from tasim.policies.continuum import Continuum
from tasim.policies.interface import Hold, Pause, Pin, Policy, Release, Resume, Route, TurnEnd
from tasim.policies.kv_router import KvRouter
from tasim.policies.round_robin import RoundRobin
from tasim.policies.thunderagent import ThunderAgent

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (RoundRobin, RandomRouting, LeastLoaded, KvRouter, CacheAware, ThunderAgent, Continuum, Autellix)
}


def policy_class(name: str) -> type[Policy]:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {reprlib.repr(name)} (allowed: {', '.join(sorted(POLICIES))})") from None


def validate_params(name: str, params: Mapping[str, Any]) -> BaseModel:
    """Raises pydantic.ValidationError for bad parameters."""
    return policy_class(name).params_model.model_validate(dict(params))


def make_policy(name: str, params: Mapping[str, Any], view: ClusterView, rng: np.random.Generator) -> Policy:
    cls = policy_class(name)
    return cls(view, validate_params(name, params), rng)


__all__ = ["POLICIES", "Hold", "Pause", "Pin", "Policy", "Release", "Resume", "Route", "TurnEnd", "make_policy", "policy_class", "validate_params"]
