"""Reference hashes: the event logs of a reference set of simulations, each reduced to its
SHA-256, so that a change meant to leave the simulator's behaviour alone (a restructuring) can
show it did: every digest stays the same.

    python -m lab.reference_hashes [--update] [--jobs N] [--table FILE]

The reference set (`reference_runs`), each run under a key of the table:

- ``regression:<preset>:<policy>``: every policy-regression case (`lab.regression.CASES`),
  configured as `lab.regression.run_case` configures it;
- ``preset:<preset>@300s``: every preset cut to 300 simulated seconds, with its warm-up set to 0
  where it is as long (an RL rollout preset stops at 300 s too: no step count needs cutting);
- ``mooncake:<preset>``: every preset that replays a Mooncake trace, replayed in full;
- ``replay:<preset>:<configuration>:<router>``: tasim's side of `tasim validate dynamo` on a
  handful of the validation matrix's configurations (`lab.dynamo_matrix`): the scenario
  as `tasim.validation.tasim_replay.replay_scenario` configures it for each router, first seed.

Each run writes its event log as `tasim simulate` does (`tasim.sim.simulation.run_simulation`). The
table, ``lab/reference_hashes.json``, maps each key to the log's digest and line count. By
default the digests are checked against it (one line per difference, exit status 1 on any);
``--update`` rewrites it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from lab.dynamo_matrix import WORKLOADS, Config
from lab.regression import CASES
from tasim.config.presets import PRESET_DIR
from tasim.config.scenario import Scenario, load_scenario, with_engine_flavour
from tasim.results.eventlog import EVENTS_PLAIN
from tasim.sim.simulation import run_simulation
from tasim.tools.parallel import map_in_processes
from tasim.validation.dynamo_replay import ROUTERS
from tasim.validation.tasim_replay import replay_scenario
from tasim.validation.workload_trace import replay_trace

TABLE = Path(__file__).resolve().parent / "reference_hashes.json"

PRESET_DURATION_S = 300
# A handful of the matrix's configurations: each workload once, the agent workload (the one
# exported as a trace) at opposite corners, and small pools, in which requests evict each other
# (the Mooncake synthetic one also leaves 47 requests out of the trace as too large for a
# worker). The whole matrix's tasim side takes two minutes of one core; these about 14 s.
REPLAY_CONFIGS = (
    Config("multi-turn agents", 2, 16, 4096),
    Config("multi-turn agents", 8, 64, 32768),
    Config("Mooncake synthetic", 2, 16, 4096),
    Config("Mooncake conversation", 8, 64, 4096),
)


class Digest(TypedDict):
    sha256: str
    events: int


@dataclass(frozen=True, slots=True)
class ReferenceRun:
    key: str
    preset: str  # file name in scenarios/
    overrides: tuple[str, ...] = ()
    router: str | None = None  # set: tasim's side of `validate dynamo`'s replay under this router


def reference_runs() -> list[ReferenceRun]:
    runs = [ReferenceRun(f"regression:{case.key}", case.scenario, case.run_overrides) for case in CASES]
    for path in sorted(PRESET_DIR.glob("*.yaml")):
        scenario = load_scenario(path)
        overrides = [f"duration_s={PRESET_DURATION_S}"]
        if scenario.metrics.warmup_s >= PRESET_DURATION_S:  # else the scenario is refused
            overrides.append("metrics.warmup_s=0")
        runs.append(ReferenceRun(f"preset:{path.name}@{PRESET_DURATION_S}s", path.name, tuple(overrides)))
        if scenario.workload.kind == "mooncake_trace":
            runs.append(ReferenceRun(f"mooncake:{path.name}", path.name))
    for config in REPLAY_CONFIGS:
        preset = WORKLOADS[config.workload]
        label = f"workers{config.workers}-block{config.block_size}-pool{config.blocks}"
        runs += [ReferenceRun(f"replay:{preset}:{label}:{router}", preset, tuple(config.overrides()), router) for router in ROUTERS]
    return runs


def _scenario(run: ReferenceRun, scratch: Path) -> Scenario:
    scenario = load_scenario(PRESET_DIR / run.preset, run.overrides)
    if run.router is None:
        return scenario
    # as `tasim.validation.against_dynamo.validate` runs tasim's side (first seed)
    scenario = with_engine_flavour(scenario, "mocker")
    return replay_scenario(scenario, replay_trace(scenario, scratch), run.router)


def digest(run: ReferenceRun) -> Digest:
    """Simulate ``run`` into a scratch folder and digest its event log."""
    with tempfile.TemporaryDirectory(prefix="tasim-reference-") as scratch:
        folder = Path(scratch)
        run_simulation(_scenario(run, folder / "trace"), folder / "run")
        sha, lines = hashlib.sha256(), 0
        with open(folder / "run" / EVENTS_PLAIN, "rb") as log:
            for chunk in iter(lambda: log.read(1 << 20), b""):
                sha.update(chunk)
                lines += chunk.count(b"\n")
    return {"sha256": sha.hexdigest(), "events": lines}


def load_table(path: Path = TABLE) -> dict[str, Digest]:
    try:
        table: dict[str, Digest] = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return table


def differences(now: dict[str, Digest], recorded: dict[str, Digest]) -> list[str]:
    """One line per key whose digest changed, that the table lacks, or that only the table has."""
    lines = []
    for key in sorted(now.keys() | recorded.keys()):
        if key not in recorded:
            lines.append(f"{key}: missing from the table (now {now[key]['sha256'][:12]}, {now[key]['events']} events)")
        elif key not in now:
            lines.append(f"{key}: in the table but not in the reference set")
        elif now[key] != recorded[key]:
            before, after = recorded[key], now[key]
            lines.append(
                f"{key}: recorded {before['sha256'][:12]} ({before['events']} events), now {after['sha256'][:12]} ({after['events']} events)"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.reference_hashes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="rewrite the table with the digests of this run")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulations in parallel (default: CPUs)")
    parser.add_argument("--table", type=Path, default=TABLE, help=f"the table of digests (default {TABLE})")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        print(f"error: --jobs must be at least 1 (got {args.jobs})", file=sys.stderr)
        return 2
    runs = reference_runs()
    now = dict(zip((run.key for run in runs), map_in_processes(digest, runs, min(args.jobs, len(runs)))))
    if args.update:
        args.table.write_text(json.dumps(dict(sorted(now.items())), indent=1) + "\n")
        print(f"recorded {len(now)} digests in {args.table}")
        return 0
    found = differences(now, load_table(args.table))
    for line in found:
        print(line)
    print(f"{len(now)} runs, {len(found)} difference(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
