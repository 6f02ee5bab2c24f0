"""Hardware and model specifications, kept as data (``hardware_data/*.yaml``) rather than code."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

GIB = 1 << 30
DTYPE_BYTES = {"bf16": 2, "fp8": 1}


class GpuSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    flops_bf16: PositiveFloat
    flops_fp8: PositiveFloat
    hbm_bandwidth: PositiveFloat
    memory_gib: PositiveFloat
    interconnect_bandwidth: PositiveFloat

    def peak_flops(self, weight_dtype: str) -> float:
        return self.flops_fp8 if weight_dtype == "fp8" else self.flops_bf16


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    total_params: PositiveFloat
    active_params: PositiveFloat
    max_context: PositiveInt
    experts: int = Field(default=0, ge=0)
    experts_per_token: int = Field(default=0, ge=0)
    moe_layers: int = Field(default=0, ge=0)
    moe_intermediate: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _moe_consistent(self) -> ModelSpec:
        if self.experts and not (0 < self.experts_per_token <= self.experts and self.moe_layers and self.moe_intermediate):
            raise ValueError(f"{self.name}: MoE models need experts_per_token, moe_layers, moe_intermediate")
        return self

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[kv_dtype]

    @property
    def expert_params(self) -> float:
        """Parameters of one expert in one MoE layer (gated MLP: three matrices)."""
        return 3.0 * self.hidden * self.moe_intermediate

    @property
    def non_expert_params(self) -> float:
        """Attention, dense layers, shared experts, embeddings: read by every forward pass."""
        return self.total_params - self.experts * self.moe_layers * self.expert_params

    def weights_read_params(self, batch_tokens: int) -> float:
        """Parameters read from HBM by one forward pass over ``batch_tokens`` tokens."""
        if not self.is_moe:
            return self.total_params
        e, k = self.experts, self.experts_per_token
        distinct = e * (1.0 - (1.0 - k / e) ** max(batch_tokens, 1))
        return self.non_expert_params + self.moe_layers * distinct * self.expert_params


def _load(resource: str) -> dict[str, dict[str, Any]]:
    """A data file: each entry's name and its fields."""
    text = resources.files("tasim.config").joinpath("hardware_data", resource).read_text()
    specs: dict[str, dict[str, Any]] = yaml.safe_load(text)
    return specs


@functools.cache
def gpus() -> dict[str, GpuSpec]:
    return {name: GpuSpec(name=name, **spec) for name, spec in _load("gpus.yaml").items()}


@functools.cache
def models() -> dict[str, ModelSpec]:
    return {name: ModelSpec(name=name, **spec) for name, spec in _load("models.yaml").items()}


def kv_blocks_auto(
    model: ModelSpec,
    gpu: GpuSpec,
    tp: int,
    block_size: int,
    weight_dtype: str,
    kv_dtype: str,
    gpu_memory_utilization: float,
    activation_reserve_gib: float,
) -> int:
    """KV pool size left after weights, as vLLM sizes it: memory x utilisation - weights - reserve."""
    budget = tp * (gpu.memory_gib * gpu_memory_utilization - activation_reserve_gib) * GIB
    free = budget - model.total_params * DTYPE_BYTES[weight_dtype]
    blocks = int(free // (model.kv_bytes_per_token(kv_dtype) * block_size))
    if blocks <= 0:
        need = model.total_params * DTYPE_BYTES[weight_dtype] / GIB
        raise ValueError(
            f"{model.name} ({weight_dtype}, {need:.0f} GiB of weights) leaves no KV memory on "
            f"{tp}x {gpu.name} ({gpu.memory_gib:g} GiB each at utilisation {gpu_memory_utilization})"
        )
    return blocks
