"""The RL trainers side by side, from a `tasim compare` swept over ``workload.mode``.

``python -m lab.trainer_modes runs/compare-rl-async`` reads the folder's compare.json and prints,
per mode and policy, means over the paired seeds with their 95 % Student-t half-widths: full-step
throughput (the output of the groups trained on per second of the run) and its ratio to the same
policy's sync mode, paired by seed ("n.s." where the interval holds 1); the trainer's idle share;
the worst staleness of what it trained on; GRPO group completion p99; and per step, the output
tokens weight syncs cut short and the prompt tokens their retries computed again.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasim.results.stats import Interval, mean_interval, paired_ratio

Metric = Callable[[dict[str, Any]], float]

COLUMNS: tuple[tuple[str, Metric, str], ...] = (
    ("step tok/s", lambda r: r["step_tokens_per_s"], ",.0f"),
    ("trainer idle", lambda r: r["trainer_idle_share"], ".2f"),
    ("staleness", lambda r: r["staleness_worst"]["mean"], ".2f"),
    ("group p99 s", lambda r: r["group_completion_s"]["p99"], ",.0f"),
    ("cut tok/step", lambda r: r["interrupted_output_tokens"] / r["steps"], ",.0f"),
    ("recomputed/step", lambda r: r["recomputed_prompt_tokens"] / r["steps"], ",.0f"),
)


def _cell(interval: Interval, form: str) -> str:
    if interval.no_interval:
        return format(interval.mean, form)
    return f"{format(interval.mean, form)} ±{format(interval.half_width, form)}"


def _ratio(interval: Interval | None) -> str:
    if interval is None:
        return "-"
    if interval.no_interval:
        return f"{interval.mean:.3f}×"
    verdict = " n.s." if interval.contains(1.0) else ""
    return f"{interval.mean:.3f}× [{interval.low:.3f}, {interval.high:.3f}]{verdict}"


def table(compare: dict[str, Any]) -> list[list[str]]:
    """One row per (mode, policy) in the order the comparison ran them."""
    by_cell: dict[tuple[str, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    for run in compare["runs"]:
        mode = run["overrides"].get("workload.mode", "sync")
        rollout = run["summary"]["rollout"]
        if rollout is not None and rollout["steps"]:  # a run cut short before a step ended has none
            by_cell[(mode, run["spec"])][run["summary"]["seed"]] = rollout
    rows = [["mode", "policy", *(name for name, _, _ in COLUMNS), "step tok/s vs sync"]]
    for (mode, spec), runs in by_cell.items():
        seeds = sorted(runs)
        row = [mode, spec]
        for _, metric, form in COLUMNS:
            row.append(_cell(mean_interval([metric(runs[s]) for s in seeds]), form))
        sync = by_cell.get(("sync", spec))
        if mode == "sync" or sync is None or sorted(sync) != seeds:  # no pairs to take a ratio of
            row.append("-")
        else:
            row.append(_ratio(paired_ratio([runs[s]["step_tokens_per_s"] for s in seeds], [sync[s]["step_tokens_per_s"] for s in seeds])))
        rows.append(row)
    return rows


def render(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.trainer_modes", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a tasim compare output folder swept over workload.mode")
    args = parser.parse_args(argv)
    path = args.folder / "compare.json"
    try:
        compare = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        print(f"error: {path}: {error}", file=sys.stderr)
        return 2
    if not any((run["summary"].get("rollout") or {}).get("steps") for run in compare.get("runs", [])):
        print(f"error: {path}: no rl_rollout run in it completed a step", file=sys.stderr)
        return 2
    print(render(table(compare)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
