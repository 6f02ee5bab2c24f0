"""The wheel carries the presets: built from the repository and installed into a folder, tasim run
from elsewhere lists every preset of scenarios/ and simulates one by its name, traces included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tasim.results.eventlog import EVENTS_PLAIN
from tasim.results.run_folder import RUN_FILE, SUMMARY_FILE

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _not_in_a_clean_clone(folder: str, names: list[str]) -> set[str]:
    """Build outputs, caches and the venv: a stale build/lib would go into the wheel."""
    top = Path(folder) == REPO
    return {n for n in names if n == "__pycache__" or n.endswith(".egg-info") or (top and (n.startswith(".") or n in ("build", "dist", "runs")))}


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert result.returncode == 0, f"{' '.join(map(str, args))}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel, built from a copy of the repository's sources (building in place would write
    build/ and tasim.egg-info into the checkout, and pack whatever stale files build/lib holds),
    and the folder it is installed into, with pip install --target."""
    import shutil

    root = tmp_path_factory.mktemp("wheel")
    source, wheels, target = root / "source", root / "wheels", root / "target"
    shutil.copytree(REPO, source, ignore=_not_in_a_clean_clone)
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input")
    _run(*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels, source, cwd=root)
    (wheel,) = wheels.glob("tasim-*.whl")
    _run(*pip, "install", "--no-deps", "--no-index", "--target", target, wheel, cwd=root)
    return wheel, target


def _python(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """This interpreter without site (-S): no .pth runs, so the editable install's finder, which
    would import the checkout's tasim, is never installed; tasim comes from ``target`` and its
    dependencies from this venv's site-packages, named after it."""
    paths = dict.fromkeys([str(target), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"PYTHONPATH": os.pathsep.join(paths)}
    return _run(sys.executable, "-S", *args, cwd=cwd, env=env)


def test_wheel_holds_every_module_and_the_presets(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "tasim").rglob("*.py")}
    missing = sorted(modules - names)
    assert not missing, f"not in the wheel (a package missing from pyproject.toml's [tool.setuptools] packages?): {missing}"
    scenarios = REPO / "scenarios"
    data = [*scenarios.glob("*.yaml"), *scenarios.glob("traces/*.jsonl"), scenarios / "traces" / "README.md"]
    assert {f"tasim/scenarios/{p.relative_to(scenarios).as_posix()}" for p in data} <= names
    hardware = sorted((REPO / "tasim" / "config" / "hardware_data").glob("*.yaml"))
    assert hardware and {f"tasim/config/hardware_data/{p.name}" for p in hardware} <= names


def test_installed_wheel_lists_and_runs_the_presets(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, target = installed
    where = _python(target, tmp_path, "-c", "import tasim, tasim.config.presets as p; print(tasim.__file__); print(p.PRESET_DIR)").stdout.split()
    assert [Path(w).is_relative_to(target) for w in where] == [True, True], where  # not the checkout's

    listed = _python(target, tmp_path, "-m", "tasim", "scenarios").stdout
    assert "INVALID" not in listed
    assert sorted(line.split()[0] for line in listed.strip().splitlines()) == sorted(p.name for p in (REPO / "scenarios").glob("*.yaml"))

    out = tmp_path / "out"  # a preset by its name, reading its trace from the installed package
    _python(target, tmp_path, "-m", "tasim", "simulate", "mooncake-synthetic.yaml", "--set", "workload.max_requests=60", "--out", str(out), "--quiet")
    assert (out / EVENTS_PLAIN).stat().st_size > 0
    assert json.loads((out / SUMMARY_FILE).read_text())["requests_completed"] > 0
    trace = Path(json.loads((out / RUN_FILE).read_text())["scenario"]["workload"]["path"])
    assert trace.is_relative_to(target / "tasim" / "scenarios" / "traces"), trace
