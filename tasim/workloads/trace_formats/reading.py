"""Pieces both trace readers share: line-numbered JSONL reading, field checks whose failures
name ``path:line``, and the remapping of a trace's block ids onto engine-block hashes.

Hash scheme. A trace gives one id per trace block (``trace_block_size`` tokens; the last one
may be partial), and equal ids at equal positions mean the whole prefix up to the end of that
block is identical. Engine block ``j`` covers tokens ``[j*bs, (j+1)*bs)``; its hash is

    TRACE_HASH_NAMESPACE + j * 2**30 + id

where ``id`` is the trace id of the trace block holding the engine block's last token. That
trace block ends at or after the engine block, so equal ids (hence equal hashes) still imply an
identical prefix, and keeping ``j`` in the hash makes the blocks inside one trace block
distinct. Bit 62 (``TRACE_HASH_NAMESPACE``) is set so trace hashes never equal the workload
generator's ``index * 2**34 + owner`` (below 2**62 for fewer than 2**28 blocks). The encoding is collision-free
while ``id < 2**30`` and ``j < 2**32``; readers make sure ids are in range. The id sits in the
low bits on purpose: Python hashes an int by its value and sets and dicts pick slots from the
low bits, so putting the block index there (few distinct values) made every set of trace
hashes probe long collision chains, about twice as slow as random ints at block size 16.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tasim.core.model import MAX_TRACE_TOKENS

TRACE_HASH_NAMESPACE = 1 << 62
MAX_TRACE_ID = 1 << 30  # exclusive: larger ids would overlap the block index bits
_INDEX_STRIDE = MAX_TRACE_ID
_INT_ONLY = frozenset({int})

Record = dict[str, Any]


class TraceError(ValueError):
    """A trace file that cannot be read: one line, ``path:line: problem (expected ...)``."""


def shown(value: Any, limit: int = 60) -> str:
    """A field value as JSON, shortened, for error messages."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def ms(value: float) -> str:
    """A time in ms for error messages, without a spurious ``.0``."""
    return str(int(value)) if value.is_integer() else str(value)


def read_json_lines(path: str | os.PathLike[str]) -> Iterator[tuple[str, Record]]:
    """Yield ``("path:line", object)`` for every non-blank line of a UTF-8 JSONL file."""
    name = os.fspath(path)
    try:
        handle = open(name, "rb")  # noqa: SIM115 (opened apart so only opening errors map here); decoded line by line, so bad bytes are reported at their line
    except FileNotFoundError:
        raise TraceError(f"{name}: file not found") from None
    except IsADirectoryError:
        raise TraceError(f"{name}: is a directory (expected a JSONL file)") from None
    except OSError as error:
        raise TraceError(f"{name}: cannot read ({error.strerror or error.__class__.__name__})") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{name}:{number}"
            try:
                line = raw.decode("utf-8").rstrip("\r\n")  # a cut line: the error at its end, not at column 1
            except UnicodeDecodeError as error:
                raise TraceError(f"{where}: invalid UTF-8 at byte {error.start + 1}; expected one JSON object per line") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise TraceError(f"{where}: invalid JSON ({error.msg} at column {error.colno}); expected one JSON object per line") from None
            except RecursionError:
                raise TraceError(f"{where}: invalid JSON (nested too deeply); expected one JSON object per line") from None
            except ValueError:  # Python refuses to convert an integer of more than 4300 digits
                raise TraceError(f"{where}: invalid JSON (a number with too many digits); expected one JSON object per line") from None
            if not isinstance(record, dict):
                raise TraceError(f"{where}: expected a JSON object (got {shown(record)})")
            yield where, record


def _field(record: Record, key: str, where: str, expected: str) -> Any:
    if key not in record:
        raise TraceError(f"{where}: missing field {key} (expected {expected})")
    return record[key]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tokens(value: int, key: str, where: str) -> int:
    if value > MAX_TRACE_TOKENS:
        raise TraceError(f"{where}: {key} must be at most {MAX_TRACE_TOKENS} tokens (got {shown(value)})")
    return value


