"""Seed streams and block-hash owner keys: one definition (tasim.core.determinism), no overlaps."""

from __future__ import annotations

import itertools
import re

import pytest
from conftest import REPO, SCENARIOS

from tasim.config.scenario import AgentWorkload, MooncakeTraceWorkload, RolloutWorkload, load_scenario
from tasim.core.determinism import (
    OWNER_RANGES,
    OWNER_SPACE,
    PRIVATE_OUTPUTS,
    PROGRAMS,
    PROMPT_GROUPS,
    SHARED_PROMPT,
    TRACE_OUTPUTS,
    OwnerRange,
    Stream,
    arrival_rng,
    policy_rng,
)
from tasim.sim.runner import Simulation
from tasim.workloads import agent_script, mooncake_scripts, plan_program, rollout_step_plans
from tasim.workloads.trace_formats import TRACE_HASH_NAMESPACE


def test_owner_ranges_are_disjoint_ordered_and_inside_the_owner_space() -> None:
    for a, b in itertools.combinations(OWNER_RANGES, 2):
        assert a.stop <= b.start or b.stop <= a.start, (a.name, b.name)
    assert [r.start for r in OWNER_RANGES] == sorted(r.start for r in OWNER_RANGES)
    assert OWNER_RANGES[0].start == 0 and OWNER_RANGES[-1].stop == OWNER_SPACE
    assert all(r.start < r.stop for r in OWNER_RANGES)


def test_an_owner_key_outside_its_range_is_refused() -> None:
    groups = OwnerRange("groups", 1, 4)
    assert [groups.key(i) for i in range(3)] == [1, 2, 3]
    for offset in (-1, 3):
        with pytest.raises(OverflowError, match="owner keys for groups: offset"):
            groups.key(offset)


def test_seed_streams_are_distinct() -> None:
    assert len({s.value for s in Stream}) == len(Stream)
    assert policy_rng(7).random() != arrival_rng(7).random()
    assert policy_rng(7).random() == policy_rng(7).random()


def test_no_module_derives_a_seed_stream_of_its_own() -> None:
    """Streams seeded by a list (``[seed, stream, ...]``) or spawned from a SeedSequence are
    made in tasim/core/determinism.py only, so two consumers cannot pick the same one unawares."""
    derived = re.compile(r"SeedSequence\(|default_rng\(\s*\[")
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "tasim").rglob("*.py"))
        if path.name != "determinism.py"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if derived.search(line)
    ]
    assert offenders == []


def _owners(hashes: tuple[int, ...]) -> set[int]:
    return {h % OWNER_SPACE for h in hashes}


def _within(owners: set[int], *ranges: OwnerRange) -> bool:
    return all(any(r.start <= o < r.stop for r in ranges) for o in owners)


def test_generated_workloads_take_owner_keys_from_their_own_ranges() -> None:
    agent = load_scenario(SCENARIOS / "live-mocker.yaml")
    assert isinstance(agent.workload, AgentWorkload)
    bs = agent.cluster.engine.block_size
    plan = plan_program(agent.workload, agent.seed, 3, agent.max_context_tokens)
    owners = set().union(*(_owners(spec.block_hashes) for _, spec in agent_script(plan, bs).calls))
    assert SHARED_PROMPT.start in owners and PROGRAMS.key(3) in owners
    assert _within(owners, SHARED_PROMPT, PROGRAMS)

    rollout = load_scenario(SCENARIOS / "rl-live-mocker.yaml")
    assert isinstance(rollout.workload, RolloutWorkload)
    plans = rollout_step_plans(rollout.workload, rollout.seed, 1, rollout.max_context_tokens)
    owners = set().union(*(_owners(spec.block_hashes) for p in plans for _, spec in agent_script(p, rollout.cluster.engine.block_size).calls))
    assert any(PROMPT_GROUPS.start <= o < PROMPT_GROUPS.stop for o in owners)
    assert _within(owners, SHARED_PROMPT, PROMPT_GROUPS, PROGRAMS)


def test_replayed_outputs_take_trace_owner_keys_and_prompts_keep_the_trace_namespace() -> None:
    scenario = load_scenario(SCENARIOS / "mooncake-conversation.yaml")
    workload = scenario.workload
    assert isinstance(workload, MooncakeTraceWorkload)
    bs = scenario.cluster.engine.block_size
    _, script = next(mooncake_scripts(workload.model_copy(update={"max_requests": 20}), bs))
    for _, spec in script.calls:
        prompt = spec.prompt_block_hashes(bs)
        assert all(h >= TRACE_HASH_NAMESPACE for h in prompt)
        assert _within(_owners(spec.block_hashes[len(prompt) :]), TRACE_OUTPUTS)


def test_outputs_an_engine_cannot_reuse_take_private_owner_keys() -> None:
    scenario = load_scenario(SCENARIOS / "live-mocker.yaml", ["cluster.engine.reuse_output_blocks=false"])
    simulation = Simulation(scenario, lambda event: None)
    bs = simulation.block_size
    assert isinstance(scenario.workload, AgentWorkload)
    _, spec = next(iter(agent_script(plan_program(scenario.workload, scenario.seed, 0, scenario.max_context_tokens), bs).calls))
    private = simulation._private_output(spec)
    prompt = spec.prompt_block_hashes(bs)
    assert private.block_hashes[: len(prompt)] == prompt
    assert _owners(private.block_hashes[len(prompt) :]) == {PRIVATE_OUTPUTS.key(1)}
