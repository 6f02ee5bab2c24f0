"""`tasim.core.records.record`: immutable to the type checker, a plain slotted dataclass at run time
with a frozen dataclass's equality and hash."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import REPO
from mypy import api as mypy_api

from tasim.core.events import FirstToken
from tasim.core.model import RequestSpec
from tasim.core.records import record


@record
class Point:
    x: int
    label: str = "p"


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenPoint:
    x: int
    label: str = "p"


def test_builds_and_compares_as_a_frozen_dataclass_would() -> None:
    assert Point(1) == Point(1, "p") != Point(2)
    assert hash(Point(1)) == hash(Point(1, "p")) == hash(FrozenPoint(1))  # field-wise, as a frozen one
    assert [f.name for f in dataclasses.fields(Point)] == ["x", "label"]
    assert dataclasses.replace(Point(1), label="q") == Point(1, "q")
    assert not hasattr(Point(1), "__dict__")  # slotted
    assert {Point(1), Point(1)} == {Point(1)}


def test_the_type_checker_refuses_writes(tmp_path: Path) -> None:
    """A write to a field of a record, here or in the classes the simulator's hot path declares
    with it, is a type error (`make lint` runs mypy on every module)."""
    snippet = tmp_path / "writes.py"
    snippet.write_text(
        "from tasim.core.events import FirstToken\n"
        "from tasim.core.model import RequestSpec\n"
        "from tasim.workloads.trace_formats.mooncake import TraceRequest\n"
        "def f(e: FirstToken, r: RequestSpec, t: TraceRequest) -> None:\n"
        "    e.t = 1.0\n"
        "    r.turn = 2\n"
        "    t.prompt_tokens = 3\n"
    )
    modules = ["tasim/core/records.py", "tasim/core/events.py", "tasim/core/model.py", "tasim/workloads/trace_formats/mooncake.py"]
    out, _, status = mypy_api.run(
        [str(snippet), *(str(REPO / m) for m in modules), "--follow-imports=skip", "--no-incremental", "--cache-dir=/dev/null", "--config-file="]
    )
    errors = [line.split(": error: ")[1] for line in out.splitlines() if ": error: " in line]
    assert status == 1
    assert errors == [
        'Property "t" defined in "FirstToken" is read-only  [misc]',
        'Property "turn" defined in "RequestSpec" is read-only  [misc]',
        'Property "prompt_tokens" defined in "TraceRequest" is read-only  [misc]',
    ]


@pytest.mark.parametrize("value", [FirstToken(1.0, "r"), RequestSpec("r", "p", 0, 1, 1, 0, (1, 2))])
def test_hot_path_classes_are_records(value: object) -> None:
    assert not hasattr(value, "__dict__")
    assert hash(value) == hash(dataclasses.replace(value))
