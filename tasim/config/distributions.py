"""Seeded random distributions for workload quantities (token counts, turns, tool latency).

In a scenario file a distribution is either a plain number (fixed) or a mapping with a
``kind``: ``fixed``, ``uniform``, ``lognormal``, ``pareto`` or ``empirical``.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

# Every number a sample grows with is finite and at most this (a billion tokens, turns or
# seconds), so samples stay finite: an inf or 1e300 cannot become a token count or an event time.
# A cap (``max``) may stay infinite: it only lowers samples.
LIMIT = 1e9


class _Dist(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    def sample(self, rng: np.random.Generator) -> float:
        raise NotImplementedError

    def mean(self) -> float:
        raise NotImplementedError

    def sample_int(self, rng: np.random.Generator, minimum: int = 0) -> int:
        return max(minimum, int(round(self.sample(rng))))

    def stated_lows(self) -> list[tuple[str, float]]:
        """(parameter, value) for each value the parameters state that draws fall to or centre
        on: a count whose distribution states one below the count's minimum is refused, since
        `sample_int` would silently raise those draws."""
        raise NotImplementedError


class Fixed(_Dist):
    """Always ``value``; a bare number in a scenario is one."""

    kind: Literal["fixed"] = "fixed"
    value: float = Field(ge=0, le=LIMIT, description="the value every draw gives")

    def sample(self, rng: np.random.Generator) -> float:
        return self.value

    def mean(self) -> float:
        return self.value

    def stated_lows(self) -> list[tuple[str, float]]:
        return [("value", self.value)]


class Uniform(_Dist):
    kind: Literal["uniform"]
    low: float = Field(ge=0, le=LIMIT, description="least value")
    high: float = Field(ge=0, le=LIMIT, description="greatest value (at least low)")

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))

    def mean(self) -> float:
        return (self.low + self.high) / 2

    def stated_lows(self) -> list[tuple[str, float]]:
        return [("low", self.low)]


class LogNormal(_Dist):
    """exp(N(ln median, sigma²)), optionally clipped to [min, max] (clipping shifts the mean)."""

    kind: Literal["lognormal"]
    median: float = Field(gt=0, le=LIMIT, description="the median, exp of the underlying normal's mean")
    sigma: float = Field(ge=0, le=5, description="standard deviation of the underlying normal (the spread)")
    min: float = Field(default=0.0, ge=0, le=LIMIT, description="draws below it are raised to it")
    max: float = Field(
        default=math.inf, gt=0, allow_inf_nan=True, description="draws above it are lowered to it (at least min)"
    )  # inf: no cap (a cap only lowers samples)

    @model_validator(mode="after")
    def _ordered(self) -> LogNormal:
        if self.max < self.min:  # every draw would be max: min would be ignored without a word
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def sample(self, rng: np.random.Generator) -> float:
        value = self.median * math.exp(self.sigma * float(rng.standard_normal()))
        return min(max(value, self.min), self.max)

    def mean(self) -> float:
        return self.median * math.exp(self.sigma**2 / 2)

    def stated_lows(self) -> list[tuple[str, float]]:
        # without a min the lower tail is unbounded; a median at or above a count's minimum
        # keeps the draws raised to it a tail (the presets set min)
        floor = [("min", self.min)] if self.min > 0 else []
        return [*floor, ("median", self.median), ("max", self.max)]


class Pareto(_Dist):
    """Heavy-tailed: ``scale / U^(1/alpha)`` for U uniform on (0, 1], optionally capped at ``max``
    (a tool timeout). Mean ``alpha * scale / (alpha - 1)`` for alpha > 1, uncapped."""

    kind: Literal["pareto"]
    scale: float = Field(gt=0, le=LIMIT, description="the least value, where the tail starts")
    # from 0.1 up a sample stays finite for the smallest u (2**-53); near 0.05 u ** (1 / alpha) is 0
    alpha: float = Field(ge=0.1, description="tail index: the smaller, the heavier the tail")
    max: float = Field(
        default=math.inf, gt=0, allow_inf_nan=True, description="draws above it are lowered to it (at least scale)"
    )  # inf: no cap (a cap only lowers samples)

    @model_validator(mode="after")
    def _ordered(self) -> Pareto:
        if self.max < self.scale:  # every draw would be max, the distribution a fixed value
            raise ValueError(f"max ({self.max}) must be >= scale ({self.scale}), the smallest draw")
        return self

    def sample(self, rng: np.random.Generator) -> float:
        u = 1.0 - float(rng.random())  # in (0, 1]
        root: float = u ** (1.0 / self.alpha)  # of a positive u: real (float ** float is typed Any)
        return min(self.scale / root, self.max)

    def mean(self) -> float:
        return self.alpha * self.scale / (self.alpha - 1) if self.alpha > 1 else math.inf

    def stated_lows(self) -> list[tuple[str, float]]:
        return [("scale", self.scale)]  # max >= scale


class Empirical(_Dist):
    """Draws one of ``values`` (with optional ``weights``)."""

    kind: Literal["empirical"]
    values: list[Annotated[float, Field(le=LIMIT)]] = Field(min_length=1, description="the values a draw picks from")
    weights: list[Annotated[float, Field(le=LIMIT)]] | None = Field(None, description="relative weight of each value (default: equal)")

    @model_validator(mode="after")
    def _weights_match(self) -> Empirical:
        if any(v < 0 for v in self.values):
            raise ValueError("values must be >= 0")
        if self.weights is not None:
            if len(self.weights) != len(self.values):
                raise ValueError(f"weights has {len(self.weights)} entries, values has {len(self.values)}")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError("weights must be >= 0 with a positive sum")
        return self

    def _probabilities(self) -> np.ndarray | None:
        if self.weights is None:
            return None
        w = np.asarray(self.weights, dtype=float)
        probabilities: np.ndarray = w / w.sum()
        return probabilities

    def sample(self, rng: np.random.Generator) -> float:
        index = int(rng.choice(len(self.values), p=self._probabilities()))
        return self.values[index]

    def mean(self) -> float:
        p = self._probabilities()
        return float(np.mean(self.values)) if p is None else float(np.dot(self.values, p))

    def stated_lows(self) -> list[tuple[str, float]]:
        return [("values", min(self.values))]


def _number_is_fixed(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"kind": "fixed", "value": value}
    return value


DISTRIBUTION_KINDS = (Fixed, Uniform, LogNormal, Pareto, Empirical)

_Tagged = Annotated[Fixed | Uniform | LogNormal | Pareto | Empirical, Field(discriminator="kind")]

# The JSON schema (`python -m tasim schema`) shows what a file may hold, a plain number too
Distribution = Annotated[
    _Tagged,
    BeforeValidator(_number_is_fixed, json_schema_input_type=Annotated[float, Field(ge=0, le=LIMIT)] | _Tagged),
]
