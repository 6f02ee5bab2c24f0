"""``python -m tasim validate published FILE...``: run what the files' points need, print a
table per file, write ``published.json`` and, with ``--doc``, the document's span and plots.
``--from-record`` takes tasim's values from an earlier record instead of simulating, to render
tables and document again at no simulation cost."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from rich.console import Console

from tasim.config.policy_spec import PolicySpec
from tasim.results.render import print_unsquashed
from tasim.results.run_folder import write_json
from tasim.validation.published.evaluate import PlannedRun, PointResult, evaluate, plan, run
from tasim.validation.published.measurement_file import MeasurementError, Measurements, load_measurements
from tasim.validation.published.published_record import PUBLISHED_FILE, Record, read_record, record_json
from tasim.validation.published.quantities import Outcome
from tasim.validation.published.table import file_table


@dataclass(frozen=True)
class Request:
    """What the user asked for, as parsed from the command line."""

    files: tuple[Path, ...]
    overrides: tuple[str, ...]
    systems: dict[str, PolicySpec]
    jobs: int | None
    out: Path
    doc: Path | None
    plots: Path
    before: tuple[Path, ...]
    label: str
    from_record: Path | None
    command: str


def parse_system(text: str) -> tuple[str, PolicySpec]:
    """``--system 'NAME=SPEC'``: the name as a measurement file writes it, then a policy spec."""
    name, sep, spec = text.partition("=")
    if not sep or not name.strip() or not spec.strip():
        raise MeasurementError(f"--system {text!r}: expected NAME=POLICY (e.g. 'ThunderAgent=thunderagent[variant=upstream]')")
    try:
        return name.strip(), PolicySpec.parse(spec)
    except ValueError as exc:
        raise MeasurementError(f"--system {text!r}: {exc}") from None


def validate_published(request: Request) -> None:
    measurements = [load_measurements(path) for path in request.files]
    befores = [read_record(path, "--before") for path in request.before]  # read first: a typo costs no run
    written: list[Path] = []
    if request.from_record is None:
        results, systems, runs = _simulate(request, measurements)
        written.append(request.out / PUBLISHED_FILE)
    else:
        results, systems, runs = _recorded(request, measurements)
    by_file = [list(group) for _, group in groupby(results, key=lambda r: r.measurements.path)]
    for file_results in by_file:
        print_unsquashed(file_table(file_results))
    if request.doc is not None:
        written += _document(request, by_file, befores, systems, runs)
    Console().print("wrote " + (", ".join(map(str, written)) or "nothing"), markup=False, highlight=False, soft_wrap=True)


def _simulate(request: Request, measurements: Sequence[Measurements]) -> tuple[list[PointResult], dict[str, PolicySpec], int]:
    planned = plan(measurements, request.overrides, request.systems)
    jobs = request.jobs or min(os.cpu_count() or 1, len(planned.runs))
    progress = Console(stderr=True)
    done = iter(range(1, len(planned.runs) + 1))

    def on_done(planned_run: PlannedRun, outcome: Outcome) -> None:
        wall = outcome.summary["wall_time_s"] or 0.0
        progress.print(f"[{next(done)}/{len(planned.runs)}] {planned_run.label} ({wall:.1f} s)", markup=False, highlight=False, soft_wrap=True)

    outcomes = run(planned, jobs, on_done)
    results = evaluate(planned, outcomes)
    request.out.mkdir(parents=True, exist_ok=True)
    write_json(request.out / PUBLISHED_FILE, record_json(request.label, planned, outcomes, results, request.overrides, request.systems))
    return results, request.systems, len(planned.runs)


def _recorded(request: Request, measurements: Sequence[Measurements]) -> tuple[list[PointResult], dict[str, PolicySpec], int]:
    """Every point's tasim value from the record, which must hold every point of the files."""
    assert request.from_record is not None
    if request.overrides or request.systems:
        raise MeasurementError("--from-record: its runs were made with the record's own --set and --system; give neither")
    recorded = read_record(request.from_record, "--from-record")
    results = []
    for m in measurements:
        for point in m.points:
            key = (m.name, point.id)
            if key not in recorded.values:
                raise MeasurementError(
                    f"--from-record {request.from_record}: no point {point.id} of {m.path} (run without --from-record to simulate it)"
                )
            results.append(PointResult(m, point, recorded.values[key], recorded.reasons[key]))
    return results, {name: PolicySpec.parse(spec) for name, spec in recorded.systems.items()}, recorded.runs


def _document(
    request: Request, by_file: Sequence[Sequence[PointResult]], befores: Sequence[Record], systems: dict[str, PolicySpec], runs: int
) -> list[Path]:
    from tasim.validation.published.document import markdown, splice
    from tasim.validation.published.figures import write_plots  # matplotlib only when a document is asked for

    assert request.doc is not None
    pngs = [write_plots(results, befores, request.plots) for results in by_file]
    base = request.doc.resolve().parent
    links = [[Path(os.path.relpath(png.resolve(), base)).as_posix() for png in file_pngs] for file_pngs in pngs]
    splice(request.doc, markdown(by_file, befores, systems, links, request.command, runs))
    return [request.doc, *(png for file_pngs in pngs for png in file_pngs)]


def command_line(argv: Sequence[str]) -> str:
    return "python -m tasim " + " ".join(shlex.quote(a) for a in argv)
