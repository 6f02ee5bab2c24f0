"""ThunderAgent's group_order: the programs of the oldest GRPO group are resumed first and those
of the youngest paused first (groups read from rl_rollout trajectory ids)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from tasim.core.cluster_view import ClusterView, WorkerInfo
from tasim.core.model import RequestSpec
from tasim.policies import Hold, Pause, Route, TurnEnd, make_policy
from tasim.policies.thunderagent import ThunderAgent, ThunderAgentParams


def _ta(**params: object) -> ThunderAgent:
    view = ClusterView((WorkerInfo("w0", 16, 100, 256, 8192),))  # 1,600 tokens
    policy = make_policy("thunderagent", params, view, np.random.default_rng(0))
    assert isinstance(policy, ThunderAgent)
    return policy


def _call(program: str, prompt: int) -> RequestSpec:
    return RequestSpec(f"{program}.0", program, 0, prompt, 10, 0, ())


def _two_groups_over_capacity(ta: ThunderAgent) -> None:
    # the old group's sample ends small (450 tokens), the young group's large (1,000): with the
    # buffers 1,650 tokens of 1,600
    assert ta.on_request(_call("s0.0.0", 300), 0.0) == Route("w0")
    assert ta.on_request(_call("s0.1.0", 300), 1.0) == Route("w0")
    ta.on_turn_end(TurnEnd("s0.0.0", "s0.0.0.0", "w0", 300, 150, 0), 2.0)
    ta.on_turn_end(TurnEnd("s0.1.0", "s0.1.0.0", "w0", 300, 700, 0), 3.0)


@pytest.mark.parametrize(("group_order", "paused"), [(False, "s0.0.0"), (True, "s0.1.0")])
def test_a_full_backend_pauses_the_youngest_groups_program_first(group_order: bool, paused: str) -> None:
    ta = _ta(group_order=group_order)
    _two_groups_over_capacity(ta)
    assert list(ta.on_tick(5.0)) == [Pause(paused)]  # smallest first, or youngest group first


@pytest.mark.parametrize(("group_order", "first"), [(False, "s0.3.0"), (True, "s0.2.0")])
def test_new_programs_resume_oldest_group_first(group_order: bool, first: str) -> None:
    ta = _ta(group_order=group_order)
    _two_groups_over_capacity(ta)
    ta.on_tick(5.0)
    # the queue is not empty: new programs queue behind it
    assert ta.on_request(_call("s0.2.0", 900), 6.0) == Hold(pause=True)
    assert ta.on_request(_call("s0.3.0", 200), 7.0) == Hold(pause=True)
    arrivals = [q.id for q in ta._resume_order(8.0) if q.id in ("s0.2.0", "s0.3.0")]
    assert arrivals[0] == first


def test_a_groups_rank_is_its_first_programs_and_is_forgotten_with_its_last() -> None:
    ta = _ta(group_order=True)
    ta.on_request(_call("s0.1.0", 100), 1.0)
    ta.on_request(_call("s0.0.0", 100), 1.0)  # at the same instant: later in arrival order
    ta.on_request(_call("s0.1.1", 100), 4.0)
    assert [(q.group, q.group_rank) for q in ta.programs.values()] == [("s0.1", 0), ("s0.0", 1), ("s0.1", 0)]
    for program in ("s0.1.0", "s0.0.0", "s0.1.1"):
        ta.on_program_end(program, 5.0)
    assert ta._groups == {}


def test_group_order_refuses_an_explicit_order_it_would_override() -> None:
    with pytest.raises(ValidationError, match="group_order sets the pause and admission orders"):
        ThunderAgentParams(group_order=True, pause_order="longest_idle")
