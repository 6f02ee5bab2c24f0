"""Scenario files: one YAML = cluster + workload + policy, validated by pydantic.

`load_scenario` is the only way in; any problem raises `ScenarioError` with one line that names
the file (or the flag whose override caused it), the field and what is allowed.
``python -m tasim schema`` prints the JSON schema, which takes what the loader takes.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import re
import reprlib
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonDict
from pydantic_core import PydanticCustomError

from tasim.config import hardware
from tasim.config.distributions import LIMIT, Distribution, Fixed
from tasim.config.host_sizing import host_capacity_blocks
from tasim.core.determinism import PROGRAMS, PROMPT_GROUPS
from tasim.core.model import MAX_TRACE_TOKENS, check_block_sizes


class ScenarioError(ValueError):
    """A scenario file or override is invalid; the message is a single line for the user."""


class _Strict(BaseModel):
    # inf passes gt/ge bounds and then breaks the run (an event log cannot hold it), so every
    # scenario float is finite
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


EngineFlavour = Literal["vllm", "mocker"]
RolloutMode = Literal["sync", "one_step_off", "colocate_async", "separate_async", "fully_async"]
# Where vLLM v1 and Dynamo's mocker differ, what each flavour's engine does by default (an
# explicit `eviction` or `reuse_output_blocks` still wins). vLLM also keeps one block of its
# pool as the null block, which holds no KV (`ClusterConfig.cache_blocks_per_worker`).
FLAVOUR_DEFAULTS: dict[str, dict[str, Any]] = {
    "vllm": {"eviction": "lru", "reuse_output_blocks": True},
    "mocker": {"eviction": "lineage", "reuse_output_blocks": False},
}


WritePolicy = Literal["write_through", "write_through_selective", "write_back"]  # SGLang's --hicache-write-policy


class HostTierConfig(_Strict):
    """A host (CPU) KV tier behind each engine's GPU pool: vLLM 0.31's native CPU offloading
    (OffloadingConnector, one GPU block per chunk) or SGLang's HiCache (one GPU block per page).
    Size it with exactly one of blocks, gib and ratio."""

    semantics: Literal["vllm", "sglang", "dynamo_mocker"] = Field(
        "vllm",
        description="whose tier this models: vLLM 0.31's OffloadingConnector (prompt blocks stored as they are "
        "computed, a host hit loaded before the request runs, LRU at request finish); SGLang's HiCache "
        "(sglang: blocks written as requests insert them into the radix tree, a host hit loaded while its step runs, "
        "host eviction of leaves no longer on the GPU); or Dynamo 1.6.1 mocker's model of vLLM's "
        "(dynamo_mocker: loads start at admission, a prompt loaded whole recomputes its last block, "
        "recency touched at lookups, stores and copy completions; what validate dynamo compares against)",
    )
    write_policy: WritePolicy | None = Field(
        None,
        description="semantics sglang only: SGLang's hicache_write_policy: write a block to the host when an insert "
        "brings its hits to 1 (write_through, the default) or 2 (write_through_selective), or only when the GPU "
        "evicts it (write_back, the eviction waits for the copy)",
    )
    load_back_threshold: NonNegativeInt | None = Field(
        None,
        le=1 << 40,
        description="semantics sglang only: a host hit shorter than this many tokens is recomputed, not loaded (default 10)",
    )
    blocks: PositiveInt | None = Field(None, le=1 << 40, description="host capacity in blocks (Dynamo mocker's --num-host-blocks)")
    gib: PositiveFloat | None = Field(
        None, le=1 << 20, description="host capacity in GiB per worker, summed over TP ranks (vLLM's --kv-offloading-size)"
    )
    ratio: PositiveFloat | None = Field(
        None, le=1000, description="host capacity as a multiple of the GPU pool (SGLang's hicache_ratio, as Dynamo sizes it)"
    )
    kv_bytes_per_token: PositiveInt | None = Field(
        None,
        le=1 << 40,
        description="KV bytes of one token over all TP ranks, for gib sizing and transfer times; unset: from the model and kv_cache_dtype",
    )
    d2h_gbps: NonNegativeFloat = Field(
        32.0, le=1e6, description="GPU-to-host copy bandwidth per rank in GB/s (1e9 bytes), one copy at a time; 0: instant"
    )
    h2d_gbps: NonNegativeFloat = Field(
        32.0, le=1e6, description="host-to-GPU copy bandwidth per rank in GB/s (1e9 bytes), one copy at a time; 0: instant"
    )
    store_threshold: NonNegativeInt = Field(
        0, le=1_000_000, description="vLLM's store_threshold: from 2, a block is stored only when offered that many times"
    )

    @model_validator(mode="after")
    def _one_size(self) -> HostTierConfig:
        given = [name for name in ("blocks", "gib", "ratio") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of blocks, gib and ratio (got {', '.join(given) or 'none'})")
        return self

    def sglang_write_policy(self) -> WritePolicy:
        """The write policy SGLang runs: the given one, else its default (server_args.py)."""
        return self.write_policy or "write_through"

    def sglang_load_back_threshold(self) -> int:
        """The load-back threshold SGLang runs: the given one, else HiRadixCache's 10 tokens."""
        return 10 if self.load_back_threshold is None else self.load_back_threshold

    @model_validator(mode="after")
    def _semantics_keys(self) -> HostTierConfig:
        if self.semantics != "sglang":
            for name in ("write_policy", "load_back_threshold"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is SGLang HiCache's: set semantics: sglang, or leave it unset")
        if self.semantics != "vllm" and self.store_threshold:
            whose = "SGLang writes by write_policy" if self.semantics == "sglang" else "Dynamo's mocker has none"
            raise ValueError(f"store_threshold is vLLM's: {whose} (leave store_threshold unset)")
        return self


class EngineConfig(_Strict):
    """One engine replica: vLLM v1's scheduler, or Dynamo's mocker where the two differ."""

    flavour: EngineFlavour = Field(
        "vllm",
        description="whose engine this models: vLLM v1 (0.31.0: LRU eviction, generated blocks reusable, one null "
        "block) or Dynamo 1.6.1's mocker (leaves-first eviction, generated blocks not reusable, every block usable)",
    )
    block_size: PositiveInt = Field(16, le=4096, description="tokens per KV block")
    kv_blocks: PositiveInt | Literal["auto"] = Field(
        "auto", description="KV pool size in blocks; 'auto' derives it from GPU memory left after weights"
    )
    max_num_seqs: PositiveInt = Field(256, le=1_000_000, description="most requests in one batch")
    max_num_batched_tokens: PositiveInt = Field(8192, le=10_000_000, description="token budget of one engine step")
    enable_prefix_caching: bool = Field(True, description="reuse cached full blocks of a prompt's prefix")
    enable_chunked_prefill: bool = Field(True, description="split a long prompt over several steps")
    preemption: Literal["newest_first", "oldest_first"] = Field(
        "newest_first", description="which running request is preempted (recompute) when blocks run out (fcfs scheduling)"
    )
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        "fcfs",
        description="vLLM's --scheduling-policy: fcfs, or priority (the queue in order of each call's priority as its "
        "policy routed it, then arrival; preemption takes the lowest-priority running call)",
    )
    eviction: Literal["lru", "lineage"] = Field(
        "lru", description="order of evicting unreferenced cached blocks: vLLM's LRU, or Dynamo mocker's leaves-first"
    )
    reuse_output_blocks: bool = Field(
        True,
        description="a later prompt that contains a call's output hits its cached blocks (vLLM, SGLang); "
        "false for Dynamo's mocker, which caches generated blocks under its own random token ids",
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="fraction of GPU memory the engine may use (auto sizing)")
    activation_reserve_gib: NonNegativeFloat = Field(2.0, le=1024, description="per-GPU memory kept for activations (auto sizing)")
    host_tier: HostTierConfig | None = Field(
        None, description="a host (CPU) KV tier behind the GPU pool (docs/engine.md, 'The host tier'); unset: none"
    )

    @model_validator(mode="before")
    @classmethod
    def _flavour_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            flavour = data.get("flavour", "vllm")
            if isinstance(flavour, str) and flavour in FLAVOUR_DEFAULTS:  # anything else: the field's own error
                return {**FLAVOUR_DEFAULTS[flavour], **data}
        return data

    @model_validator(mode="after")
    def _as_vllm_runs(self) -> EngineConfig:
        if self.flavour == "vllm":
            if self.kv_blocks == 1:
                raise ValueError("kv_blocks must be at least 2 with flavour vllm (one block is vLLM's null block)")
            if self.eviction == "lineage":
                raise ValueError("eviction lineage is Dynamo mocker's order; flavour vllm evicts lru (or set flavour: mocker)")
        if self.host_tier is not None and not self.enable_prefix_caching:
            raise ValueError("host_tier needs enable_prefix_caching: host blocks are found by their prefix hashes")
        if self.scheduling_policy == "priority":
            if self.flavour != "vllm":
                raise ValueError("scheduling_policy priority is vLLM's; Dynamo 1.6.1's mocker schedules fcfs (set flavour: vllm)")
            if "preemption" in self.model_fields_set and self.preemption != "newest_first":
                raise ValueError(
                    f"preemption {self.preemption} applies to fcfs scheduling; with scheduling_policy priority vLLM "
                    "preempts the lowest-priority running call (leave preemption unset)"
                )
        return self


