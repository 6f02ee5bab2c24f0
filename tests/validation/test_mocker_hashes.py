"""The sequence hashes Dynamo's replay gives a trace's prompt blocks, keyed by tasim's hash of
each block (the agreement of tiered replays, tests/validation/test_against_dynamo.py, depends on
them being the replay's own)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import xxhash

from tasim.validation.mocker_hashes import XXH3_SEED, mocker_cohort_ranks, mocker_sequence_hashes
from tasim.workloads.trace_formats.reading import engine_block_hashes


def _block(token: int, block_size: int) -> int:
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{block_size}I", *[token] * block_size), seed=XXH3_SEED)


def _chain(parent: int, block: int) -> int:
    return xxhash.xxh3_64_intdigest(struct.pack("<QQ", parent, block), seed=XXH3_SEED)


def test_ids_are_interned_in_file_order_and_blocks_chained(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 40, "output_length": 1, "hash_ids": [70, 50, 90]},
        {"timestamp": 1, "input_length": 33, "output_length": 1, "hash_ids": [70, 60, 80]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    order = mocker_sequence_hashes(path, 16, 16)
    # ids interned 70 -> 0, 50 -> 1, 90 -> 2, 60 -> 3, 80 -> 4; the partial tails have no block
    first = engine_block_hashes([70, 50, 90], 40, 16, 16)
    second = engine_block_hashes([70, 60, 80], 33, 16, 16)
    head = _block(0, 16)
    assert order == {first[0]: head, first[1]: _chain(head, _block(1, 16)), second[1]: _chain(head, _block(3, 16))}
    assert first[0] == second[0]
    # for the host tier's cohorts: each block gives the ranks of the first prompt naming it
    ranks = mocker_cohort_ranks(path, 16, 16)
    first_ranks = (0, 1) if order[first[0]] < order[first[1]] else (1, 0)  # by hash, within the prompt
    second_ranks = (0, 1) if order[second[0]] < order[second[1]] else (1, 0)
    assert ranks == {first[0]: first_ranks, first[1]: first_ranks, second[1]: second_ranks}


def test_engine_blocks_larger_than_trace_blocks_hash_their_tokens(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 64, "output_length": 1, "hash_ids": [5, 6, 7, 8]}) + "\n")
    (key,) = engine_block_hashes([5, 6, 7, 8], 64, 32, 16)[:1]
    tokens = [0] * 16 + [1] * 16
    assert mocker_sequence_hashes(path, 16, 32)[key] == xxhash.xxh3_64_intdigest(struct.pack("<32I", *tokens), seed=XXH3_SEED)
