"""Every step takes the same time: for comparing scheduling decisions step by step.

With timing taken out of the picture, two engines given the same arrivals make the same
decisions at the same instants exactly when their schedulers agree (``tasim validate vllm``).
"""

from __future__ import annotations

from tasim.sim.perf.perf_model import StepShape


class FixedStep:
    name = "fixed"

    def __init__(self, step_ms: float, speedup_ratio: float = 1.0) -> None:
        self.step_s = step_ms * 1e-3 / speedup_ratio

    def step_time(self, shape: StepShape) -> float:
        return self.step_s if shape.scheduled_tokens else 0.0

    def decode_step_ends(self, start: float, running: int, context_tokens: int, steps: int, kv_capacity_tokens: int) -> list[float]:
        ends = []
        end = start
        for _ in range(steps):
            end = end + self.step_s
            ends.append(end)
        return ends