class PerfConfig(_Strict):
    model: Literal["roofline", "dynamo_polynomial", "fixed"] = Field(
        "roofline", description="how long a step takes: roofline from GPU and model specs, Dynamo mocker's polynomial, or a fixed step_ms"
    )
    speedup_ratio: PositiveFloat = Field(1.0, description="divides every step time (Dynamo mocker semantics)")
    mfu: float = Field(0.5, gt=0, le=1, description="roofline: achieved fraction of peak FLOP/s")
    bandwidth_efficiency: float = Field(0.8, gt=0, le=1, description="roofline: achieved fraction of HBM bandwidth")
    step_overhead_ms: NonNegativeFloat = Field(3.0, description="roofline: fixed scheduler/launch cost per step")
    allreduce_latency_us: NonNegativeFloat = Field(10.0, description="roofline: latency per TP all-reduce")
    step_ms: PositiveFloat = Field(10.0, le=3_600_000, description="fixed: every step takes this long (comparing schedulers step by step)")


def _gpu_names(schema: JsonDict) -> None:
    schema["enum"] = list(hardware.gpus())


def _model_names(schema: JsonDict) -> None:
    schema["enum"] = list(hardware.models())


class ClusterConfig(_Strict):
    backends: PositiveInt = Field(1, le=4096, description="engine replicas (data-parallel workers)")
    # the schema lists the names the validators below allow (tasim/sim/perf/data)
    gpu: str = Field("H100", json_schema_extra=_gpu_names, description="GPU of every replica, by name (tasim/config/hardware_data/gpus.yaml)")
    model: str = Field("Llama-3.1-8B", json_schema_extra=_model_names, description="model served, by name (tasim/config/hardware_data/models.yaml)")
    tp: PositiveInt = Field(1, le=64, description="tensor-parallel GPUs per replica")
    weight_dtype: Literal["bf16", "fp8"] = Field("bf16", description="precision of the weights (memory and roofline FLOP/s)")
    kv_cache_dtype: Literal["bf16", "fp8"] = Field("bf16", description="precision of the KV cache (bytes per block)")
    engine: EngineConfig = EngineConfig()
    perf: PerfConfig = PerfConfig()

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        if value not in hardware.gpus():
            raise ValueError(f"unknown GPU {reprlib.repr(value)} (allowed: {', '.join(hardware.gpus())})")
        return value

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in hardware.models():
            raise ValueError(f"unknown model {reprlib.repr(value)} (allowed: {', '.join(hardware.models())})")
        return value

    @model_validator(mode="after")
    def _fits(self) -> ClusterConfig:
        if self.cache_blocks_per_worker() < 1:  # raises ValueError itself when the weights do not fit
            raise ValueError("the KV pool has no block beside vLLM's null block (raise GPU memory or lower the model)")
        if self.engine.host_tier is not None and self.host_blocks_per_worker() < 1:
            raise ValueError("engine.host_tier holds no block: raise its gib (one block is block_size x kv_bytes_per_token bytes)")
        return self

    def cache_blocks_per_worker(self) -> int:
        """Blocks that hold KV: the pool less vLLM's null block in the vllm flavour."""
        return self.kv_blocks_per_worker() - (1 if self.engine.flavour == "vllm" else 0)

    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all TP ranks: the host tier's own figure, else the model's."""
        tier = self.engine.host_tier
        if tier is not None and tier.kv_bytes_per_token is not None:
            return tier.kv_bytes_per_token
        return hardware.models()[self.model].kv_bytes_per_token(self.kv_cache_dtype)

    def host_blocks_per_worker(self) -> int:
        """Host tier slots of one worker (0 without a tier)."""
        tier = self.engine.host_tier
        if tier is None:
            return 0
        return host_capacity_blocks(
            self.engine.block_size,
            blocks=tier.blocks,
            gib=tier.gib,
            kv_bytes_per_token=self.kv_bytes_per_token(),
            ratio=tier.ratio,
            gpu_blocks=self.cache_blocks_per_worker(),
            sglang=tier.semantics == "sglang",
        )

    def kv_blocks_per_worker(self) -> int:
        """The engine's pool in blocks, as it is configured (vLLM's and the mocker's num_gpu_blocks)."""
        engine = self.engine
        if engine.kv_blocks != "auto":
            return engine.kv_blocks
        return hardware.kv_blocks_auto(
            hardware.models()[self.model],
            hardware.gpus()[self.gpu],
            self.tp,
            engine.block_size,
            self.weight_dtype,
            self.kv_cache_dtype,
            engine.gpu_memory_utilization,
            engine.activation_reserve_gib,
        )


