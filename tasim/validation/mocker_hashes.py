"""The sequence hashes Dynamo's replay gives the prompt blocks of a trace, prompt by prompt: what
the ``dynamo_mocker`` host tier needs to order a cohort of blocks as the mocker does
(`tasim.sim.engine.mocker_host_tier`, ``cohort_ranks``).

Paths cited are AISimulate's (aisimulate-core 0.13.0). The replay interns the trace's
``hash_ids`` to 0, 1, 2, ... in order of first appearance, row by row
(``replay/loadgen/trace.rs``, ``HashIdInterner``), makes each prompt by repeating a trace block's
interned id over its tokens (``synthesize_validated_trace_tokens``), hashes each engine block's
tokens as little-endian u32 with XXH3-64, seed 1337, and chains them: a prompt's first block's
sequence hash is its block hash, each next one the XXH3-64 of the parent's sequence hash and the
block's hash as two little-endian u64 (``engine/common/hashing.rs``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from tasim.workloads.trace_formats.reading import engine_block_hashes

XXH3_SEED = 1337


def mocker_cohort_ranks(path: Path, trace_block_size: int, block_size: int) -> dict[int, tuple[int, ...]]:
    """tasim's hash of each full prompt block of the trace at ``path`` -> the ranks, by depth, of
    the replay's sequence hashes (`mocker_sequence_hashes`) of a prompt's full blocks, from its
    first to at least that block: rank r is the r-th smallest hash of that prompt. Chained hashes
    make any prompt holding the block agree on the blocks up to it, so the prompts share a few
    tuples, and one look-up orders the blocks of a whole copy (they are consecutive blocks of one
    chain) as their hashes order them."""
    order: dict[int, int] = {}
    ranks: dict[int, tuple[int, ...]] = {}
    for keys in _hash_new_prompts(path, trace_block_size, block_size, order):
        hashes = [order[key] for key in keys]
        by_depth = [0] * len(keys)
        for rank, depth in enumerate(sorted(range(len(keys)), key=hashes.__getitem__)):
            by_depth[depth] = rank
        prompt = tuple(by_depth)
        for key in keys:
            ranks.setdefault(key, prompt)
    return ranks


def mocker_sequence_hashes(path: Path, trace_block_size: int, block_size: int) -> dict[int, int]:
    """tasim's hash of each full prompt block of the trace at ``path`` -> the replay's sequence
    hash of that block (the first request to name a block gives it)."""
    order: dict[int, int] = {}
    for _ in _hash_new_prompts(path, trace_block_size, block_size, order):
        pass
    return order


def _hash_new_prompts(path: Path, trace_block_size: int, block_size: int, order: dict[int, int]) -> Iterator[tuple[int, ...]]:
    """Reads the trace once, adding to ``order`` the sequence hash of each block no earlier row
    named, and yields tasim's hashes of the full prompt blocks of each row that named one."""
    interned: dict[int, int] = {}
    block_hash_of: dict[bytes, int] = {}
    for record in _lines(path):
        hash_ids: list[int] = record["hash_ids"]
        canonical = [interned.setdefault(hash_id, len(interned)) for hash_id in hash_ids]
        input_length: int = record["input_length"]
        keys = engine_block_hashes(hash_ids, input_length, block_size, trace_block_size)
        if all(key in order for key in keys):
            continue
        tokens = np.repeat(np.array(canonical, dtype="<u4"), trace_block_size)[:input_length].tobytes()
        width = block_size * 4
        parent = 0
        for j, key in enumerate(keys):
            block = tokens[j * width : (j + 1) * width]
            block_hash = block_hash_of.get(block)
            if block_hash is None:
                block_hash = block_hash_of[block] = xxhash.xxh3_64_intdigest(block, seed=XXH3_SEED)
            parent = block_hash if j == 0 else xxhash.xxh3_64_intdigest(struct.pack("<QQ", parent, block_hash), seed=XXH3_SEED)
            order.setdefault(key, parent)
        yield keys


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    """The trace's rows in file order, as the replay reads them (not tasim's replay order,
    which groups a session's turns)."""
    with path.open() as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)
