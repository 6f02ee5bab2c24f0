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
import sys
from array import array
from collections.abc import Sequence

import xxhash

SEED = 1337
_PAIR = struct.Struct("<QQ")
# array("I") is the machine's unsigned int: where that is little-endian u32 (x86, ARM), packing
# a token list is one C loop; elsewhere struct does it.
_ARRAY_IS_LE_U32 = sys.byteorder == "little" and array("I").itemsize == 4


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian u32, the bytes Dynamo hashes (OverflowError outside u32)."""
    if _ARRAY_IS_LE_U32:
        return array("I", token_ids).tobytes()
    return struct.pack(f"<{len(token_ids)}I", *token_ids)


def local_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Unchained per-block hashes (Dynamo's ``compute_block_hash_for_seq``)."""
    packed = pack_tokens(token_ids)
    step = 4 * block_size
    hash64 = xxhash.xxh3_64_intdigest
    return [hash64(packed[start : start + step], seed=SEED) for start in range(0, len(packed) // step * step, step)]


def sequence_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of every full block of ``token_ids``: what engines report as block hashes."""
    return chain_packed(None, pack_tokens(token_ids), block_size)


def chain_from(parent: int | None, token_ids: Sequence[int], block_size: int) -> list[int]:
    """Sequence hashes of the full blocks of ``token_ids`` when they follow a block whose
    sequence hash is ``parent`` (None: they start the sequence)."""
    return chain_packed(parent, pack_tokens(token_ids), block_size)


def chain_packed(parent: int | None, packed: bytes, block_size: int) -> list[int]:
    """`chain_from` of tokens already packed (`pack_tokens`)."""
    hash64 = xxhash.xxh3_64_intdigest
    pair = _PAIR.pack
    step = 4 * block_size
    chained: list[int] = []
    previous = parent
    for start in range(0, len(packed) // step * step, step):
        local = hash64(packed[start : start + step], seed=SEED)
        previous = local if previous is None else hash64(pair(previous, local), seed=SEED)
        chained.append(previous)
    return chained