# Most programs planned and held at once (a closed loop's live programs, an RL step's
# trajectories): about 25 kB each, so 2.4 GB at this bound.
MAX_LIVE_PROGRAMS = 100_000


class Release(_Strict):
    """When a program's client releases it (sends its session-final) after its last call.

    ``at_end``: right after the last call, as tasim's own clients and the verl recipe's do.
    ``never``: not at all, as many agent harnesses do; then only the policy's own expiry ends
    the program there (docs/policies.md, "Clients that never release"). ``after``: ``delay_s`` seconds
    after the last call ended (a lazy client, or a lease)."""

    kind: Literal["at_end", "never", "after"] = Field("at_end", description="at_end: right after the last call; never; after: delay_s later")
    delay_s: PositiveFloat | None = Field(None, le=10_000_000, description="after: seconds from the last call's end to the release")

    @model_validator(mode="after")
    def _delay_with_after(self) -> Release:
        if self.kind == "after" and self.delay_s is None:
            raise ValueError("delay_s is required when kind is 'after'")
        if self.kind != "after" and self.delay_s is not None:
            raise ValueError(f"delay_s is only for kind 'after' (kind is {self.kind!r})")
        return self

    @property
    def after_last_call_s(self) -> float | None:
        """Seconds from the end of the program's last call to its release; None: never."""
        if self.kind == "never":
            return None
        return self.delay_s if self.kind == "after" else 0.0


def _release_kind(value: Any) -> Any:
    if isinstance(value, str):
        return {"kind": value}  # `release: never` for {kind: never}
    if not isinstance(value, (dict, Release)):
        raise ValueError("expected at_end, never or a mapping such as {kind: after, delay_s: 30}")
    return value


class Tool(_Strict):
    """One kind of tool call (a command such as ``cat`` or ``pytest``): how often a turn's output
    calls it, relative to the others, and how long it runs."""

    share: PositiveFloat = Field(..., le=1_000_000, description="relative frequency among the tools")
    latency_s: Distribution = Field(description="how long one call of this tool runs")


_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")

# The least each count can be: `plan_program` (tasim/workloads/programs.py) raises a smaller
# draw to it, so a distribution that states a smaller value is refused instead.
COUNT_MINIMUMS = {"task_prompt_tokens": 1, "turns": 1, "output_tokens": 1}
COUNT_BELOW_MINIMUM = "count_below_minimum"  # its error type: the message shows the value, `_describe` adds no "(got ...)"


