"""Dynamo mocker's default ``polynomial`` timing model, for cross-checking against its replay.

Prefill: 4.209989e-7*N^2 + 1.518344e-2*N + 16.50142 ms for N new prompt tokens in the step
(0 when N = 0). N is computed as the mocker does, from integer means over the prefilling
requests: N = count * (sum(prefix+chunk) // count - sum(prefix) // count).
Decode: max(1, -25.74*u^2 + 54.01*u + 5.74) ms when a request that has already emitted a token
is scheduled (decoding, or recomputing after preemption; a request finishing its first prefill
in this step adds no decode time), for u = those requests' tokens (prompt + generated) over the
pool's capacity in tokens, at most 1
(requests sharing a prefix each count it, so the sum can pass the capacity). Measured on
Dynamo 1.6.1's replay: a 4 x 3,000-token burst's second step takes prefill(3,808) + decode(u =
2 x 3,001 / capacity) to 1e-6 ms. A mixed step costs the sum. Both divide by speedup_ratio.
"""

from __future__ import annotations

from tasim.sim.perf.perf_model import StepShape

PREFILL_COEFFS_MS = (4.209989e-7, 1.518344e-2, 16.50142)
DECODE_COEFFS_MS = (-25.74, 54.01, 5.74)
DECODE_FLOOR_MS = 1.0


def prefill_ms(new_tokens: int) -> float:
    if new_tokens <= 0:
        return 0.0
    a, b, c = PREFILL_COEFFS_MS
    return max(0.0, a * new_tokens * new_tokens + b * new_tokens + c)


def decode_ms(utilization: float) -> float:
    a, b, c = DECODE_COEFFS_MS
    return max(DECODE_FLOOR_MS, a * utilization * utilization + b * utilization + c)


class DynamoPolynomial:
    name = "dynamo_polynomial"

    def __init__(self, speedup_ratio: float = 1.0) -> None:
        self.scale = 1e-3 / speedup_ratio

    def step_time(self, shape: StepShape) -> float:
        ms = 0.0
        count = shape.prefill_seqs
        if count:
            mean_isl = (shape.prefill_prefix_tokens + shape.prefill_prompt_tokens) // count
            mean_prefix = shape.prefill_prefix_tokens // count
            ms += prefill_ms(count * (mean_isl - mean_prefix))
        if shape.decode_kv_tokens:
            ms += decode_ms(min(1.0, shape.decode_kv_tokens / shape.kv_capacity_tokens))
        return ms * self.scale

    def decode_step_ends(self, start: float, running: int, context_tokens: int, steps: int, kv_capacity_tokens: int) -> list[float]:
        # step_time's operations on a decode shape, in the same order (its prefill term is 0.0)
        a, b, c = DECODE_COEFFS_MS
        scale = self.scale
        ends = []
        end = start
        kv_tokens = context_tokens + running
        for _ in range(steps):
            u = min(1.0, kv_tokens / kv_capacity_tokens)
            end = end + max(DECODE_FLOOR_MS, a * u * u + b * u + c) * scale
            ends.append(end)
            kv_tokens += running
        return ends
