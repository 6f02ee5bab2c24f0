"""Where every random draw and every block-hash owner key of a run comes from.

Same scenario + seed => byte-identical event log. That holds only while each consumer of
randomness draws from a stream of its own, derived from the scenario's seed, and while each
kind of content that owns KV blocks (see `tasim.core.model`) takes its owner keys from a range no
other kind uses. Both are defined here, once, for simulation and live mode alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

# --- seed streams ------------------------------------------------------------------------------


class Stream(IntEnum):
    """The second word of every stream's seed: ``[scenario seed, stream, ...]``. The values are
    part of every recorded log; changing one changes every run that draws from it."""

    PROGRAM = 1  # a synthetic program's plan: [seed, PROGRAM, program index]
    ROUTER = 2  # split into the policy's stream and the arrival process (see `router_rngs`)
    PROMPT_GROUP = 3  # a prompt group's shared task prompt: [seed, PROMPT_GROUP, group]
    TRAINING = 4  # an RL rollout's training time between steps
    TOKENS = 11  # live mode: token ids of synthetic content: [seed, TOKENS, *what the tokens are]


def program_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, Stream.PROGRAM, index])


def prompt_group_rng(seed: int, group: int) -> np.random.Generator:
    return np.random.default_rng([seed, Stream.PROMPT_GROUP, group])


def training_rng(seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, Stream.TRAINING])


def token_rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([seed, Stream.TOKENS, *key])


def policy_rng(seed: int) -> np.random.Generator:
    """The policy's tie-breaks: the same in simulation and live mode for one seed."""
    return np.random.default_rng(np.random.SeedSequence([seed, Stream.ROUTER]).spawn(2)[0])


def arrival_rng(seed: int) -> np.random.Generator:
    """Poisson program arrivals: the simulator's, the live driver's and an exported trace's."""
    return np.random.default_rng(np.random.SeedSequence([seed, Stream.ROUTER]).spawn(2)[1])


# --- block-hash owner keys ---------------------------------------------------------------------

# A simulated block's hash is ``block index * OWNER_SPACE + owner`` (see `tasim.core.model`), so
# every owner key is below OWNER_SPACE.
OWNER_SPACE = 1 << 34


@dataclass(frozen=True, slots=True)
class OwnerRange:
    """Owner keys ``[start, stop)`` for one kind of content; `key` numbers them from 0."""

    name: str
    start: int
    stop: int

    def key(self, offset: int) -> int:
        if not 0 <= offset < self.stop - self.start:
            raise OverflowError(f"owner keys for {self.name}: offset {offset} outside [0, {self.stop - self.start})")
        return self.start + offset

    @property
    def size(self) -> int:
        return self.stop - self.start


SHARED_PROMPT = OwnerRange("the system prompt every program shares", 0, 1)
PROMPT_GROUPS = OwnerRange("prompt groups (a GRPO prompt's samples share its task prompt)", 1, 1 << 20)
PROGRAMS = OwnerRange("synthetic programs", 1 << 20, 1 << 26)
TRACE_OUTPUTS = OwnerRange("replayed requests' generated tokens", 1 << 26, 1 << 33)
PRIVATE_OUTPUTS = OwnerRange("outputs an engine that cannot reuse generated blocks caches", 1 << 33, OWNER_SPACE)

OWNER_RANGES = (SHARED_PROMPT, PROMPT_GROUPS, PROGRAMS, TRACE_OUTPUTS, PRIVATE_OUTPUTS)
