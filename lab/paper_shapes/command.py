"""Run the paper-shape suite and rewrite its span of the document and its plots."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path

from lab.paper_shapes.curves import write_plots
from lab.paper_shapes.execution import run_all
from lab.paper_shapes.markdown import markdown
from lab.paper_shapes.plan import Mode, plan
from lab.paper_shapes.splice import splice

DEFAULT_DOC = Path("docs/results/validation.md")
DEFAULT_PLOTS = Path("docs/results/paper-shapes")
DEFAULT_OUT = Path("runs/paper-shapes")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m lab.paper_shapes",
        description="The paper-shape suite of docs/results/validation.md: tasim against the curves and tables the ThunderAgent paper publishes.",
    )
    parser.add_argument("--quick", action="store_true", help="60 s runs, two points per sweep, tiny RL (for tests)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel simulation processes")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="run directories go here")
    parser.add_argument("--doc", type=Path, default=DEFAULT_DOC, help="the document whose marked span is replaced")
    parser.add_argument("--plots", type=Path, default=DEFAULT_PLOTS, help="PNG directory (linked from the document)")
    parser.add_argument("--reuse", action="store_true", help="take runs already in --out that ran the very same scenario instead of rerunning them")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    mode = Mode(args.quick)
    jobs = plan(mode, args.out)
    started = time.perf_counter()
    results = run_all(jobs, args.jobs, args.reuse)
    wall = time.perf_counter() - started
    write_plots(results, jobs, mode, args.plots)
    link = Path(os.path.relpath(args.plots.resolve(), args.doc.resolve().parent)).as_posix()
    splice(args.doc, markdown(results, jobs, mode, link, wall, min(args.jobs, len(jobs)), args.reuse))
