"""Roofline step time from GPU and model specifications, with tensor parallelism.

One step reads the weights its tokens touch (all of them for dense models; for MoE the
expected distinct experts of the batch), reads the KV of every context it attends to, and does
2 FLOPs per active parameter per token plus attention. Its time is the larger of compute time
and memory time at the configured efficiencies, plus a fixed per-step overhead and, with TP > 1,
two ring all-reduces per layer. Mixed prefill/decode steps share one weight read, which is the
point of continuous batching with chunked prefill.
"""

from __future__ import annotations

from tasim.config.hardware import DTYPE_BYTES, GpuSpec, ModelSpec
from tasim.sim.perf.perf_model import StepShape

ACTIVATION_BYTES = 2  # all-reduce payloads are bf16 activations


class Roofline:
    name = "roofline"

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        tp: int,
        weight_dtype: str,
        kv_dtype: str,
        mfu: float,
        bandwidth_efficiency: float,
        step_overhead_ms: float,
        allreduce_latency_us: float,
        speedup_ratio: float = 1.0,
    ) -> None:
        self.model = model
        self.tp = tp
        self.weight_bytes = DTYPE_BYTES[weight_dtype]
        self.kv_bytes_per_token = model.kv_bytes_per_token(kv_dtype)
        self.flops_per_s = gpu.peak_flops(weight_dtype) * tp * mfu
        self.bytes_per_s = gpu.hbm_bandwidth * tp * bandwidth_efficiency
        self.overhead_s = step_overhead_ms * 1e-3
        self.attn_flops_per_pair = 4.0 * model.layers * model.heads * model.head_dim
        self.allreduce_fixed_s = 2 * model.layers * allreduce_latency_us * 1e-6 if tp > 1 else 0.0
        self.allreduce_s_per_token = (
            2 * model.layers * 2 * (tp - 1) / tp * model.hidden * ACTIVATION_BYTES / gpu.interconnect_bandwidth if tp > 1 else 0.0
        )
        self.scale = 1.0 / speedup_ratio

    def step_time(self, shape: StepShape) -> float:
        tokens = shape.scheduled_tokens
        if tokens == 0:
            return 0.0
        model = self.model
        flops = 2.0 * model.active_params * tokens + self.attn_flops_per_pair * shape.attn_pairs
        bytes_moved = model.weights_read_params(tokens) * self.weight_bytes + (shape.kv_read_tokens + tokens) * self.kv_bytes_per_token
        compute_s = flops / self.flops_per_s
        memory_s = bytes_moved / self.bytes_per_s
        comm_s = self.allreduce_fixed_s + self.allreduce_s_per_token * tokens
        return (max(compute_s, memory_s) + comm_s + self.overhead_s) * self.scale

    def decode_step_ends(self, start: float, running: int, context_tokens: int, steps: int, kv_capacity_tokens: int) -> list[float]:
        # step_time's operations on a decode shape, in the same order; the terms every step of
        # the series shares are the same floats computed once
        model = self.model
        token_flops = 2.0 * model.active_params * running
        weight_bytes = model.weights_read_params(running) * self.weight_bytes
        comm_s = self.allreduce_fixed_s + self.allreduce_s_per_token * running
        attn_flops_per_pair, kv_bytes_per_token = self.attn_flops_per_pair, self.kv_bytes_per_token
        flops_per_s, bytes_per_s, overhead_s, scale = self.flops_per_s, self.bytes_per_s, self.overhead_s, self.scale
        half = running / 2
        ends = []
        end = start
        context = context_tokens
        for _ in range(steps):
            compute_s = (token_flops + attn_flops_per_pair * (context + half)) / flops_per_s
            memory_s = (weight_bytes + (context + running) * kv_bytes_per_token) / bytes_per_s
            end = end + (max(compute_s, memory_s) + comm_s + overhead_s) * scale
            ends.append(end)
            context += running
        return ends
