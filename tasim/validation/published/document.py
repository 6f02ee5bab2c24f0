"""The generated span of docs/results/validation.md for ``validate published --doc``: per measurement
file its sources, its systems, a table of every point (published, each earlier tasim, tasim now)
and its plots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tasim import __version__
from tasim.config.policy_spec import PolicySpec
from tasim.results.doc_section import replace_section
from tasim.validation.published.evaluate import PointResult
from tasim.validation.published.littles_law import between_steps_conflicts, closed_loop_conflicts
from tasim.validation.published.measurement_file import Measurements
from tasim.validation.published.present import BAND, describe, published_text, ratio_text, value_text
from tasim.validation.published.published_record import Record

BEGIN, END = "<!-- published:begin -->", "<!-- published:end -->"


def splice(document: Path, text: str) -> None:
    replace_section(document, BEGIN, END, text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _within(values: Sequence[float | None], results: Sequence[PointResult]) -> str:
    ratios = [v / r.point.published.value for v, r in zip(values, results) if v is not None]
    inside = sum(1 for ratio in ratios if abs(ratio - 1) <= BAND)
    return f"{inside} of {len(results)}"


def file_section(
    number: str, results: Sequence[PointResult], befores: Sequence[Record], systems: dict[str, PolicySpec], plots: Sequence[str]
) -> list[str]:
    m = results[0].measurements
    shown = [b for b in befores if b.has(m.name)]
    lines = [f"### {number} {m.title} (`{m.path.name}`)", ""]
    lines += [f"- `{key}`: {source.cite}" + (f" <{source.url}>" if source.url else "") for key, source in m.sources.items()]
    mapping = ", ".join(f"{name} = `{systems.get(name, spec).label}`" for name, spec in m.systems.items())
    lines += ["", f"Systems: {mapping}."]
    before_values = [[b.values.get((m.name, r.point.id)) for r in results] for b in shown]
    counts = [f"now {_within([r.tasim for r in results], results)}", *(f"{b.heading} {_within(v, results)}" for b, v in zip(shown, before_values))]
    lines += [f"Points within ±{BAND * 100:.0f} % of the published value: {'; '.join(counts)}.", ""]
    heads = ["point", "what", "source: where", "published", *(b.heading for b in shown), "now", "now/published"]
    lines += ["| " + " | ".join(heads) + " |", "| " + " | ".join(["---", "---", "---", "---:", *("---:" for _ in shown), "---:", "---:"]) + " |"]
    for i, result in enumerate(results):
        point = result.point
        before = [value_text(point, value) if (value := v[i]) is not None else "—" for v in before_values]
        now = value_text(point, result.tasim) if result.tasim is not None else f"— ({result.reason})"
        cells = [point.id, describe(m, point), f"{point.source}: {point.where}", published_text(point), *before, now, ratio_text(result.ratio)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += [""] + _conflicts(m)
    lines += [f"![{Path(link).stem}]({link})" for link in plots]
    return lines + [""]


def _conflicts(m: Measurements) -> list[str]:
    """The file's throughput and latency points that no closed loop meets together."""
    lines: list[str] = []
    conflicts = closed_loop_conflicts(m)
    if conflicts:
        lines += [
            "Published values no closed loop can produce together (Little's law: with N programs, steps/s × mean "
            "step ≤ N, whatever the engine or router; `tasim/validation/published/littles_law.py`). A simulation can meet "
            "at most one value of each pair; meeting the steps/min, its per-step latency is at most N / steps/s.",
            "",
            "| latency point | steps/min point | N | steps/s × step / N | longest step the steps/min allow |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {c.latency.id} ({published_text(c.latency)}) | {c.throughput.id} ({published_text(c.throughput)}) "
            f"| {c.concurrency:g} | {c.occupancy:.2f} | {c.latency_bound_s:.1f} s |"
            for c in conflicts
        ] + [""]
    between = between_steps_conflicts(m)
    if between:
        lines += [
            "Published values no single workload can produce together. Each pair gives a program's mean time "
            "between steps (a step being an LLM call and the tool call after it), N / steps/s − step: the "
            "environment set-up's share, the same for two systems running the same programs, plus any time a "
            "router holds a request back and its latency leaves out. So the system that holds nothing back cannot "
            "spend longer between steps than the one that does; a simulation can meet at most three of the four "
            "values.",
            "",
            "| no-hold system's points | between steps | holding system's points | between steps |",
            "| --- | ---: | --- | ---: |",
        ]
        lines += [
            f"| {c.unheld.latency.id} ({published_text(c.unheld.latency)}), {c.unheld.throughput.id} "
            f"({published_text(c.unheld.throughput)}) | {c.unheld.between_steps_s:.1f} s | {c.held.latency.id} "
            f"({published_text(c.held.latency)}), {c.held.throughput.id} ({published_text(c.held.throughput)}) "
            f"| {c.held.between_steps_s:.1f} s |"
            for c in between
        ] + [""]
    return lines


def markdown(
    files: Sequence[Sequence[PointResult]],
    befores: Sequence[Record],
    systems: dict[str, PolicySpec],
    plots: Sequence[Sequence[str]],
    command: str,
    runs: int,
) -> str:
    """The whole span: how it was made, then one section per file."""
    earlier = "; ".join(b.heading for b in befores)
    lines = [
        f"Generated by `{command}`; do not edit by hand. Every number of the sources is a point of a file in "
        "`measurements/` with its citation; ≈ marks values read off a plot, a range is held at its midpoint, "
        "and now/published is tasim now over the published value. A ratio (×) divides one system's run by "
        "another's. Each point runs the preset its file names with only the point's own overrides and its "
        f"system's policy; {runs} simulations, tasim {__version__}."
        + (f" Earlier tasim, from committed records of the same command: {earlier}." if befores else ""),
        "",
    ]
    for i, (results, links) in enumerate(zip(files, plots), 1):
        lines += file_section(f"4.{i}", results, befores, systems, links)
    return "\n".join(lines).rstrip("\n") + "\n"