class ProgramShape(_Strict):
    """What one agent program looks like: a chain of turns, each an LLM call followed by a tool
    call whose output is appended to the context before the next turn."""

    system_prompt_tokens: NonNegativeInt = Field(0, le=10_000_000, description="shared by every program")
    # A number is a Fixed distribution; validate_default=True, as in the model config, also tells
    # type checkers that a default given as a number is validated into one.
    task_prompt_tokens: Distribution = Field(1000, validate_default=True, description="per-program task prompt (per prompt group in rl_rollout)")
    turns: Distribution = Field(10, validate_default=True, description="LLM calls per program")
    output_tokens: Distribution = Field(200, validate_default=True, description="output tokens per call")
    tool_latency_s: Distribution | None = Field(
        None, description="tool time after each call (none after the last); unset: 1 s, or each named tool's with tools"
    )
    tools: dict[str, Tool] | None = Field(
        None,
        description="named tool kinds a turn's output calls, drawn by share, each with its own latency (replaces tool_latency_s)",
    )
    observation_tokens: Distribution = Field(500, validate_default=True, description="tool output appended to the context after each call")
    setup_s: Distribution = Field(0, validate_default=True, description="environment set-up before a program's first call")
    max_context_tokens: PositiveInt | None = Field(
        None, le=10_000_000, description="a program ends before a turn whose prompt would exceed this (default: model context)"
    )
    # the schema's shorthands are those that validate (`after` needs its delay_s)
    release: Annotated[Release, BeforeValidator(_release_kind, json_schema_input_type=Literal["at_end", "never"] | Release)] = Field(
        Release(), description="when the client releases a program after its last call: at_end, never, or {kind: after, delay_s: X}"
    )

    @field_validator(*COUNT_MINIMUMS)
    @classmethod
    def _no_silent_minimum(cls, value: Distribution, info: ValidationInfo) -> Distribution:
        assert info.field_name is not None  # a field's validator
        minimum = COUNT_MINIMUMS[info.field_name]
        for parameter, low in value.stated_lows():
            if low < minimum:
                fixed = isinstance(value, Fixed)
                stated = f"{low:g}" if fixed else f"{parameter} {low:g}"
                allowed = f"at least {minimum}" if parameter == "max" else f"{minimum} to {LIMIT:.0f}"
                raised = "it" if fixed else f"draws below {minimum}"
                raise PydanticCustomError(
                    COUNT_BELOW_MINIMUM, f"{stated} is below {minimum} (allowed: {allowed}; the simulator would silently raise {raised} to {minimum})"
                )
        return value

    @model_validator(mode="after")
    def _one_tool_model(self) -> ProgramShape:
        if self.tools is None:
            return self
        if not self.tools:
            raise ValueError("tools: give at least one tool, or leave tools out for tool_latency_s")
        if self.tool_latency_s is not None:
            raise ValueError("give tool_latency_s or tools, not both (tools gives each tool its own latency)")
        for name in self.tools:
            if not _TOOL_NAME.fullmatch(name):
                raise ValueError(f"tool name {reprlib.repr(name)}: use 1-64 letters, digits, '_', '.' or '-'")
        return self

    @property
    def unnamed_tool_latency_s(self) -> Distribution:
        """The one tool latency of a shape without named tools."""
        return self.tool_latency_s if self.tool_latency_s is not None else Fixed(value=1.0)

    @property
    def tool_choices(self) -> tuple[tuple[str, Tool], ...]:
        """The named tools in name order, so their draws do not depend on how a file lists them."""
        return tuple(sorted((self.tools or {}).items()))


class AgentWorkload(ProgramShape):
    kind: Literal["agent"] = "agent"
    arrival: Literal["closed", "poisson"] = Field(
        "closed", description="closed: keep `concurrency` programs live; poisson: programs arrive at `rate_per_s`"
    )
    concurrency: PositiveInt = Field(16, le=MAX_LIVE_PROGRAMS, description="closed: live programs at once")
    # bounded so arrivals stay apart (at 1e300 per second the clock would never move) and the
    # programs they start stay near MAX_LIVE_PROGRAMS
    rate_per_s: PositiveFloat | None = Field(None, le=10_000, description="poisson: program arrival rate (required there)")
    programs: PositiveInt | None = Field(None, le=10_000_000, description="run exactly this many programs, then end (default: until duration_s)")

    @model_validator(mode="after")
    def _arrival_params(self) -> AgentWorkload:
        if self.arrival == "poisson" and self.rate_per_s is None:
            raise ValueError("rate_per_s is required when arrival is 'poisson'")
        return self


class RolloutWorkload(ProgramShape):
    """RL rollout steps: GRPO batches of prompts x samples (the samples of a prompt share it),
    run under a global concurrency cap; a step's rollout ends with its last trajectory, then a
    training phase leaves the engines idle and (as after a weight update) empties their caches."""

    kind: Literal["rl_rollout"]
    prompts_per_step: PositiveInt = Field(16, le=1_000_000, description="P: prompts per GRPO batch")
    samples_per_prompt: PositiveInt = Field(8, le=10_000, description="n: trajectories per prompt")
    steps: PositiveInt = Field(2, le=100_000, description="training steps to simulate")
    max_concurrency: PositiveInt = Field(128, le=1_000_000, description="most trajectories in flight at once")
    training_s: Distribution = Field(60, validate_default=True, description="duration of each training phase")
    reset_prefix_cache: bool = Field(True, description="drop cached KV after each weight update")
    mode: RolloutMode = Field(
        "sync",
        description="sync: rollout, then training (verl's sync trainer); one_step_off: the next batch generates while "
        "this one trains, one version stale; colocate_async, separate_async: verl 0.9.1's V1 async trainers",
    )
    weight_sync_s: Distribution = Field(0, validate_default=True, description="async modes: pushing the weights; the engines serve nothing meanwhile")
    warmup_batches: NonNegativeInt = Field(1, le=1000, description="colocate/separate_async: batches submitted ahead at the start")
    mini_steps: PositiveInt = Field(
        4,
        le=10_000,
        description="separate_async, fully_async: trainer updates per weight sync (parameter_sync_step, trigger_parameter_sync_step)",
    )
    staleness_threshold: NonNegativeFloat = Field(
        0.1, le=100, description="fully_async: groups generated ahead of the trainer, as a fraction of a sync cycle's (verl's default 0.1)"
    )
    concurrent_groups_per_worker: PositiveInt = Field(
        16, le=100_000, description="fully_async: groups in flight per worker (concurrent_samples_per_replica)"
    )
    max_off_policy_span: PositiveInt | None = Field(
        8, description="colocate/separate_async: a finished group spanning more versions is dropped and replaced; null: no bound"
    )
    abort_retry_delay_s: NonNegativeFloat = Field(1.0, description="async modes: a call a weight sync aborted goes again after this")

    @property
    def batches_submitted(self) -> int:
        """Batches of prompts submitted over the run, before replacements of dropped groups."""
        if self.mode == "fully_async":  # at most the staleness budget ahead of the trainer
            return math.ceil(self.steps * (1 + self.staleness_threshold)) + 1
        return self.steps + (self.warmup_batches if self.mode in ("colocate_async", "separate_async") else 0)

    @model_validator(mode="after")
    def _groups_fit(self) -> RolloutWorkload:
        # Every prompt group and every trajectory owns block-hash keys of its own range
        # (tasim.core.determinism); a rollout that would run out of them is refused here.
        if self.mode in ("separate_async", "fully_async") and self.prompts_per_step % self.mini_steps:
            raise ValueError(f"{self.mode}: prompts_per_step ({self.prompts_per_step}) must be a multiple of mini_steps ({self.mini_steps})")
        groups = self.batches_submitted * self.prompts_per_step
        if groups > PROMPT_GROUPS.size:
            raise ValueError(f"(steps + warmup_batches) x prompts_per_step must be at most {PROMPT_GROUPS.size} (got {groups})")
        if groups * self.samples_per_prompt > PROGRAMS.size:
            raise ValueError(
                "(steps + warmup_batches) x prompts_per_step x samples_per_prompt must be at most "
                f"{PROGRAMS.size} (got {groups * self.samples_per_prompt})"
            )
        if self.prompts_per_step * self.samples_per_prompt > MAX_LIVE_PROGRAMS:
            raise ValueError(
                f"prompts_per_step x samples_per_prompt must be at most {MAX_LIVE_PROGRAMS} (got {self.prompts_per_step * self.samples_per_prompt})"
            )
        return self


