"""The vLLM matrix of docs/results/validation.md: configurations of engine, workload and policy, each
run on tasim's engine and on vLLM's own scheduler (`against_vllm.validate`), written as a
markdown table between the document's markers.

    python -m lab.vllm_matrix [--jobs N] [--doc docs/results/validation.md]

The configurations cover closed-loop agents with tool gaps (the cache holds every program, or
programs evict each other during their tools, or the pool is so small that running requests
preempt each other), chunked prefill off, a small token budget, prefix caching off, vLLM's
priority scheduling under Autellix's program-level priorities, GRPO groups whose samples share a
block-aligned prompt (vLLM's duplicate blocks), several workers under the KV router and
ThunderAgent, and both Mooncake traces cut to a few hundred requests. A second table runs some of
them with a host KV tier (`cluster.engine.host_tier`) behind the GPU pool, against vLLM's
OffloadingConnector, and compares besides each request's host hits, loads and stores and each
worker's host KV events.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tasim.config.presets import PRESET_DIR
from tasim.config.scenario import load_scenario
from tasim.results.doc_section import replace_section
from tasim.tools.parallel import map_in_processes
from tasim.validation import ValidationUnavailable
from tasim.validation.against_vllm import DECISIONS, HOST_EVENTS, TIER_DECISIONS, Comparison, validate

STEP_MS = 10.0
BEGIN, END = "<!-- vllm-matrix:begin -->", "<!-- vllm-matrix:end -->"

# 24 programs of 4-12 turns on one worker of 16-token blocks; the pool decides the regime.
_AGENTS = [
    "cluster.backends=1",
    "cluster.engine.block_size=16",
    "workload.concurrency=24",
    "workload.programs=24",
    "policy.name=round_robin",
    "workload.turns={kind: uniform, low: 4, high: 12}",
    "duration_s=100000",
]
# Autellix's program-level priorities on vLLM's priority scheduling (the mocker flavour has none)
_AUTELLIX = ["cluster.engine.flavour=vllm", "cluster.engine.scheduling_policy=priority", "policy.name=autellix"]
_MOONCAKE = ["workload.max_requests=200", "cluster.backends=2", "cluster.engine.block_size=64"]
_GROUPS = [
    "workload.prompts_per_step=6",
    "workload.samples_per_prompt=4",
    "workload.max_concurrency=24",
    "workload.system_prompt_tokens=1536",
    "workload.task_prompt_tokens=512",
    "workload.turns=4",
    "workload.output_tokens={kind: uniform, low: 20, high: 200}",
    "workload.observation_tokens={kind: uniform, low: 50, high: 500}",
    "workload.tool_latency_s={kind: uniform, low: 0.1, high: 2}",
    "workload.training_s=5",
    "cluster.engine.block_size=16",
]


@dataclass(frozen=True, slots=True)
class Config:
    name: str
    preset: str
    overrides: tuple[str, ...]


CONFIGS: tuple[Config, ...] = (
    Config("agents, every program fits", "multiturn-validation.yaml", (*_AGENTS, "cluster.engine.kv_blocks=20000")),
    Config("agents, thrashing in tool gaps", "multiturn-validation.yaml", (*_AGENTS, "cluster.engine.kv_blocks=2500")),
    Config("agents, preemption-heavy", "multiturn-validation.yaml", (*_AGENTS, "cluster.engine.kv_blocks=900")),
    Config(
        "agents, thrashing, chunked prefill off",
        "multiturn-validation.yaml",
        (*_AGENTS, "cluster.engine.kv_blocks=2500", "cluster.engine.enable_chunked_prefill=false", "cluster.engine.max_num_batched_tokens=40000"),
    ),
    Config(
        "agents, thrashing, 512-token budget, 16 seqs",
        "multiturn-validation.yaml",
        (*_AGENTS, "cluster.engine.kv_blocks=2500", "cluster.engine.max_num_batched_tokens=512", "cluster.engine.max_num_seqs=16"),
    ),
    Config(
        "agents, prefix caching off",
        "multiturn-validation.yaml",
        (*_AGENTS, "cluster.engine.kv_blocks=2500", "cluster.engine.enable_prefix_caching=false"),
    ),
    Config(
        "agents, 2 workers, kv_router",
        "multiturn-validation.yaml",
        (*_AGENTS, "cluster.backends=2", "cluster.engine.kv_blocks=1500", "policy.name=kv_router"),
    ),
    Config(
        "agents, 2 workers, thunderagent",
        "multiturn-validation.yaml",
        (*_AGENTS, "cluster.backends=2", "cluster.engine.kv_blocks=1500", "policy.name=thunderagent", "policy.params={scheduler_interval_s: 1}"),
    ),
    Config(
        "agents, thrashing, priority scheduling, 2 workers, autellix",
        "multiturn-validation.yaml",
        (*_AGENTS, "cluster.backends=2", "cluster.engine.kv_blocks=1250", *_AUTELLIX),
    ),
    Config(
        "agents, preemption-heavy, priority scheduling, autellix",
        "multiturn-validation.yaml",
        (*_AGENTS, "cluster.engine.kv_blocks=900", *_AUTELLIX),
    ),
    Config("GRPO groups, 2 workers, least_loaded", "rl-rollout.yaml", (*_GROUPS, "cluster.engine.kv_blocks=1200", "policy.name=least_loaded")),
    Config(
        "GRPO groups, 2 workers, thunderagent (dynamo)", "rl-rollout.yaml", (*_GROUPS, "cluster.engine.kv_blocks=800", "policy.name=thunderagent")
    ),
    Config(
        "Mooncake conversation, round_robin", "mooncake-conversation.yaml", (*_MOONCAKE, "cluster.engine.kv_blocks=1500", "policy.name=round_robin")
    ),
    Config(
        "Mooncake conversation, kv_router, chunked prefill off",
        "mooncake-conversation.yaml",
        (
            *_MOONCAKE,
            "cluster.engine.kv_blocks=1500",
            "cluster.engine.enable_chunked_prefill=false",
            "cluster.engine.max_num_batched_tokens=96000",
            "policy.name=kv_router",
        ),
    ),
    Config("Mooncake synthetic, round_robin", "mooncake-synthetic.yaml", (*_MOONCAKE, "cluster.engine.kv_blocks=1500", "policy.name=round_robin")),
    Config("Mooncake synthetic, kv_router", "mooncake-synthetic.yaml", (*_MOONCAKE, "cluster.engine.kv_blocks=1500", "policy.name=kv_router")),
)

# A host tier of Llama 3.1 8B's 128 KiB per token at vLLM's 32 GB/s per direction, unless a row says otherwise.
_TIER = ["cluster.engine.host_tier.kv_bytes_per_token=131072"]

TIERED_CONFIGS: tuple[Config, ...] = (
    Config(
        "agents, thrashing in tool gaps, host 4 × GPU",
        "multiturn-validation.yaml",
        (*_AGENTS, "cluster.engine.kv_blocks=2500", *_TIER, "cluster.engine.host_tier.blocks=10000"),
    ),
    Config(
        "agents, preemption-heavy, host 2 × GPU, 2 GB/s",
        "multiturn-validation.yaml",
        (
            *_AGENTS,
            "cluster.engine.kv_blocks=900",
            *_TIER,
            "cluster.engine.host_tier.blocks=1800",
            "cluster.engine.host_tier.d2h_gbps=2",
            "cluster.engine.host_tier.h2d_gbps=2",
        ),
    ),
    Config(
        "agents, thrashing, host smaller than the programs, store_threshold 2",
        "multiturn-validation.yaml",
        (*_AGENTS, "cluster.engine.kv_blocks=2500", *_TIER, "cluster.engine.host_tier.blocks=3000", "cluster.engine.host_tier.store_threshold=2"),
    ),
    Config(
        "agents, thrashing, priority scheduling, 2 workers, autellix, host 2 × GPU",
        "multiturn-validation.yaml",
        (*_AGENTS, "cluster.backends=2", "cluster.engine.kv_blocks=1250", *_AUTELLIX, *_TIER, "cluster.engine.host_tier.blocks=2500"),
    ),
    Config(
        "Mooncake conversation, round_robin, host 4 × GPU",
        "mooncake-conversation.yaml",
        (*_MOONCAKE, "cluster.engine.kv_blocks=1500", "policy.name=round_robin", *_TIER, "cluster.engine.host_tier.blocks=6000"),
    ),
)

Outcome = tuple[Comparison, str] | str  # (comparison, policy) or why it could not run


def run_config(config: Config) -> Outcome:
    scenario = load_scenario(PRESET_DIR / config.preset, config.overrides)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            return validate(scenario, Path(scratch), STEP_MS), scenario.policy.name
        except ValidationUnavailable as exc:
            return str(exc)


def markdown(results: Sequence[tuple[Config, Outcome]], tiered: Sequence[tuple[Config, Outcome]] = ()) -> str:
    lines = [
        "Generated by `python -m lab.vllm_matrix` (`make vllm-validation`). Each row runs one",
        f"scenario twice in tasim's simulation, every step {STEP_MS:g} ms: once on tasim's engine (the `vllm`",
        "flavour) and once on vLLM 0.31.0's own `Scheduler` and `KVCacheManager`, and compares every request:",
        "the step of each admission and the prefix-cache hit it got (re-admissions after a preemption",
        "included), its preemptions, its first token and its finish. ✓: identical for every request.",
        "",
        "| configuration | policy | requests | " + " | ".join(DECISIONS) + " | prefix hit rate | preemptions "
        "| engine steps | wall s (tasim / vLLM) |",
        "|---|---|---:|" + "---:|" * len(DECISIONS) + "---:|---:|---:|---:|",
    ]
    for config, outcome in results:
        if isinstance(outcome, str):
            lines.append(f"| {config.name} | | {outcome.replace('|', '/')} |" + " |" * (len(DECISIONS) + 4))
            continue
        result, policy = outcome
        summary = result.summaries["vllm"]
        cells = [
            config.name,
            policy,
            f"{result.requests:,}",
            *(_agreement(result, decision) for decision in DECISIONS),
            f"{summary['prefix_hit_rate']:.4f}",
            f"{summary['preemptions']:,}",
            f"{summary['engine_iterations']:,}",
            f"{result.walls['tasim']:.1f} / {result.walls['vllm']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if tiered:
        lines += ["", *_tiered_markdown(tiered)]
    return "\n".join(lines)


def _tiered_markdown(results: Sequence[tuple[Config, Outcome]]) -> list[str]:
    decisions = DECISIONS + TIER_DECISIONS
    lines = [
        "With a host tier (`cluster.engine.host_tier`, 128 KiB per token, 32 GB/s per direction unless",
        "the row says otherwise), vLLM runs its `OffloadingConnector` (CPU offloading, one block per",
        "chunk) behind the scheduler, its copies timed by tasim's copy lanes. Compared besides: per",
        "request the host-hit tokens of each admission and every load and store (its blocks, the step",
        "that planned it, when it was done), and per worker and step the host's KV events (blocks",
        "stored, blocks evicted).",
        "",
        "| configuration | policy | requests | " + " | ".join(decisions) + f" | {HOST_EVENTS} (worker steps) | host-hit tokens "
        "| host stored tokens | preemptions | wall s (tasim / vLLM) |",
        "|---|---|---:|" + "---:|" * len(decisions) + "---:|---:|---:|---:|---:|",
    ]
    for config, outcome in results:
        if isinstance(outcome, str):
            lines.append(f"| {config.name} | | {outcome.replace('|', '/')} |" + " |" * (len(decisions) + 5))
            continue
        result, policy = outcome
        summary = result.summaries["vllm"]
        events = result.host_event_steps
        differ = events - result.host_events_identical
        cells = [
            config.name,
            policy,
            f"{result.requests:,}",
            *(_agreement(result, decision) for decision in decisions),
            f"{events:,} ✓" if differ == 0 else f"{differ} of {events:,} differ ✗",
            f"{summary['host_tier']['host_hit_tokens']:,}",
            f"{summary['host_tier']['stored_tokens']:,}",
            f"{summary['preemptions']:,}",
            f"{result.walls['tasim']:.1f} / {result.walls['vllm']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _agreement(result: Comparison, decision: str) -> str:
    same = result.identical[decision]
    return "✓" if same == result.requests else f"{result.requests - same} differ ✗"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--doc", type=Path, default=Path("docs/results/validation.md"))
    args = parser.parse_args(argv)
    configs = CONFIGS + TIERED_CONFIGS
    outcomes = list(zip(configs, map_in_processes(run_config, list(configs), args.jobs)))
    results, tiered = outcomes[: len(CONFIGS)], outcomes[len(CONFIGS) :]
    replace_section(args.doc, BEGIN, END, markdown(results, tiered))
    for config, outcome in outcomes:
        status = outcome if isinstance(outcome, str) else ("identical" if outcome[0].all_identical else "DIFFERS")
        print(f"{config.name}: {status}")


if __name__ == "__main__":
    main()
