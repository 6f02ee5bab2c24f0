"""Workload plans, block-hash chaining and distributions."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import TypeAdapter

from tasim.config.distributions import Distribution
from tasim.config.scenario import AgentWorkload as WorkloadConfig
from tasim.core.determinism import SHARED_PROMPT
from tasim.core.model import Segment, chained_block_hashes
from tasim.workloads import agent_script, plan_program

DIST = TypeAdapter(Distribution)


def test_chained_hashes_share_only_the_common_prefix() -> None:
    a = chained_block_hashes([Segment(40, SHARED_PROMPT.start), Segment(100, 7)], 16)
    b = chained_block_hashes([Segment(40, SHARED_PROMPT.start), Segment(100, 8)], 16)
    # Blocks 0-1 end inside the 40-token shared prompt; block 2 (tokens 32-47) straddles it.
    assert a[:2] == b[:2] == [0, 1 << 34]
    assert a[2:] != b[2:]
    assert len(a) == 100 // 16
    assert chained_block_hashes([Segment(40, SHARED_PROMPT.start), Segment(100, 7)], 16, start_block=3) == a[3:]


def test_program_turns_grow_a_shared_prefix() -> None:
    config = WorkloadConfig(
        system_prompt_tokens=64, task_prompt_tokens=100, turns=3, output_tokens=20, observation_tokens=30, tool_latency_s=1.5, setup_s=4.0
    )
    plan = plan_program(config, seed=0, index=5, max_context_tokens=100_000)
    calls = list(agent_script(plan, block_size=16).calls)
    (wait0, first), (wait1, second), (wait2, third) = calls
    assert (wait0, wait1, wait2) == (4.0, 1.5, 1.5)  # set-up before the first call, then tools
    assert (first.prompt_tokens, first.output_tokens, first.history_tokens) == (164, 20, 0)
    assert (second.prompt_tokens, second.history_tokens) == (214, 184)
    # Every full block of turn 0's prompt+output is a prefix of turn 1's blocks.
    assert second.block_hashes[: len(first.block_hashes)] == first.block_hashes
    assert len(second.block_hashes) == (214 + 20) // 16
    assert (second.id, third.turn) == ("p5.1", 2)


def test_group_samples_share_the_task_prompt() -> None:
    config = WorkloadConfig(
        system_prompt_tokens=32, task_prompt_tokens={"kind": "uniform", "low": 100, "high": 900}, turns=2, output_tokens=50, observation_tokens=10
    )
    a = plan_program(config, 0, 10, 10**6, group=3)
    b = plan_program(config, 0, 11, 10**6, group=3)
    assert a.task_tokens == b.task_tokens
    ha = next(iter(agent_script(a, 16).calls))[1].block_hashes
    hb = next(iter(agent_script(b, 16).calls))[1].block_hashes
    shared = (32 + a.task_tokens) // 16
    assert ha[:shared] == hb[:shared] and ha[shared] != hb[shared]


def test_plans_depend_only_on_seed_and_index() -> None:
    config = WorkloadConfig(turns={"kind": "uniform", "low": 2, "high": 30}, output_tokens={"kind": "lognormal", "median": 100, "sigma": 1})
    assert plan_program(config, 3, 9, 10**6) == plan_program(config, 3, 9, 10**6)
    assert plan_program(config, 3, 9, 10**6) != plan_program(config, 3, 10, 10**6)


def test_max_context_cuts_turns() -> None:
    config = WorkloadConfig(system_prompt_tokens=0, task_prompt_tokens=1000, turns=50, output_tokens=100, observation_tokens=400)
    plan = plan_program(config, 0, 0, max_context_tokens=3000)
    # turn k's prompt is 1000 + 500k; prompt + 100 output must stay <= 3000
    assert len(plan.turns) == 4


@pytest.mark.parametrize(
    ("spec", "mean", "std"),
    [
        (5, 5.0, 0.0),
        ({"kind": "uniform", "low": 2, "high": 8}, 5.0, 6 / 12**0.5),
        ({"kind": "lognormal", "median": 100, "sigma": 0.5}, 100 * np.exp(0.125), 100 * np.sqrt((np.exp(0.25) - 1) * np.exp(0.25))),
        ({"kind": "empirical", "values": [1, 2, 10], "weights": [1, 1, 2]}, 5.75, np.sqrt((1 + 4 + 200) / 4 - 5.75**2)),
        # alpha 5: mean 5/4 x 2 = 2.5, variance scale^2 alpha / ((alpha-1)^2 (alpha-2)) = 4 x 5 / 48
        ({"kind": "pareto", "scale": 2, "alpha": 5}, 2.5, np.sqrt(4 * 5 / (16 * 3))),
    ],
)
def test_distribution_moments(spec, mean: float, std: float) -> None:
    dist = DIST.validate_python(spec)
    rng = np.random.default_rng(42)
    samples = np.array([dist.sample(rng) for _ in range(40_000)])
    assert dist.mean() == pytest.approx(mean, rel=1e-12)
    assert samples.mean() == pytest.approx(mean, rel=0.02, abs=1e-9)
    assert samples.std() == pytest.approx(std, rel=0.05, abs=1e-9)


def test_lognormal_clipping_bounds_samples() -> None:
    dist = DIST.validate_python({"kind": "lognormal", "median": 10, "sigma": 2, "min": 1, "max": 50})
    rng = np.random.default_rng(0)
    samples = [dist.sample(rng) for _ in range(5000)]
    assert min(samples) == 1 and max(samples) == 50


def test_named_tools_are_drawn_by_share_each_with_its_own_latency() -> None:
    config = WorkloadConfig(
        turns=2000,
        output_tokens=10,
        observation_tokens=10,
        task_prompt_tokens=10,
        tools={"pytest": {"share": 1, "latency_s": 20.0}, "cat": {"share": 3, "latency_s": 0.5}},
    )
    plan = plan_program(config, seed=0, index=0, max_context_tokens=10_000_000)
    assert {(t.tool, t.tool_latency_s) for t in plan.turns} == {("cat", 0.5), ("pytest", 20.0)}
    share = sum(t.tool == "cat" for t in plan.turns) / len(plan.turns)
    assert abs(share - 0.75) < 3 * (0.75 * 0.25 / 2000) ** 0.5  # within three standard errors
    calls = [call for _, call in agent_script(plan, block_size=16).calls]
    assert [c.tool_call for c in calls] == [t.tool for t in plan.turns]  # what each call's output invokes
    # The file's order of the tools does not change the draws.
    listed_the_other_way = config.model_copy(update={"tools": dict(reversed(list(config.tools.items())))})
    assert plan_program(listed_the_other_way, seed=0, index=0, max_context_tokens=10_000_000) == plan


def test_a_shape_without_named_tools_draws_as_before() -> None:
    plan = plan_program(WorkloadConfig(turns=3, tool_latency_s=1.5), seed=0, index=0, max_context_tokens=100_000)
    assert [(t.tool, t.tool_latency_s) for t in plan.turns] == [(None, 1.5)] * 3


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"tools": {}}, "give at least one tool"),
        ({"tools": {"cat": {"share": 1, "latency_s": 0.5}}, "tool_latency_s": 2.0}, "give tool_latency_s or tools, not both"),
        ({"tools": {"a b": {"share": 1, "latency_s": 0.5}}}, "tool name 'a b'"),
        ({"tools": {"cat": {"share": 0, "latency_s": 0.5}}}, "greater than 0"),
    ],
)
def test_bad_tools_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadConfig(**fields)
