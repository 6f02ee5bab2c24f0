"""The compiled simulator core (tasim/native): used only while it matches the sources, and
byte for byte the plain modules' results."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from tasim import native


@pytest.fixture
def manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A manifest in a scratch folder, as a build of the current sources for this Python wrote it."""
    monkeypatch.setattr(native, "BUILD", tmp_path)
    monkeypatch.setattr(native, "MANIFEST", tmp_path / "manifest.json")
    monkeypatch.delenv(native.DISABLE, raising=False)
    record = {"built": True, "python": native._python(), "sources": native._sources()}
    native.MANIFEST.write_text(json.dumps(record))
    return native.MANIFEST


def _rewrite(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_build_of_the_current_sources_goes_first_on_the_search_path(manifest: Path) -> None:
    assert native.state() == (
        "compiled modules (hosting/policy_host.py, sim/runner.py, sim/clock.py, sim/engine/scheduler.py, sim/engine/kv_manager.py, "
        "sim/engine/host_tier.py, sim/engine/keyed_host_pool.py, sim/engine/hicache.py, sim/engine/mocker_host_tier.py, "
        "sim/engine/block_pool.py, sim/engine/fast_forward.py, "
        "sim/perf/perf_model.py, sim/perf/fixed.py, sim/perf/polynomial.py, sim/perf/roofline.py, "
        "policies/prefix_index.py, policies/booked_blocks.py, policies/worker_cost.py) "
        f"from {manifest.parent}"
    )
    assert native.search_path("tasim.sim", ["/src/tasim/sim"]) == [str(manifest.parent / "tasim" / "sim"), "/src/tasim/sim"]
    assert native.search_path("tasim", ["/src/tasim"]) == [str(manifest.parent / "tasim"), "/src/tasim"]


def test_an_edited_source_means_the_plain_modules(manifest: Path) -> None:
    sources = native._sources()
    sources["sim/engine.py"] = hashlib.sha256(b"an older engine").hexdigest()
    _rewrite(manifest, sources=sources)
    assert native.state() == "plain modules (the sources changed since the native build: `python -m tasim.native` rebuilds it)"
    assert native.search_path("tasim.sim", ["/src/tasim/sim"]) == ["/src/tasim/sim"]


def test_a_build_for_another_python_a_failed_build_or_none_means_the_plain_modules(manifest: Path) -> None:
    _rewrite(manifest, python="cpython-312 .cpython-312-x86_64-linux-gnu.so")
    assert native.state() == f"plain modules (the native build is for cpython-312 .cpython-312-x86_64-linux-gnu.so, this is {native._python()})"
    _rewrite(manifest, built=False, reason="no C compiler (gcc)")
    assert native.state() == "plain modules (the native build failed: no C compiler (gcc))"
    manifest.write_text("{not json")
    assert native.state() == "plain modules (no native build: `python -m tasim.native` makes one)"
    manifest.unlink()
    assert native.state() == "plain modules (no native build: `python -m tasim.native` makes one)"
    assert not native.in_use()


def test_tasim_native_0_means_the_plain_modules(manifest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.DISABLE, "0")
    assert native.state() == "plain modules (TASIM_NATIVE=0)"
    assert native.search_path("tasim.sim", ["/src/tasim/sim"]) == ["/src/tasim/sim"]


_RUN = """
import hashlib, sys, tempfile
from pathlib import Path
from tasim.policies import prefix_index
from tasim.sim.engine import block_pool, fast_forward, scheduler
from tasim.sim.perf import roofline
from tasim.sim.simulation import run_simulation
from tasim.config.scenario import load_scenario
for module in (scheduler, block_pool, fast_forward, roofline, prefix_index):
    print(Path(module.__file__).suffix)
for case in sys.argv[1:]:
    name, *overrides = case.split()
    with tempfile.TemporaryDirectory() as out:
        run_simulation(load_scenario(Path("scenarios") / name, overrides), Path(out))
        print(name, hashlib.sha256((Path(out) / "events.jsonl").read_bytes()).hexdigest())
"""

# KV pressure and pauses; vLLM's engine thrashing past the cliff (folded decode-plus-prefill
# runs, recomputed blocks cached as duplicates); the mocker's lineage eviction (private
# duplicates) under round robin; an RL rollout; SGLang's host tier under KV pressure.
CASES = [
    "live-mocker.yaml",
    "swe-agent.yaml duration_s=300 metrics.warmup_s=0 workload.concurrency=96",
    "swe-agent.yaml duration_s=300 metrics.warmup_s=0 workload.concurrency=48 policy.name=round_robin policy.params={} "
    "cluster.engine.flavour=mocker cluster.engine.eviction=lineage",
    "rl-live-mocker.yaml",
    "swe-agent.yaml duration_s=120 metrics.warmup_s=0 cluster.engine.kv_blocks=6000 cluster.engine.host_tier.semantics=sglang "
    "cluster.engine.host_tier.ratio=2",
]


def _run(disable: bool) -> list[str]:
    env = {**os.environ, native.DISABLE: "0"} if disable else {k: v for k, v in os.environ.items() if k != native.DISABLE}
    done = subprocess.run([sys.executable, "-c", _RUN, *CASES], capture_output=True, text=True, cwd=REPO, env=env, check=True)
    return done.stdout.splitlines()


@pytest.mark.slow
def test_compiled_and_plain_modules_write_the_same_event_logs() -> None:
    if not native.in_use():
        pytest.skip(native.state())
    compiled, plain = _run(disable=False), _run(disable=True)
    assert compiled[:5] == [".so"] * 5 and plain[:5] == [".py"] * 5
    assert compiled[5:] == plain[5:] and len(plain) == 5 + len(CASES)
