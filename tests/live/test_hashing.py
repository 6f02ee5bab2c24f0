"""`tasim.live.hashing`: Dynamo's block hashes computed locally, whole and chained on from a parent."""

from __future__ import annotations

import numpy as np
import pytest

# the live extra (not Dynamo itself: only the cross-check with Dynamo's own hashes needs that)
pytest.importorskip("msgpack")
pytest.importorskip("zmq")
pytest.importorskip("xxhash")

from conftest import tokens as _tokens  # noqa: E402

from tasim.live.hashing import chain_from, local_block_hashes, sequence_hashes  # noqa: E402


def test_local_block_hashes_match_dynamo() -> None:
    llm = pytest.importorskip("dynamo.llm")
    rng = np.random.default_rng(3)
    cases = [
        (_tokens(32), 16),
        (_tokens(40), 16),
        (_tokens(31), 16),
        (_tokens(3), 16),
        ([], 16),
        (rng.integers(0, 150_000, size=200).tolist(), 16),
        (rng.integers(0, 2**32, size=96).tolist(), 32),
        (_tokens(64), 4),
        (_tokens(30), 1),
    ]
    for tokens, bs in cases:
        expected = llm.compute_block_hash_for_seq(tokens, bs)
        assert local_block_hashes(tokens, bs) == expected, (len(tokens), bs)
        assert len(expected) == len(tokens) // bs


def test_sequence_hashes_match_a_real_mocker_kv_event() -> None:
    # block_hashes of a BlockStored event the Dynamo mocker published for tokens 5..36
    assert sequence_hashes(_tokens(32), 16) == [12561198586583604988, 17946932516392534513]
    # the first block's sequence hash is its local hash; later ones are chained, not local
    local = local_block_hashes(_tokens(32), 16)
    assert local[0] == 12561198586583604988 and local[1] != 17946932516392534513


def test_partial_tail_block_is_not_hashed() -> None:
    full = sequence_hashes(_tokens(32), 16)
    assert sequence_hashes(_tokens(47), 16) == full
    assert sequence_hashes(_tokens(15), 16) == []
    assert len(sequence_hashes(_tokens(48), 16)) == 3
    assert sequence_hashes(_tokens(48), 16)[:2] == full


def test_chain_from_continues_sequence_hashes() -> None:
    tokens = _tokens(100, start=1000)
    whole = sequence_hashes(tokens, 16)
    assert len(whole) == 6
    for cut in (1, 2, 5):
        head = sequence_hashes(tokens[: cut * 16], 16)
        assert head + chain_from(head[-1], tokens[cut * 16 :], 16) == whole
    assert chain_from(None, tokens, 16) == whole
    # a different parent changes every later hash
    assert chain_from(whole[0] ^ 1, tokens[16:], 16)[0] != whole[1]
