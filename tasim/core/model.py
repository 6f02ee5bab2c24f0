"""Domain model shared by simulation, live mode and policies: requests and block identity.

Block identity: a block's hash stands for the whole token prefix up to the end of that block
(a chained hash, as engines report in KV events). Simulated workloads do not carry token ids;
instead a context is a sequence of *segments*, each owned by whoever created that content (the
shared system prompt, a prompt group, a program). Block ``i`` covers tokens
``[i*bs, (i+1)*bs)``; its prefix is identical for two contexts exactly when both the segment
that contains its last token and every earlier segment are shared, so its hash is
``i * 2**34 + owner_of_last_token`` (owner in the low bits: dicts and sets index by low bits,
and the block index alone would crowd every program's block ``i`` into one slot chain).
Policies and indexers treat hashes as opaque ints, which is also what live mode feeds them (Dynamo's XXH3 block hashes).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from tasim.core.determinism import OWNER_SPACE
from tasim.core.records import record

BlockHash = int

# Which content owns which keys (the shared system prompt, prompt groups, programs, replayed
# outputs...) is set in tasim.core.determinism, every key below OWNER_SPACE.


@record
class Segment:
    """Tokens ``[previous segment end, end)`` of a context were written by ``owner``."""

    end: int
    owner: int


def chained_block_hashes(segments: Sequence[Segment], block_size: int, start_block: int = 0) -> list[BlockHash]:
    """Hashes of the full blocks from ``start_block`` up to the end of the last segment."""
    if not segments:
        return []
    total = segments[-1].end
    hashes: list[BlockHash] = []
    seg = 0
    for index in range(start_block, total // block_size):
        last_token = (index + 1) * block_size - 1
        while segments[seg].end <= last_token:
            seg += 1
        hashes.append(index * OWNER_SPACE + segments[seg].owner)
    return hashes


def with_private_tail(prompt_hashes: Sequence[BlockHash], total_tokens: int, owner: int, block_size: int) -> tuple[BlockHash, ...]:
    """Extend a prompt's block hashes to ``total_tokens`` (prompt + output) with blocks only this
    request can have: its generated tokens, which no other prompt is known to contain."""
    # block i's hash is i * OWNER_SPACE + owner: a range, made in C
    tail = range(len(prompt_hashes) * OWNER_SPACE + owner, total_tokens // block_size * OWNER_SPACE + owner, OWNER_SPACE)
    return tuple(prompt_hashes) + tuple(tail)


def shared_prefix_end(theirs: Sequence[BlockHash], ours: Sequence[BlockHash], depth: int, limit: int) -> int:
    """How far two chains that hold the same block at ``depth`` go on agreeing, up to ``limit``
    (at most both lengths): the first depth where they differ, or ``limit``. Chained hashes
    agree on a prefix and differ after it, so one comparison settles the common case and a
    binary search finds the divergence otherwise."""
    if theirs is ours or theirs[limit - 1] == ours[limit - 1]:
        return limit
    return bisect_left(range(depth + 1, limit), True, key=lambda d: theirs[d] != ours[d]) + depth + 1


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``tokens`` (the partial tail block counts)."""
    return -(-tokens // block_size)


@record
class RequestSpec:
    """One LLM call as the router and the engine see it.

    ``block_hashes`` covers every full block of prompt *and* output tokens: the engine caches
    output blocks as they fill, and the program's next turn re-reads them as prompt.
    """

    id: str
    program: str
    turn: int
    prompt_tokens: int
    output_tokens: int
    history_tokens: int
    block_hashes: tuple[BlockHash, ...]
    # The named tool the call's output invokes, as an engine that parses tool calls out of the
    # output learns at the call's end (Continuum's fork); None where the workload names no tools.
    tool_call: str | None = None

    def prompt_block_hashes(self, block_size: int) -> tuple[BlockHash, ...]:
        return self.block_hashes[: self.prompt_tokens // block_size]

    def with_block_hashes(self, block_hashes: tuple[BlockHash, ...]) -> RequestSpec:
        """The same call with other block hashes (a quarter of ``dataclasses.replace``'s cost)."""
        return RequestSpec(
            self.id, self.program, self.turn, self.prompt_tokens, self.output_tokens, self.history_tokens, block_hashes, self.tool_call
        )


# Most tokens in one request, or in one trace block: 4x the longest context of any model tasim
# knows. A request's generated tokens get a block hash each, so one line of a small file asking
# for 10**12 output tokens would otherwise allocate terabytes.
MAX_TRACE_TOKENS = 1 << 20


def check_block_sizes(block_size: int, trace_block_size: int) -> None:
    """Engine and trace blocks must nest, so each engine block has one trace block holding its end."""
    if block_size <= 0 or trace_block_size <= 0:
        raise ValueError(f"block sizes must be positive (got block_size={block_size}, trace_block_size={trace_block_size})")
    if trace_block_size % block_size and block_size % trace_block_size:
        raise ValueError(f"block_size {block_size} must divide trace_block_size {trace_block_size} or be a multiple of it")
