"""Policy specs (``name[key=value,...]``) and scenario overrides: parsing, labels, directory
names, the overrides a spec becomes, and which user overrides would undo one or be undone."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import TINY

from tasim.config.policy_spec import PolicySpec, PolicySpecError, split_outside_brackets
from tasim.config.scenario import Override, ScenarioError, load_scenario

SYNTAX = "(expected name or name[key=value,...])"


@pytest.mark.parametrize(
    ("text", "name", "params", "label", "dirname", "params_override"),
    [
        ("round_robin", "round_robin", {}, "round_robin", "round_robin", "policy.params={}"),
        (
            " thunderagent[variant=dynamo, acting_decay_tau_s = 2] ",
            "thunderagent",
            {"variant": "dynamo", "acting_decay_tau_s": 2},
            "thunderagent[variant=dynamo,acting_decay_tau_s=2]",
            "thunderagent-variant=dynamo-acting_decay_tau_s=2",
            "policy.params={variant: dynamo, acting_decay_tau_s: 2}",
        ),
        # values are YAML, as in --set: null, booleans, quoted strings, flow lists and mappings
        (
            "kv_router[session_affinity_ttl_s=null,use_kv_events=false]",
            "kv_router",
            {"session_affinity_ttl_s": None, "use_kv_events": False},
            "kv_router[session_affinity_ttl_s=null,use_kv_events=false]",
            "kv_router-session_affinity_ttl_s=null-use_kv_events=false",
            "policy.params={session_affinity_ttl_s: null, use_kv_events: false}",
        ),
        (
            "thunderagent[variant='2']",
            "thunderagent",
            {"variant": "2"},
            "thunderagent[variant='2']",
            "thunderagent-variant=_2_",
            "policy.params={variant: '2'}",
        ),
        (
            "kv_router[x=[1,2],y={a: 1}]",
            "kv_router",
            {"x": [1, 2], "y": {"a": 1}},
            "kv_router[x=[1, 2],y={a: 1}]",
            "kv_router-x=_1__2_-y=_a__1_",
            "policy.params={x: [1, 2], y: {a: 1}}",
        ),
    ],
)
def test_parse_label_dirname_and_overrides(text: str, name: str, params: dict[str, Any], label: str, dirname: str, params_override: str) -> None:
    spec = PolicySpec.parse(text)
    assert (spec.name, spec.params) == (name, params)
    assert list(spec.params) == list(params)  # in the order given
    assert (spec.label, spec.dirname) == (label, dirname)
    assert spec.overrides() == [f"policy.name={name}", params_override]
    assert PolicySpec.parse(spec.label) == spec


def test_specs_with_the_same_params_in_another_order_are_equal() -> None:
    first = PolicySpec.parse("thunderagent[pause_threshold=0.9,pause_target=0.8]")
    assert first == PolicySpec.parse("thunderagent[pause_target=0.8,pause_threshold=0.9]")
    assert first != PolicySpec.parse("thunderagent[pause_target=0.8,pause_threshold=0.95]")
    assert PolicySpec("thunderagent") != PolicySpec("thunderagent", {"variant": "upstream"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("thunderagent[variant]", f"thunderagent[variant]: variant is not key=value {SYNTAX}"),
        ("thunderagent[=dynamo]", f"thunderagent[=dynamo]: =dynamo is not key=value {SYNTAX}"),
        ("thunderagent[variant=dynamo", f"thunderagent[variant=dynamo: no closing ']' {SYNTAX}"),
        ("thunderagent[variant=dynamo,least_loaded", f"thunderagent[variant=dynamo,least_loaded: no closing ']' {SYNTAX}"),
        ("thunderagent[variant=dynamo]x", f"thunderagent[variant=dynamo]x: text after ']' {SYNTAX}"),
        ("thunderagent[ ]", f"thunderagent[ ]: nothing inside [] {SYNTAX}"),
        ("thunderagent[variant=dynamo,variant=upstream]", "thunderagent[variant=dynamo,variant=upstream]: parameter variant is given twice"),
        ("[variant=dynamo]", f"[variant=dynamo]: no policy name {SYNTAX}"),
        ("", f"'': no policy name {SYNTAX}"),
        (
            "thunderagnet[variant=dynamo]",
            "thunderagnet[variant=dynamo]: unknown policy 'thunderagnet' "
            "(allowed: autellix, cache_aware, continuum, kv_router, least_loaded, random, round_robin, thunderagent)",
        ),
    ],
)
def test_bad_specs_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(PolicySpecError) as error:
        PolicySpec.parse(text)
    assert str(error.value) == message


def test_the_overrides_replace_the_scenarios_params_and_keep_its_defaults() -> None:
    base = ["policy.name=thunderagent", "policy.params={idle_ttl_s: 50}", "policy.defaults.thunderagent={acting_decay_tau_s: 3, variant: dynamo}"]
    spec = PolicySpec.parse("thunderagent[variant=upstream]")
    scenario = load_scenario(TINY, [*base, *spec.overrides()])
    assert scenario.policy.params == {"variant": "upstream"}
    assert scenario.policy.effective_params == {"acting_decay_tau_s": 3, "variant": "upstream"}
    with pytest.raises(ScenarioError) as error:
        load_scenario(TINY, PolicySpec.parse("thunderagent[nope=1]").overrides())
    assert str(error.value).startswith(f"{TINY}: policy: params.nope: unknown parameter of thunderagent (allowed: variant, ")


@pytest.mark.parametrize(
    ("spec", "assignment", "problem"),
    [
        ("thunderagent", "workload.concurrency=3", None),
        ("thunderagent", "policy.name=thunderagent", None),
        ("thunderagent", "policy.name=kv_router", "would replace what thunderagent sets"),
        ("thunderagent", "policy={name: thunderagent}", "would replace what thunderagent sets"),
        ("thunderagent", "policy.params.variant=dynamo", None),
        ("thunderagent", "policy.params={variant: dynamo}", None),
        ("thunderagent", "policy.defaults.thunderagent.variant=dynamo", None),
        ("thunderagent[variant=dynamo]", "policy.params.variant=dynamo", None),
        ("thunderagent[variant=dynamo]", "policy.params.variant=upstream", "would replace what thunderagent[variant=dynamo] sets"),
        ("thunderagent[variant=dynamo]", "policy.params.idle_ttl_s=5", None),
        ("thunderagent[variant=dynamo]", "policy.params={idle_ttl_s: 5}", "would replace what thunderagent[variant=dynamo] sets"),
        # a param the spec sets beats a default for it
        (
            "thunderagent[variant=dynamo]",
            "policy.defaults.thunderagent.variant=upstream",
            "would do nothing: thunderagent[variant=dynamo] sets variant itself",
        ),
        (
            "thunderagent[variant=dynamo]",
            "policy.defaults={thunderagent: {variant: upstream}}",
            "would do nothing: thunderagent[variant=dynamo] sets variant itself",
        ),
        ("thunderagent[variant=dynamo]", "policy.defaults.thunderagent.idle_ttl_s=5", None),
        ("thunderagent[variant=dynamo]", "policy.defaults.kv_router.variant=upstream", None),
    ],
)
def test_conflicts_with_later_overrides(spec: str, assignment: str, problem: str | None) -> None:
    assert PolicySpec.parse(spec).conflict(Override.parse(assignment)) == problem


def test_conflict_names_the_source_it_is_given() -> None:
    problem = PolicySpec("thunderagent").conflict(Override.parse("policy.name=kv_router"), "--policy thunderagent")
    assert problem == "would replace what --policy thunderagent sets"


@pytest.mark.parametrize(
    ("assignment", "key", "writes"),
    [
        ("workload.concurrency=3", "workload.concurrency", True),
        ("workload.turns.kind=fixed", "workload.turns", True),  # below it
        ("workload={concurrency: 3}", "workload.concurrency", True),  # above it, holding it
        ("workload={turns: 3}", "workload.concurrency", False),
        ("workload.turns=3", "workload.concurrency", False),
        ("seed=3", "seed", True),
    ],
)
def test_override_writes(assignment: str, key: str, writes: bool) -> None:
    assert Override.parse(assignment).writes(key.split(".")) is writes


@pytest.mark.parametrize(
    ("later", "earlier", "overwrites"),
    [
        ("seed=4", "seed=3", True),
        ("seed=3", "seed=3", False),
        ("seed=3.0", "seed=3", False),  # the same number
        ("workload={turns: 3}", "workload.concurrency=3", True),  # replaces the mapping it was set in
        ("workload.concurrency=4", "workload={concurrency: 3, turns: 3}", True),
        ("workload.observation_tokens=4", "workload={concurrency: 3}", False),
        ("duration_s=5", "seed=3", False),
    ],
)
def test_override_overwrites(later: str, earlier: str, overwrites: bool) -> None:
    assert Override.parse(later).overwrites(Override.parse(earlier)) is overwrites


def test_split_outside_brackets() -> None:
    assert split_outside_brackets("a, b[x=1,y=[2,3]] ,{k: 1, j: 2},") == ["a", "b[x=1,y=[2,3]]", "{k: 1, j: 2}", ""]
