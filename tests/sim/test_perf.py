"""Perf models at given inputs, with exact expected values."""

from __future__ import annotations

import pytest

from tasim.config import hardware
from tasim.sim.perf.perf_model import StepShape
from tasim.sim.perf.polynomial import DynamoPolynomial, decode_ms, prefill_ms
from tasim.sim.perf.roofline import Roofline


def test_polynomial_prefill_and_decode_curves() -> None:
    assert prefill_ms(0) == 0.0  # no prefill work, no fixed 16.5 ms
    assert prefill_ms(1000) == pytest.approx(4.209989e-7 * 1e6 + 15.18344 + 16.50142, abs=1e-12)
    assert prefill_ms(1000) == pytest.approx(32.1058589, abs=1e-9)
    assert prefill_ms(3515) == pytest.approx(75.0718, abs=1e-3)  # ~77 ms measured on live Dynamo
    assert decode_ms(0.0) == pytest.approx(5.74)
    assert decode_ms(0.5) == pytest.approx(26.31, abs=1e-12)
    assert decode_ms(0.11) == pytest.approx(11.369646, abs=1e-9)  # ITL ~11.3 ms measured live
    assert decode_ms(3.0) == 1.0  # floored at 1 ms


def test_polynomial_step_sums_phases_with_integer_means() -> None:
    model = DynamoPolynomial()
    # Two prefilling requests: prefixes 10 and 0, chunks 5 and 6. The mocker's integer means give
    # N = 2 * ((21 // 2) - (10 // 2)) = 10, not 11.
    shape = StepShape(
        prefill_seqs=2, prefill_prompt_tokens=11, prefill_prefix_tokens=10, decode_seqs=3, decode_kv_tokens=4000, kv_capacity_tokens=16000
    )
    expected_ms = prefill_ms(10) + decode_ms(0.25)
    assert model.step_time(shape) == pytest.approx(expected_ms / 1000, abs=1e-15)
    assert DynamoPolynomial(speedup_ratio=4.0).step_time(shape) == pytest.approx(expected_ms / 4000, abs=1e-15)
    # Requests sharing a prefix each count it, so the sum can pass the pool; the mocker clamps u
    # at 1 (found replaying 8 programs with a shared system prompt at u = 1.07: 34.01 ms steps).
    over = StepShape(decode_seqs=8, decode_kv_tokens=70_024, kv_capacity_tokens=65_536)
    assert model.step_time(over) == pytest.approx(decode_ms(1.0) / 1000, abs=1e-15)
    # A request finishing its prefill emits a token but adds no decode term, as in the mocker.
    assert model.step_time(StepShape(decode_seqs=1, decode_kv_tokens=0)) == 0.0
    assert model.step_time(StepShape(decode_seqs=1, decode_kv_tokens=1, kv_capacity_tokens=10**12)) == pytest.approx(5.74e-3)


def _roofline(model: str, gpu: str, tp: int, dtype: str) -> Roofline:
    return Roofline(hardware.models()[model], hardware.gpus()[gpu], tp, dtype, dtype, 0.5, 0.8, 3.0, 10.0)


def test_roofline_decode_is_memory_bound() -> None:
    model = _roofline("Llama-3.1-8B", "H100", 1, "bf16")
    shape = StepShape(scheduled_tokens=1, attn_pairs=1000.5, kv_read_tokens=1000, decode_seqs=1)
    # (8.03e9 weights * 2 B + 1001 tokens * 131072 B of KV) / (3.35e12 B/s * 0.8) + 3 ms overhead
    expected = (8.03e9 * 2 + 1001 * 131072) / (3.35e12 * 0.8) + 3e-3
    assert model.step_time(shape) == pytest.approx(expected, rel=1e-12)
    assert model.step_time(shape) == pytest.approx(9.04149368e-3, rel=1e-8)


def test_roofline_prefill_is_compute_bound() -> None:
    model = _roofline("Llama-3.1-8B", "H100", 1, "bf16")
    shape = StepShape(scheduled_tokens=8192, attn_pairs=8192 * 4096, prefill_seqs=1, prefill_prompt_tokens=8192)
    flops = 2 * 8.03e9 * 8192 + 4 * 32 * 32 * 128 * 8192 * 4096
    assert model.step_time(shape) == pytest.approx(flops / (989e12 * 0.5) + 3e-3, rel=1e-12)


def test_roofline_tensor_parallel_adds_allreduce() -> None:
    one = _roofline("Qwen3-32B", "H200", 1, "bf16")
    four = _roofline("Qwen3-32B", "H200", 4, "bf16")
    shape = StepShape(scheduled_tokens=64, attn_pairs=64 * 2000, kv_read_tokens=64 * 2000, decode_seqs=64)
    body_one = one.step_time(shape) - 3e-3
    allreduce = 2 * 64 * (10e-6 + 2 * 3 / 4 * 64 * 5120 * 2 / 450e9)
    assert four.step_time(shape) == pytest.approx(body_one / 4 + allreduce + 3e-3, rel=1e-12)


def test_moe_weights_read_grow_with_batch() -> None:
    qwen = hardware.models()["Qwen3-30B-A3B"]
    assert qwen.weights_read_params(1) == pytest.approx(3.32091008e9, rel=1e-8)  # ~3.3B active
    assert qwen.weights_read_params(64) == pytest.approx(30.03395771e9, rel=1e-8)  # nearly all 30.5B
    assert hardware.models()["Llama-3.1-8B"].weights_read_params(64) == 8.03e9


def test_kv_blocks_auto_from_memory_left_after_weights() -> None:
    glm = hardware.models()["GLM-4.6"]
    assert glm.kv_bytes_per_token("fp8") == 2 * 92 * 8 * 128
    blocks = hardware.kv_blocks_auto(glm, hardware.gpus()["H100"], 8, 16, "fp8", "fp8", 0.9, 2.0)
    assert blocks == int((8 * (80 * 0.9 - 2.0) * 2**30 - 355e9) // (188416 * 16)) == 81699
    with pytest.raises(ValueError, match="leaves no KV memory"):
        hardware.kv_blocks_auto(glm, hardware.gpus()["H100"], 4, 16, "bf16", "bf16", 0.9, 2.0)


def test_every_model_fits_somewhere_and_specs_load() -> None:
    assert set(hardware.gpus()) >= {"H100", "H200", "H20", "A100", "B200", "RTX5090"}
    assert set(hardware.models()) == {
        "Llama-3.1-8B",
        "Qwen3-8B",
        "Qwen3-32B",
        "Qwen3-30B-A3B",
        "Qwen3-Coder-30B-A3B",
        "Qwen3-235B-A22B",
        "Qwen3-Coder-480B-A35B",
        "GLM-4.6",
    }
    for model in hardware.models().values():
        assert 0 < model.active_params <= model.total_params
        assert model.non_expert_params > 0
