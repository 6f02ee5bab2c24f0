"""The preset scenarios shipped in ``scenarios/``: `python -m tasim scenarios` lists them, and a
command that takes a scenario file also takes a preset's name (`scenario_path`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasim.config.scenario import ScenarioError, load_scenario


def _preset_dir() -> Path:
    """Where the presets are: an installed wheel carries them as package data, ``tasim/scenarios``
    (pyproject.toml maps the data package ``tasim.scenarios`` to the repository's ``scenarios/``);
    a checkout, and so the editable install, which imports the checkout's tasim, has them at its root.

    Not `importlib.resources`: ``scenarios/`` has no ``__init__.py``, so in the editable install
    ``tasim.scenarios`` is not importable (setuptools' finder maps it but only finds regular
    packages), and in a wheel it is a namespace package, whose `files()` is no `Path`."""
    package = Path(__file__).resolve().parents[1]  # tasim/
    shipped = package / "scenarios"
    checkout = package.parent / "scenarios"
    return checkout if not shipped.is_dir() and checkout.is_dir() else shipped


PRESET_DIR = _preset_dir()


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


def scenario_path(argument: str | Path, directory: Path = PRESET_DIR) -> Path:
    """A command's scenario argument as a file: an existing path as given (it always wins), else
    the preset it names, ``swe-agent`` or ``swe-agent.yaml``; neither raises `ScenarioError`."""
    path = Path(argument)
    text = str(argument)
    try:
        if path.exists():
            return path
        if path.name == text:  # a bare name, no folder: maybe a preset
            preset = directory / (text if path.suffix == ".yaml" else f"{text}.yaml")
            if preset.is_file():
                return preset
    except OSError:  # a name the file system refuses (too long, say): load_scenario says so
        return path
    shown = text if text.isprintable() else repr(text)
    shown = shown if len(shown) <= 300 else shown[:297] + "..."
    raise ScenarioError(f"{shown}: file not found, nor a preset name (`python -m tasim scenarios` lists the presets)")
