"""Writing and reading event logs (JSON lines, plain or deterministic gzip)."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable, Iterator
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]  # CPython internal, checked below
from pathlib import Path
from typing import IO, Any

from tasim.core.events import Event, from_record, to_record

EVENTS_PLAIN = "events.jsonl"
EVENTS_GZIP = "events.jsonl.gz"


class EventLogError(ValueError):
    """A log that cannot be read; the message names the file and line."""


class EventWriter:
    """Appends events to ``path``; gzip output has mtime 0 and no file name, so identical
    runs give identical bytes."""

    def __init__(self, path: Path, compress: bool = False) -> None:
        self.path = path
        file = open(path, "wb")  # noqa: SIM115 (the writer holds it open until close())
        # gzip does not close the file it writes into, so a compressed log closes both
        self._outer: IO[bytes] | None = file if compress else None
        raw: gzip.GzipFile | io.BufferedWriter = gzip.GzipFile(filename="", mode="wb", fileobj=file, mtime=0) if compress else file
        self._out = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
        self._dumps = _record_encoder()

    def write(self, event: Event) -> None:
        self._out.write(self._dumps(to_record(event)) + "\n")

    def flush(self) -> None:
        self._out.flush()

    def close(self) -> None:
        self._out.close()
        if self._outer is not None:
            self._outer.close()


def _record_encoder() -> Callable[[dict[str, Any]], str]:
    """Compact ASCII JSON without NaN, as ``json.JSONEncoder(separators=(",", ":"),
    allow_nan=False).encode`` writes it. That method builds its C encoder anew for every call,
    which was a third of the log's cost on runs of 70,000 events; this one is built once.
    Records are flat, so there is no circular check to keep."""
    reference = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    if c_make_encoder is None:  # a Python without json's C accelerator
        return reference.encode
    encode = c_make_encoder(None, reference.default, encode_basestring_ascii, None, ":", ",", False, False, False)
    return lambda record: "".join(encode(record, 0))


def find_events(directory: Path) -> Path:
    for name in (EVENTS_PLAIN, EVENTS_GZIP):
        candidate = directory / name
        if candidate.exists():
            return candidate
    raise EventLogError(f"{directory}: no {EVENTS_PLAIN} or {EVENTS_GZIP} found")


def read_events(path: Path) -> Iterator[Event]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    yield from_record(json.loads(line))
                except (ValueError, TypeError) as exc:
                    raise EventLogError(f"{path}:{number}: {exc}") from None
    except (OSError, EOFError) as exc:
        raise EventLogError(f"{path}: cannot read ({exc})") from None
