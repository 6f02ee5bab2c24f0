"""What a perf model sees of one engine step, and the protocol every perf model follows."""

from __future__ import annotations

from typing import Protocol


class StepShape:
    """The work of one engine iteration (a batch of prefill chunks and decodes).

    scheduled_tokens:      tokens computed this step, over all requests
    attn_pairs:            sum over requests of n * (context before + n / 2): attention work
    kv_read_tokens:        sum over requests of the context already in KV before this step
    prefill_seqs:          requests computing prompt tokens this step
    prefill_prompt_tokens: prompt tokens computed this step (recomputed output tokens excluded,
                           as Dynamo's mocker counts them)
    prefill_prefix_tokens: tokens those prefilling requests had computed or cached before
    decode_seqs:           requests whose known tokens are all computed after this step (they
                           emit a token; includes requests finishing their prefill)
    decode_kv_tokens:      sum over requests that have emitted a token (decoding, or recomputing
                           after preemption) of their known tokens: the KV a decode step reads
    kv_capacity_tokens:    the KV pool's size in tokens
    """

    # A plain class, not a dataclass: a compiled dataclass still runs the interpreted __init__
    # that the dataclasses module writes, and engines build several shapes per step.
    __slots__ = (
        "scheduled_tokens",
        "attn_pairs",
        "kv_read_tokens",
        "prefill_seqs",
        "prefill_prompt_tokens",
        "prefill_prefix_tokens",
        "decode_seqs",
        "decode_kv_tokens",
        "kv_capacity_tokens",
    )

    def __init__(
        self,
        scheduled_tokens: int = 0,
        attn_pairs: float = 0.0,
        kv_read_tokens: int = 0,
        prefill_seqs: int = 0,
        prefill_prompt_tokens: int = 0,
        prefill_prefix_tokens: int = 0,
        decode_seqs: int = 0,
        decode_kv_tokens: int = 0,
        kv_capacity_tokens: int = 1,
    ) -> None:
        self.scheduled_tokens = scheduled_tokens
        self.attn_pairs = attn_pairs
        self.kv_read_tokens = kv_read_tokens
        self.prefill_seqs = prefill_seqs
        self.prefill_prompt_tokens = prefill_prompt_tokens
        self.prefill_prefix_tokens = prefill_prefix_tokens
        self.decode_seqs = decode_seqs
        self.decode_kv_tokens = decode_kv_tokens
        self.kv_capacity_tokens = kv_capacity_tokens


class PerfModel(Protocol):
    name: str

    def step_time(self, shape: StepShape) -> float:
        """Seconds the engine spends on this step."""
        ...

    def decode_step_ends(self, start: float, running: int, context_tokens: int, steps: int, kv_capacity_tokens: int) -> list[float]:
        """End times of ``steps`` pure decode steps in a row, the first starting at ``start``:
        in step ``i`` (from 0) each of ``running`` requests computes its one pending token on top
        of ``context_tokens + i * running`` computed tokens in all. Bit for bit the running sum
        of what `step_time` gives those steps' `decode_shape`, so fast-forwarding stays exact."""
        ...


def decode_shape(running: int, context_tokens: int, kv_capacity_tokens: int) -> StepShape:
    """The shape of one step in which each of ``running`` decoding requests computes its one
    pending token on top of ``context_tokens`` computed tokens in all."""
    return StepShape(
        scheduled_tokens=running,
        attn_pairs=context_tokens + running / 2,
        kv_read_tokens=context_tokens,
        decode_seqs=running,
        decode_kv_tokens=context_tokens + running,
        kv_capacity_tokens=kv_capacity_tokens,
    )


def summed(a: StepShape, b: StepShape) -> StepShape:
    """The shape of one step doing the work of both (on the same pool)."""
    return StepShape(
        a.scheduled_tokens + b.scheduled_tokens,
        a.attn_pairs + b.attn_pairs,
        a.kv_read_tokens + b.kv_read_tokens,
        a.prefill_seqs + b.prefill_seqs,
        a.prefill_prompt_tokens + b.prefill_prompt_tokens,
        a.prefill_prefix_tokens + b.prefill_prefix_tokens,
        a.decode_seqs + b.decode_seqs,
        a.decode_kv_tokens + b.decode_kv_tokens,
        a.kv_capacity_tokens,
    )