class MooncakeTraceWorkload(_Strict):
    """Open-loop replay of a Mooncake JSONL trace: every line is one request at its timestamp."""

    kind: Literal["mooncake_trace"]
    path: str = Field(description="trace file (relative paths are relative to the scenario file)")
    trace_block_size: PositiveInt = Field(512, le=MAX_TRACE_TOKENS, description="tokens per hash_id in the trace")
    arrival_speedup: PositiveFloat = Field(1.0, description="divides every arrival time")
    max_requests: PositiveInt | None = Field(None, description="replay only the first N requests")


class DynamoTraceWorkload(_Strict):
    """Closed-loop replay of a Dynamo agent trace: sessions start at their recorded times and
    each turn follows the previous one's completion after the recorded tool/think gap."""

    kind: Literal["dynamo_trace"]
    path: str = Field(description="trace file (relative paths are relative to the scenario file)")
    gap_scale: NonNegativeFloat = Field(1.0, description="multiplies every recorded gap")
    max_sessions: PositiveInt | None = Field(None, description="replay only the first N sessions")


def _agent_by_default(value: Any) -> Any:
    if isinstance(value, dict) and "kind" not in value:
        return {**value, "kind": "agent"}
    return value


Workload = Annotated[
    AgentWorkload | RolloutWorkload | MooncakeTraceWorkload | DynamoTraceWorkload,
    Field(discriminator="kind"),
    BeforeValidator(_agent_by_default),
]
WORKLOAD_KINDS = (AgentWorkload, RolloutWorkload, MooncakeTraceWorkload, DynamoTraceWorkload)


def _policy_names(schema: JsonDict) -> None:
    from tasim.policies import POLICIES  # policies depend on core, not the reverse

    schema["enum"] = list(POLICIES)


class PolicyConfig(_Strict):
    name: str = Field("round_robin", json_schema_extra=_policy_names, description="the routing policy, by its registered name")
    params: dict[str, Any] = Field(default_factory=dict, description="the policy's parameters, validated per policy (tasim policies lists them)")
    defaults: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per policy, the parameters this deployment gives it whichever policy a run selects (--policy, compare); params override them",
    )

    @property
    def effective_params(self) -> dict[str, Any]:
        return {**self.defaults.get(self.name, {}), **self.params}

    @model_validator(mode="after")
    def _known_policy(self) -> PolicyConfig:
        from tasim.policies import policy_class  # policies depend on core, not the reverse

        for name, params in self.defaults.items():
            try:
                policy_class(name)
            except ValueError as exc:
                raise ValueError(f"defaults.{_key(name)}: {exc}") from None
            _check_params(name, params, f"defaults.{_key(name)}")
        _check_params(self.name, self.effective_params, "params")
        return self


def _check_params(policy: str, params: dict[str, Any], where: str) -> None:
    from tasim.policies import policy_class, validate_params

    try:
        validate_params(policy, params)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join([where, *(_key(str(p)) for p in err["loc"])])
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(policy_class(policy).params_model.model_fields) or "none"
            raise ValueError(f"{field}: unknown parameter of {policy} (allowed: {allowed})") from None
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["loc"]:  # a field's own value; a rule across fields (empty loc) names them itself
            message += f" (got {reprlib.repr(err.get('input'))})"
        raise ValueError(f"{field}: {message}") from None


class MetricsConfig(_Strict):
    warmup_s: NonNegativeFloat = Field(0.0, description="completions before this time are left out of rates")
    # 1 ms at least: a shorter period would keep the clock at one instant (near duration_s's
    # limit, 1e7 s, floats are 2e-9 s apart)
    sample_interval_s: float = Field(5.0, ge=0.001, description="period of per-worker KV/queue samples")
    log_kv_events: bool = Field(
        False, description="also write KV stored/removed events to the event log (policies always get them; they dominate its size)"
    )


class LiveConfig(_Strict):
    """Settings only live mode reads: the simulator has no router of its own, so there only the
    policy ends a program its client never releases (``workload.release``)."""

    program_idle_ttl_s: PositiveFloat | None = Field(
        600.0, le=10_000_000, description="the live router ends a program idle this long (scenario seconds); null: never"
    )
    max_retries: int = Field(
        3, ge=0, le=100, description="the live router sends a call again, on another worker, at most this many times when its worker is lost"
    )
    routing: Literal["proxy", "pin", "dynamo-thunderagent", "dynamo-two-tier"] = Field(
        "proxy",
        description="proxy: calls stream through the tasim router; pin: clients ask the router for a worker and "
        "send the call to the frontend pinned to it (tasim's drivers and verl client); dynamo-thunderagent, "
        "dynamo-two-tier: Dynamo's own Rust plug-in decides in the frontend (a baseline; policy.name must be "
        "its tasim peer, thunderagent or cache_aware)",
    )

    @property
    def routed_by_dynamo(self) -> bool:
        """Dynamo's own Rust plug-in decides (``routing: dynamo-*``); no tasim code is in the path."""
        return self.routing.startswith("dynamo-")


