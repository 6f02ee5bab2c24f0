"""Scenario files: one YAML = cluster + workload + policy, validated by pydantic.

`load_scenario` is the only way in; any problem raises `ScenarioError` with one line that names
the file, the field and what is allowed. ``python -m tasim schema`` prints the JSON schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from tasim.distributions import Distribution
from tasim.perf import specs


class ScenarioError(ValueError):
    """A scenario file or override is invalid; the message is a single line for the user."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class EngineConfig(_Strict):
    """One engine replica (vLLM-v1 semantics)."""

    block_size: PositiveInt = Field(16, le=4096, description="tokens per KV block")
    kv_blocks: PositiveInt | Literal["auto"] = Field(
        "auto", description="KV pool size in blocks; 'auto' derives it from GPU memory left after weights"
    )
    max_num_seqs: PositiveInt = Field(256, le=1_000_000)
    max_num_batched_tokens: PositiveInt = Field(8192, le=10_000_000)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    preemption: Literal["newest_first", "oldest_first"] = Field(
        "newest_first", description="which running request is preempted (recompute) when blocks run out"
    )
    eviction: Literal["lru", "lineage"] = Field(
        "lru", description="order of evicting unreferenced cached blocks: vLLM's LRU, or Dynamo mocker's leaves-first"
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    activation_reserve_gib: NonNegativeFloat = Field(2.0, description="per-GPU memory kept for activations (auto sizing)")


class PerfConfig(_Strict):
    model: Literal["roofline", "dynamo_polynomial"] = "roofline"
    speedup_ratio: PositiveFloat = Field(1.0, description="divides every step time (Dynamo mocker semantics)")
    mfu: float = Field(0.5, gt=0, le=1, description="roofline: achieved fraction of peak FLOP/s")
    bandwidth_efficiency: float = Field(0.8, gt=0, le=1, description="roofline: achieved fraction of HBM bandwidth")
    step_overhead_ms: NonNegativeFloat = Field(3.0, description="roofline: fixed scheduler/launch cost per step")
    allreduce_latency_us: NonNegativeFloat = Field(10.0, description="roofline: latency per TP all-reduce")


class ClusterConfig(_Strict):
    backends: PositiveInt = Field(1, le=4096, description="engine replicas (data-parallel workers)")
    gpu: str = "H100"
    model: str = "Llama-3.1-8B"
    tp: PositiveInt = Field(1, le=64, description="tensor-parallel GPUs per replica")
    weight_dtype: Literal["bf16", "fp8"] = "bf16"
    kv_cache_dtype: Literal["bf16", "fp8"] = "bf16"
    engine: EngineConfig = EngineConfig()
    perf: PerfConfig = PerfConfig()

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        if value not in specs.gpus():
            raise ValueError(f"unknown GPU {value!r} (allowed: {', '.join(specs.gpus())})")
        return value

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in specs.models():
            raise ValueError(f"unknown model {value!r} (allowed: {', '.join(specs.models())})")
        return value

    @model_validator(mode="after")
    def _fits(self) -> "ClusterConfig":
        self.kv_blocks_per_worker()  # raises ValueError when the weights do not fit
        return self

    def kv_blocks_per_worker(self) -> int:
        engine = self.engine
        if engine.kv_blocks != "auto":
            return engine.kv_blocks
        return specs.kv_blocks_auto(
            specs.models()[self.model],
            specs.gpus()[self.gpu],
            self.tp,
            engine.block_size,
            self.weight_dtype,
            self.kv_cache_dtype,
            engine.gpu_memory_utilization,
            engine.activation_reserve_gib,
        )


class WorkloadConfig(_Strict):
    """Agent programs: each is a chain of turns (LLM call, then a tool call whose output is
    appended to the context before the next turn)."""

    kind: Literal["agent"] = "agent"
    arrival: Literal["closed", "poisson"] = Field(
        "closed", description="closed: keep `concurrency` programs live; poisson: programs arrive at `rate_per_s`"
    )
    concurrency: PositiveInt = Field(16, le=1_000_000)
    rate_per_s: PositiveFloat | None = None
    system_prompt_tokens: NonNegativeInt = Field(0, le=10_000_000, description="shared by every program")
    task_prompt_tokens: Distribution = 1000
    turns: Distribution = 10
    output_tokens: Distribution = 200
    tool_latency_s: Distribution = 1.0
    observation_tokens: Distribution = 500
    max_context_tokens: PositiveInt | None = Field(
        None, description="a program ends before a turn whose prompt would exceed this (default: model context)"
    )

    @model_validator(mode="after")
    def _arrival_params(self) -> "WorkloadConfig":
        if self.arrival == "poisson" and self.rate_per_s is None:
            raise ValueError("rate_per_s is required when arrival is 'poisson'")
        return self


class PolicyConfig(_Strict):
    name: str = "round_robin"
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_policy(self) -> "PolicyConfig":
        from tasim.policies import policy_class, validate_params  # policies depend on core, not the reverse

        try:
            validate_params(self.name, self.params)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                allowed = ", ".join(policy_class(self.name).params_model.model_fields) or "none"
                raise ValueError(f"params.{field}: unknown parameter of {self.name} (allowed: {allowed})") from None
            raise ValueError(f"params.{field}: {err['msg']} (got {err.get('input')!r})") from None
        return self


class MetricsConfig(_Strict):
    warmup_s: NonNegativeFloat = Field(0.0, description="completions before this time are left out of rates")
    sample_interval_s: PositiveFloat = Field(5.0, description="period of per-worker KV/queue samples")
    log_kv_events: bool = Field(
        False, description="also write KV stored/removed events to the event log (policies always get them; they dominate its size)"
    )


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    seed: int = 0
    duration_s: PositiveFloat = Field(600.0, le=10_000_000, description="simulated seconds")
    cluster: ClusterConfig = ClusterConfig()
    workload: WorkloadConfig = WorkloadConfig()
    policy: PolicyConfig = PolicyConfig()
    metrics: MetricsConfig = MetricsConfig()

    @model_validator(mode="after")
    def _window(self) -> "Scenario":
        if self.metrics.warmup_s >= self.duration_s:
            raise ValueError(f"metrics.warmup_s ({self.metrics.warmup_s}) must be < duration_s ({self.duration_s})")
        return self

    @property
    def max_context_tokens(self) -> int:
        return self.workload.max_context_tokens or specs.models()[self.cluster.model].max_context


# --- loading ---------------------------------------------------------------------------------


def _model_at(model: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at ``loc`` (for listing allowed keys)."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
        current = annotation if isinstance(annotation, type) else None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _describe(error: Mapping[str, Any]) -> str:
    loc = tuple(error["loc"])
    field = ".".join(str(p) for p in loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        owner = _model_at(Scenario, loc[:-1])
        allowed = ", ".join(owner.model_fields) if owner else "see `python -m tasim schema`"
        return f"{field}: unknown key (allowed: {allowed})"
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] not in ("missing",) and "input" in error and not isinstance(error["input"], (dict, list)):
        return f"{field}: {message} (got {error['input']!r})"
    return f"{field}: {message}"


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply ``dotted.key=value`` (value parsed as YAML) to the raw scenario mapping."""
    key, sep, text = assignment.partition("=")
    if not sep or not key.strip():
        raise ScenarioError(f"--set {assignment!r}: expected dotted.key=value")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    parts = key.strip().split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ScenarioError(f"--set {key}: {'.'.join(parts[: i + 1])} is not a mapping")
        node = child
    node[parts[-1]] = value


def parse_scenario(raw: Any, source: str, overrides: Sequence[str] = ()) -> Scenario:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: top level must be a mapping of keys, got {type(raw).__name__}")
    for assignment in overrides:
        apply_override(raw, assignment)
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(f"{source}: {_describe(exc.errors()[0])}") from None


def load_scenario(path: str | Path, overrides: Sequence[str] = ()) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ScenarioError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ScenarioError(f"{path}: is a directory, expected a YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read ({exc.__class__.__name__})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ScenarioError(f"{where}: YAML syntax error: {problem}") from None
    return parse_scenario(raw, str(path), overrides)
