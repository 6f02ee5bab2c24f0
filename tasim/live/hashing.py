"""Block hashes from token ids, exactly as Dynamo computes them.

A block's *local* hash is XXH3-64 (seed 1337) over its token ids as little-endian u32; the
*sequence* hash chains them: ``seq[0] = local[0]``, ``seq[i] = XXH3-64(LE u64 seq[i-1] ||
LE u64 local[i])``. Engines report sequence hashes in their KV events (the mocker's
``block_hashes`` are exactly these), and a sequence hash stands for the whole prefix up to the end
of its block, which is the identity tasim's policies and simulated workloads already use. Only
full blocks are hashed; a partial tail block is never matched.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

SEED = 1337
_PAIR = struct.Struct("<QQ")


def local_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Unchained per-block hashes (Dynamo's ``compute_block_hash_for_seq``)."""
    pack = struct.Struct(f"<{block_size}I").pack
    hash64 = xxhash.xxh3_64_intdigest
    return [
        hash64(pack(*token_ids[start : start + block_size]), seed=SEED) for start in range(0, len(token_ids) // block_size * block_size, block_size)
    ]


def sequence_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of every full block of ``token_ids``: what engines report as block hashes."""
    return chain_from(None, token_ids, block_size)


def chain_from(parent: int | None, token_ids: Sequence[int], block_size: int) -> list[int]:
    """Sequence hashes of the full blocks of ``token_ids`` when they follow a block whose
    sequence hash is ``parent`` (None: they start the sequence)."""
    hash64 = xxhash.xxh3_64_intdigest
    pair = _PAIR.pack
    chained: list[int] = []
    previous = parent
    for local in local_block_hashes(token_ids, block_size):
        previous = local if previous is None else hash64(pair(previous, local), seed=SEED)
        chained.append(previous)
    return chained