class Scenario(_Strict):
    name: str = Field(
        "scenario",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        max_length=100,
        description="names the default output directory: letters, digits, '.', '_' and '-'",
    )
    description: str = Field("", description="one line for `tasim scenarios`")
    seed: NonNegativeInt = Field(
        0, description="seeds every random stream: programs, arrivals, policy tie-breaks"
    )  # numpy seeds its generators with non-negative integers only
    duration_s: PositiveFloat = Field(600.0, le=10_000_000, description="simulated seconds")
    cluster: ClusterConfig = ClusterConfig()
    workload: Workload = AgentWorkload()
    policy: PolicyConfig = PolicyConfig()
    metrics: MetricsConfig = MetricsConfig()
    live: LiveConfig = LiveConfig()

    @model_validator(mode="after")
    def _window(self) -> Scenario:
        if self.metrics.warmup_s >= self.duration_s:
            raise ValueError(f"metrics.warmup_s ({self.metrics.warmup_s}) must be < duration_s ({self.duration_s})")
        return self

    @model_validator(mode="after")
    def _priorities_scheduled(self) -> Scenario:
        from tasim.policies import policy_class

        if policy_class(self.policy.name).sets_priorities and self.cluster.engine.scheduling_policy != "priority":
            raise ValueError(
                f"policy {self.policy.name} orders calls by priority, which only vLLM's priority scheduling honours: "
                "set cluster.engine.scheduling_policy: priority (flavour vllm)"
            )
        return self

    @model_validator(mode="after")
    def _host_tier_survives_weight_updates(self) -> Scenario:
        # A weight update empties the GPU caches and the host tier (verl resets vLLM's connector
        # with its prefix cache; SGLang's flush clears HiCache's host pool); Dynamo mocker's tier,
        # there to compare with Dynamo's replay, has no such reset, and its KV would then be stale.
        tier = self.cluster.engine.host_tier
        if tier is not None and tier.semantics == "dynamo_mocker" and isinstance(self.workload, RolloutWorkload) and self.workload.reset_prefix_cache:
            raise ValueError(
                f"cluster.engine.host_tier.semantics {tier.semantics} with workload.reset_prefix_cache: a weight update does not "
                "empty that tier (allowed with RL rollouts: semantics vllm or sglang)"
            )
        return self

    @model_validator(mode="after")
    def _aborts_modelled(self) -> Scenario:
        if isinstance(self.workload, RolloutWorkload) and self.workload.mode != "sync":
            if self.cluster.engine.host_tier is not None:
                raise ValueError(
                    f"workload.mode {self.workload.mode} with cluster.engine.host_tier: aborting calls at a weight sync is not "
                    "modelled with a host tier yet (allowed: mode sync, or no host tier)"
                )
            if not self.workload.reset_prefix_cache:
                raise ValueError(f"workload.mode {self.workload.mode} needs workload.reset_prefix_cache: verl resets the caches at every weight sync")
        return self

    @model_validator(mode="after")
    def _trace_blocks_nest(self) -> Scenario:
        if isinstance(self.workload, MooncakeTraceWorkload):  # a Dynamo trace's block size is in the file
            try:
                check_block_sizes(self.cluster.engine.block_size, self.workload.trace_block_size)
            except ValueError as error:
                raise ValueError(f"cluster.engine.block_size and workload.trace_block_size: {error}") from None
        return self

    @property
    def max_context_tokens(self) -> int:
        configured = getattr(self.workload, "max_context_tokens", None)
        return configured or hardware.models()[self.cluster.model].max_context


def with_engine_flavour(scenario: Scenario, flavour: EngineFlavour) -> Scenario:
    """The scenario with its engine as ``flavour``'s engine runs, whatever the scenario chose for
    eviction and output reuse: for comparing against that engine (Dynamo's mocker, vLLM)."""
    engine = scenario.cluster.engine.model_copy(update={"flavour": flavour, **FLAVOUR_DEFAULTS[flavour]})
    return scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"engine": engine})})


# --- loading ---------------------------------------------------------------------------------