def count_field(record: Record, key: str, where: str) -> int:
    """A token count, at most ``MAX_TRACE_TOKENS``."""
    value = _field(record, key, where, "a non-negative integer")
    if not _is_int(value) or value < 0:
        raise TraceError(f"{where}: {key} must be a non-negative integer (got {shown(value)})")
    return _tokens(value, key, where)


def positive_field(record: Record, key: str, where: str) -> int:
    """A positive token count (a block size), at most ``MAX_TRACE_TOKENS``."""
    value = _field(record, key, where, "a positive integer")
    if not _is_int(value) or value <= 0:
        raise TraceError(f"{where}: {key} must be a positive integer (got {shown(value)})")
    return _tokens(value, key, where)


def time_field(record: Record, key: str, where: str) -> float:
    """A timestamp or duration: a finite, non-negative number."""
    value = _field(record, key, where, "a non-negative number")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: {key} must be a non-negative number (got {shown(value)})")
    return float(value)


def string_field(record: Record, key: str, where: str) -> str:
    value = _field(record, key, where, "a non-empty string")
    if not isinstance(value, str) or not value:
        raise TraceError(f"{where}: {key} must be a non-empty string (got {shown(value)})")
    return value


def object_field(record: Record, key: str, where: str) -> Record:
    value = _field(record, key, where, "a JSON object")
    if not isinstance(value, dict):
        raise TraceError(f"{where}: {key} must be a JSON object (got {shown(value)})")
    return value


def id_list_field(record: Record, key: str, where: str, upper: int) -> list[int]:
    """A list of integer ids in ``[0, upper)``; ``upper`` is given as a power of two."""
    value = _field(record, key, where, "a list of integers")
    expected = f"a list of integers in [0, 2**{upper.bit_length() - 1})"
    if not isinstance(value, list):
        raise TraceError(f"{where}: {key} must be {expected} (got {shown(value)})")
    # Checked in bulk, in C (a trace has hundreds of thousands of ids); only a bad list is
    # searched for the element to report. Exact types also reject JSON booleans.
    if not _INT_ONLY.issuperset(map(type, value)) or (value and not 0 <= min(value) <= max(value) < upper):
        bad = next(item for item in value if type(item) is not int or not 0 <= item < upper)
        raise TraceError(f"{where}: {key} must be {expected} (got element {shown(bad)})")
    return value


def check_hash_count(ids: Sequence[int], tokens: int, trace_block_size: int, key: str, where: str) -> None:
    """Traces give one id per trace block, the partial tail included."""
    expected = -(-tokens // trace_block_size)
    if len(ids) != expected:
        raise TraceError(f"{where}: {key} has {len(ids)} ids, expected {expected} (one per {trace_block_size}-token block of {tokens} input tokens)")


def engine_block_hashes(trace_ids: Sequence[int], prompt_tokens: int, block_size: int, trace_block_size: int) -> tuple[int, ...]:
    """Hashes of the prompt's full engine blocks (scheme in the module docstring)."""
    full = prompt_tokens // block_size
    if block_size >= trace_block_size:
        per_block = block_size // trace_block_size
        return tuple(TRACE_HASH_NAMESPACE + j * _INDEX_STRIDE + trace_ids[(j + 1) * per_block - 1] for j in range(full))
    # Several engine blocks per trace block: build them in numpy (a 12k-request trace has
    # millions of blocks at block size 16). Unsigned, as the hashes reach 2**63.
    ids = np.repeat(np.array(trace_ids, dtype=np.uint64), trace_block_size // block_size)[:full]
    ids += np.arange(TRACE_HASH_NAMESPACE, TRACE_HASH_NAMESPACE + full * _INDEX_STRIDE, _INDEX_STRIDE, dtype=np.uint64)
    return tuple(ids.tolist())
