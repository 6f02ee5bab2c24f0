"""The preset scenarios shipped in ``scenarios/``: `python -m tasim scenarios` lists them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasim.scenario import ScenarioError, load_scenario

PRESET_DIR = Path(__file__).resolve().parent.parent / "scenarios"


@dataclass(frozen=True, slots=True)
class Preset:
    path: Path
    name: str
    kind: str
    description: str


def presets(directory: Path = PRESET_DIR) -> list[Preset | ScenarioError]:
    """Every ``*.yaml`` in ``directory``, loaded and validated (a broken one is its error)."""
    found: list[Preset | ScenarioError] = []
    for path in sorted(directory.glob("*.yaml")):
        try:
            scenario = load_scenario(path)
        except ScenarioError as exc:
            found.append(exc)
            continue
        found.append(Preset(path, scenario.name, scenario.workload.kind, scenario.description))
    return found
