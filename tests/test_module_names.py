"""No two modules of the package or of lab/ share a name, so that a name found in a traceback, a
profile or a grep says which module it is (and its test, tests/<layer>/test_<name>.py, is found
by it). Command modules of tasim/cli are named after their commands; the code they run has a
name of its own (`compare` runs tasim/tools/comparison.py)."""

from __future__ import annotations

from collections import defaultdict

from conftest import REPO


def test_module_names_are_unique() -> None:
    places: dict[str, list[str]] = defaultdict(list)
    for root in ("tasim", "lab"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path.name not in {"__init__.py", "__main__.py"} and "build" not in path.parts:
                places[path.stem].append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in places.items() if len(paths) > 1} == {}