def _union_members(annotation: Any) -> tuple[type[BaseModel], ...]:
    """Model classes of a (possibly Annotated) discriminated union, else ()."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel))
    return ()


def _element(annotation: Any) -> tuple[Any, bool]:
    """What a field's value is checked against (``X`` for ``X | None``, the value type of a
    mapping of names), and whether the field is such a mapping."""
    if get_origin(annotation) in (Union, types.UnionType):
        present = [a for a in get_args(annotation) if a is not type(None)]
        if len(present) == 1:
            annotation = present[0]
    if get_origin(annotation) is dict:
        return get_args(annotation)[1], True
    return annotation, False


def _kinds(model: type[BaseModel]) -> tuple[str, ...]:
    """The ``kind`` tags a member of a discriminated union answers to."""
    return get_args(model.model_fields["kind"].annotation)


def _resolve(loc: Sequence[Any]) -> tuple[list[str], type[BaseModel] | None]:
    """The user-facing field path of an error location (without pydantic's union tags) and the
    model class that owns its last element."""
    path: list[str] = []
    current: type[BaseModel] | None = Scenario
    parts = list(loc)
    while parts:
        part = str(parts.pop(0))
        path.append(part)
        field = current.model_fields.get(part) if current else None
        if field is None or not parts:
            return path, current
        annotation, named = _element(field.annotation)
        if named:  # a mapping of names to models: the name, then the model's fields
            path.append(str(parts.pop(0)))
            if not parts:
                return path, None
        members = _union_members(annotation)
        if members:
            tag = str(parts.pop(0))  # discriminated unions put the tag in the location
            current = next((m for m in members if tag in _kinds(m)), None)
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            current = annotation
        else:
            current = None
    return path, current


def _union_tags(path: Sequence[str], owner: type[BaseModel] | None) -> list[str]:
    """The kinds the discriminated union at the end of ``path`` allows, if it is one."""
    field = owner.model_fields.get(path[-1]) if owner else None
    if field is None:
        return []
    return [tag for member in _union_members(_element(field.annotation)[0]) for tag in _kinds(member)]


def _key(part: str) -> str:
    """A key as written, or quoted (and shortened) if it is empty, long or has spaces or control
    characters, which would garble the one-line message."""
    return part if re.fullmatch(r"[\w.-]{1,40}", part) else reprlib.repr(part)


def _describe(error: Mapping[str, Any]) -> str:
    path, owner = _resolve(tuple(error["loc"]))
    field = ".".join(map(_key, path)) or "(top level)"
    if error["type"] == "extra_forbidden":
        allowed = ", ".join(owner.model_fields) if owner else "see `python -m tasim schema`"
        return f"{field}: unknown key (allowed: {allowed})"
    if error["type"] == "union_tag_invalid":  # pydantic's own message quotes the tag however long
        ctx = error["ctx"]
        key = ctx["discriminator"].strip("'")
        return f"{field}: unknown {key} {reprlib.repr(ctx['tag'])} (allowed: {ctx['expected_tags']})"
    if error["type"] == "union_tag_not_found":  # e.g. `--set x.median=3` where x had no mapping
        key = error["ctx"]["discriminator"].strip("'")
        tags = _union_tags(path, owner)
        return f"{field}: a mapping here needs a {key}" + (f" ({', '.join(tags)})" if tags else "")
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] not in ("missing", COUNT_BELOW_MINIMUM) and "input" in error and not isinstance(error["input"], (dict, list)):
        return f"{field}: {message} (got {reprlib.repr(error['input'])})"
    return f"{field}: {message}"


def parse_value(text: str) -> Any:
    """A ``--set`` value: parsed as YAML, or the text itself where YAML cannot read it (see
    load_scenario); nothing but spaces is the empty string."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError):
        return text


def shown(text: str, limit: int = 80) -> str:
    """User text for a one-line message: as written, or quoted (and cut) if empty, long or unprintable."""
    return text if text and text.isprintable() and len(text) <= limit else reprlib.repr(text)


def _holds(value: Any, path: Sequence[str]) -> bool:
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


@dataclass(frozen=True)
class Override:
    """One ``dotted.key=value`` scenario override: the key's parts and the value parsed as YAML.

    Commands apply their flags' overrides and the user's ``--set`` ones in a fixed order, so
    `overwrites` is how they find a user's override that would silently replace another (or be
    replaced) and refuse it instead. ``source`` is what the user typed to ask for it (``--set
    k=v``, ``--seed 3``): an error it causes in the scenario names that, not the file; without
    one the error names the file."""

    key: tuple[str, ...]
    value: object
    source: str | None = dataclasses.field(default=None, compare=False)
    text: str | None = dataclasses.field(default=None, compare=False)  # ``dotted.key=value`` as typed

    @classmethod
    def parse(cls, assignment: str, source: str | None = None) -> Override:
        key, sep, text = assignment.partition("=")
        if not sep or not key.strip():
            raise ScenarioError(f"--set {shown(assignment)}: expected dotted.key=value")
        return cls(tuple(key.strip().split(".")), parse_value(text), source, assignment)

    @property
    def assignment(self) -> str:
        """``dotted.key=value``: as typed, or the value as JSON for one a flag made."""
        if self.text is not None:
            return self.text
        return f"{'.'.join(self.key)}={self.value if isinstance(self.value, str) else json.dumps(self.value)}"

    def apply(self, raw: dict[str, Any]) -> None:
        node = raw
        for i, part in enumerate(self.key[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ScenarioError(f"{self.source or '--set ' + '.'.join(self.key)}: {'.'.join(self.key[: i + 1])} is not a mapping")
            node = child
        node[self.key[-1]] = self.value

    def writes(self, key: Sequence[str]) -> bool:
        """Whether applying this sets the field ``key`` or something inside it."""
        key = tuple(key)
        if self.key[: len(key)] == key:  # at the field or below it
            return True
        depth = len(self.key)  # above it: a mapping that holds the field
        return key[:depth] == self.key and _holds(self.value, key[depth:])

    def overwrites(self, earlier: Override) -> bool:
        """Whether applying this after ``earlier`` replaces any of what ``earlier`` set."""
        if self.key == earlier.key:
            return self.value != earlier.value
        return earlier.writes(self.key)


def as_overrides(overrides: Sequence[str | Override]) -> list[Override]:
    """Overrides given as ``dotted.key=value`` text or already parsed, all parsed (text names
    no flag: an error it causes names the file)."""
    return [Override.parse(o) if isinstance(o, str) else o for o in overrides]


def set_flags(assignments: Sequence[str]) -> list[Override]:
    """The overrides of ``--set`` flags, each to be blamed on its flag."""
    return [Override.parse(assignment, f"--set {shown(assignment)}") for assignment in assignments]


# Fields a command sets itself: dotted key -> (the value it sets, or None where it varies; why).
ReplacedFields = Mapping[str, tuple[Any, str]]


def replaced_by(override: Override, fields: ReplacedFields, command: str) -> str | None:
    """Why ``override`` would be lost under ``command``, which sets ``fields`` itself (to
    another value than the override's), or None."""
    for field, (value, why) in fields.items():
        key = tuple(field.split("."))
        if override.writes(key) if value is None else Override(key, value).overwrites(override):
            shown_value = "" if value is None else f" to {value}"
            return f"{command} sets {field}{shown_value} itself ({why})"
    return None


EMPTY_SCENARIO = (
    "empty scenario (every field would be its default): give at least a workload, and usually a cluster and a policy; "
    "`python -m tasim scenarios` lists presets to start from, `python -m tasim schema` every field"
)


def parse_scenario(raw: Any, source: str, overrides: Sequence[str | Override] = ()) -> Scenario:
    """The scenario ``raw`` (a file's YAML, left as it is) holds with ``overrides`` applied in
    order (text is read as ``dotted.key=value``); an error names the override to blame, by its
    `Override.source`, or else ``source``."""
    if raw is None or raw == {}:  # nothing, only comments, `~` or `{}`: every default, surely not meant
        raise ScenarioError(f"{source}: {EMPTY_SCENARIO}")
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: top level must be a mapping of keys, got {type(raw).__name__}")
    changes = as_overrides(overrides)
    try:
        return Scenario.model_validate(_applied(raw, changes))
    except ValidationError as exc:
        problem = _describe(exc.errors()[0])
    raise ScenarioError(f"{_culprit(raw, changes, problem) or source}: {problem}")


def _applied(raw: dict[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:
    applied = copy.deepcopy(raw)
    for override in overrides:
        override.apply(applied)
    return applied


def _culprit(raw: dict[str, Any], overrides: Sequence[Override], problem: str) -> str | None:
    """The source of the first override after which the scenario has ``problem`` (None: the
    file has it without any, or that override has no source). Applying them one by one, rather
    than asking which one writes the field, also blames a rule across fields rightly."""
    if not overrides:
        return None
    for count in range(len(overrides)):
        try:
            Scenario.model_validate(_applied(raw, overrides[:count]))
        except ValidationError as exc:
            if any(_describe(error) == problem for error in exc.errors()):
                return overrides[count - 1].source if count else None
    return overrides[-1].source


class _DuplicateKey(yaml.MarkedYAMLError):
    """A mapping names one key twice (PyYAML would keep the last one silently)."""


class _ScenarioLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: in a scenario the first
    one would be ignored without a word (two ``policy:`` sections, say)."""


def _unique_keys_mapping(loader: _ScenarioLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    if not any(key.tag == "tag:yaml.org,2002:merge" for key, _ in node.value):  # merges may override
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            try:
                first = lines.get(key)
            except TypeError:  # an unhashable key: the usual constructor refuses it
                break
            if first is not None:
                raise _DuplicateKey(None, None, f"duplicate key {reprlib.repr(key)} (first on line {first + 1})", key_node.start_mark)
            lines[key] = key_node.start_mark.line
    return loader.construct_mapping(node)


_ScenarioLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_keys_mapping)


def read_yaml(path: Path) -> Any:
    """The parsed YAML of a file that gives each key once; any problem raises `ScenarioError`
    with one line naming the file (and the line and column where YAML itself failed)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ScenarioError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ScenarioError(f"{path}: is a directory, expected a YAML file") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: invalid UTF-8 at byte {exc.start + 1} (expected a YAML text file)") from None
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read ({exc.__class__.__name__})") from None
    try:
        raw = yaml.load(text, Loader=_ScenarioLoader)  # noqa: S506 - a safe loader
    except _DuplicateKey as exc:
        mark = exc.problem_mark
        assert mark is not None  # `_unique_keys_mapping` gives the repeated key's
        raise ScenarioError(f"{path}:{mark.line + 1}:{mark.column + 1}: {exc.problem}; give each key once") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ScenarioError(f"{where}: YAML syntax error: {problem}") from None
    except RecursionError:
        raise ScenarioError(f"{path}: YAML nested too deeply") from None
    except ValueError:  # PyYAML builds ints with int() and dates with datetime, which refuse some
        raise ScenarioError(f"{path}: YAML value out of range (an integer of over 4300 digits, or an impossible date)") from None
    return raw


def derived_scenario_yaml(source: Path, overrides: Sequence[str], name: str, target: Path, header: Sequence[str]) -> str:
    """The scenario file ``source`` with ``overrides`` applied and renamed ``name``, as YAML to be
    written at ``target``, headed by ``header`` as comments (a YAML round trip loses the file's
    own comments). A trace path, relative to its scenario file, is made relative to ``target``."""
    raw = read_yaml(source)
    for override in overrides:
        Override.parse(override).apply(raw)
    raw["name"] = name
    workload = raw.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("path"), str):
        trace = (source.parent / workload["path"]).resolve()
        workload["path"] = os.path.relpath(trace, target.parent.resolve())
    comment = "\n".join(f"# {line}" if line else "#" for line in header)
    return comment + "\n" + yaml.safe_dump(raw, sort_keys=False, allow_unicode=True, width=100)


def load_scenario(path: str | Path, overrides: Sequence[str | Override] = ()) -> Scenario:
    """The scenario file ``path`` with ``overrides`` applied (see `parse_scenario`)."""
    path = Path(path)
    changes = as_overrides(overrides)
    path_source = next((o.source for o in reversed(changes) if o.writes(("workload", "path"))), None)
    return _resolve_paths(parse_scenario(read_yaml(path), str(path), changes), path, path_source or str(path))


def _shown_path(path: Path) -> str:
    """A path for the one-line message: quoted if it has control characters, cut if long."""
    text = str(path) if str(path).isprintable() else repr(str(path))
    return text if len(text) <= 300 else text[:297] + "..."


def _resolve_paths(scenario: Scenario, source: Path, blame: str) -> Scenario:
    """Make a trace path relative to the scenario file absolute, and check it exists; a problem
    names ``blame``, where the path came from."""
    workload = scenario.workload
    if not isinstance(workload, (MooncakeTraceWorkload, DynamoTraceWorkload)):
        return scenario
    trace = Path(workload.path)
    try:
        if not trace.is_absolute():
            trace = (source.parent / trace).resolve()
        found = trace.is_file()
        problem = "not a file" if trace.exists() else "file not found"
    except ValueError:  # a NUL byte
        found, problem = False, "not a valid path"
    except OSError as exc:  # a name longer than the file system allows, say
        found, problem = False, f"cannot read ({exc.strerror})"
    if not found:
        raise ScenarioError(f"{blame}: workload.path: {problem}: {_shown_path(trace)}")
    return scenario.model_copy(update={"workload": workload.model_copy(update={"path": str(trace)})})
