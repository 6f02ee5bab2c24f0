"""The paper-shape suite of docs/validation.md: tasim against the curves and tables the
ThunderAgent paper publishes (arXiv 2602.13692 §6, as transcribed in
``shared/reference/thunderagent.md`` §6.2-6.4).

    python -m tasim.validation.paper_shapes [--quick] [--jobs N] [--out DIR]
                                            [--doc docs/validation.md] [--plots docs/paper-shapes] [--reuse]

Three experiments, each run with the shipped presets and only the concurrency (and, with
``--quick``, the length) overridden:

1. KV thrashing of plain vLLM (``round_robin``, ``swe-agent.yaml``, one backend) at 24-96
   workflows: prefix hit rate and per-step latency (paper Fig. 1b).
2. Throughput against concurrency for vLLM, Continuum and ThunderAgent on the SWE-agent,
   OpenHands and ToolOrchestra presets (paper Fig. 4 and its SWE-agent trend), with the per-policy
   hit rates and latencies of §6.4.
3. RL rollout steps/min on two nodes, N = 144 (paper Table 2).

The generated markdown replaces only the span between the ``paper-shapes`` markers of the
document, and the plots go to ``docs/paper-shapes/``. Every number in the text is measured by
the run that writes it; direction checks (trends, orderings, ratios on either side of 1) mark
where tasim misses the paper, with the measured quantities that point at the likely cause.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tasim import __version__
from tasim import events as ev
from tasim.compare import Run, Sweep, plan_runs
from tasim.eventlog import find_events, read_events
from tasim.presets import PRESET_DIR
from tasim.rundir import RUN_FILE, SUMMARY_FILE, run_simulation
from tasim.scenario import RolloutWorkload, Scenario

BEGIN, END = "<!-- paper-shapes:begin -->", "<!-- paper-shapes:end -->"
DEFAULT_DOC = Path("docs/validation.md")
DEFAULT_PLOTS = Path("docs/paper-shapes")
DEFAULT_OUT = Path("runs/paper-shapes")

# A relative change within this band counts as flat, and two values within it as tied: the
# paper's plotted values carry about that much reading error.
FLAT = 0.05
# A hit-rate fall of this many percentage points between two points is a thrashing cliff.
CLIFF_PP = 20

PAPER_NAMES = {
    "round_robin": "vLLM",
    "continuum": "Continuum",
    "thunderagent": "ThunderAgent",
    "kv_router": "vLLM + SGLang Model Gateway",
}
SERVING_POLICIES = ("round_robin", "continuum", "thunderagent")
COLORS = {"round_robin": "tab:red", "continuum": "tab:orange", "thunderagent": "tab:blue", "kv_router": "tab:red"}
CONCURRENCY = "workload.concurrency"

# The RL baseline: the paper's vLLM + SGLang Model Gateway routes with SMG's default policy,
# `cache_aware` (a per-worker radix tree of routed prompts, highest prefix match above a 0.3
# threshold, shortest queue otherwise, rebalancing past a load gap). tasim's `kv_router` is the
# nearest model of that (prefix overlap against load per request); `round_robin` ignores prefixes.
RL_BASELINE = "kv_router"


# --- paper values ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Paper:
    """A paper value or range (``high``); ``approx``: read off a plot (shown with ≈)."""

    low: float
    high: float | None = None
    approx: bool = True

    @property
    def value(self) -> float:
        """The point a ratio is taken against: the value, or a range's midpoint."""
        return self.low if self.high is None else (self.low + self.high) / 2

    def text(self, fmt: Callable[[float], str], unit: str = "") -> str:
        body = fmt(self.low) if self.high is None else f"{fmt(self.low)}–{fmt(self.high)}"
        return f"{'≈' if self.approx else ''}{body}{unit}"


@dataclass(frozen=True)
class ServingCase:
    """One serving preset of paper Fig. 4: its concurrency sweep and the paper's values."""

    preset: str
    title: str
    concurrency: tuple[int, ...]
    throughput: dict[str, dict[int, Paper]]  # policy -> {concurrency: steps/min}
    ratios: dict[str, Paper]  # policy -> labelled throughput ratio vs vLLM at the largest point
    hit_rates: dict[tuple[str, int], Paper]  # (policy, concurrency) -> prefix hit rate (§6.4)
    latency: dict[str, Paper] = field(default_factory=dict)  # policy -> per-step s at the largest point (Fig. 10)
    latency_ratio: Paper | None = None  # labelled ThunderAgent / vLLM per-step latency (Fig. 10)


def _trend(*values: float) -> dict[int, Paper]:
    return dict(zip((24, 48, 72, 96), (Paper(v) for v in values)))


# §6.4 coding workloads: vLLM ≈97 % -> ≈30-38 %, ThunderAgent ≈93-97 % throughout, Continuum
# -> ≈55-67 % at the top (its ">90 %" at the bottom is a bound, not a value, so it is left out).
def _coding_hits(low: int, high: int) -> dict[tuple[str, int], Paper]:
    return {
        ("round_robin", low): Paper(97),
        ("round_robin", high): Paper(30, 38),
        ("continuum", high): Paper(55, 67),
        ("thunderagent", low): Paper(93, 97),
        ("thunderagent", high): Paper(93, 97),
    }


SERVING: tuple[ServingCase, ...] = (
    ServingCase(
        "swe-agent", "SWE-agent (mini-SWE-agent), GLM-4.6 FP8, one 8×H100 TP8 backend", (24, 48, 72, 96),
        {"round_robin": _trend(220, 275, 160, 140), "continuum": _trend(220, 303, 282, 213),
         "thunderagent": _trend(220, 350, 383, 372)},
        {"thunderagent": Paper(2.65, approx=False), "continuum": Paper(1.52, approx=False)},
        _coding_hits(24, 96),
        {"round_robin": Paper(47), "thunderagent": Paper(9)}, Paper(0.19, approx=False),
    ),
    ServingCase(
        "openhands", "OpenHands on SWE-bench, GLM-4.6 FP8, one 8×H100 TP8 backend", (24, 48, 72, 96),
        {"round_robin": {96: Paper(52)}, "continuum": {96: Paper(57)}, "thunderagent": {96: Paper(187)}},
        {"thunderagent": Paper(3.58, approx=False), "continuum": Paper(1.08, approx=False)},
        _coding_hits(24, 96),
        {"round_robin": Paper(56), "thunderagent": Paper(13)}, Paper(0.24, approx=False),
    ),
    ServingCase(
        "toolorchestra", "ToolOrchestra on HLE, Qwen3-8B FP16, one RTX 5090", (24, 32, 40, 48),
        {"round_robin": {48: Paper(4.8)}, "continuum": {48: Paper(3.1)}, "thunderagent": {48: Paper(7.1)}},
        {"thunderagent": Paper(1.48, approx=False), "continuum": Paper(0.65, approx=False)},
        {("round_robin", 48): Paper(12), ("continuum", 48): Paper(22, 29),
         ("thunderagent", 24): Paper(28), ("thunderagent", 48): Paper(18)},
    ),
)

# Fig. 1b: plain vLLM on SWE-agent, GLM-4.6; "up to 7.14x" latency inflation is the text's figure.
THRASHING_HIT = {24: Paper(98), 48: Paper(49), 72: Paper(32), 96: Paper(32)}
THRASHING_E2E = {24: Paper(7.7), 48: Paper(41), 72: Paper(55), 96: Paper(56)}
THRASHING_INFLATION = Paper(7.14, approx=False)


@dataclass(frozen=True)
class RlCase:
    """One row pair of paper Table 2; ``serving`` is the preset with the same program shape."""

    preset: str
    title: str
    serving: str
    baseline: Paper  # vLLM + SGLang Model Gateway, steps/min
    thunderagent: Paper


RL: tuple[RlCase, ...] = (
    RlCase("rl-mini-swe-agent", "mini-SWE-agent", "swe-agent", Paper(375.4, approx=False), Paper(671.8, approx=False)),
    RlCase("rl-openhands", "OpenHands", "openhands", Paper(69.1, approx=False), Paper(270.8, approx=False)),
)


# --- what to run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    """How long and how many points: the presets' own windows, or a seconds-long smoke run."""

    quick: bool

    def points(self, case: ServingCase) -> tuple[int, ...]:
        return (case.concurrency[0], case.concurrency[-1]) if self.quick else case.concurrency

    def serving_overrides(self) -> list[str]:
        return ["duration_s=60", "metrics.warmup_s=20"] if self.quick else []

    def rl_overrides(self) -> list[str]:
        if not self.quick:
            return []
        return ["workload.prompts_per_step=2", "workload.samples_per_prompt=2", "workload.turns=3",
                "workload.max_concurrency=4", "workload.training_s=5"]


Key = tuple[str, str, int | None]


@dataclass(frozen=True)
class Job:
    """One simulation: ``key`` is (preset, policy, concurrency or None for RL)."""

    key: Key
    scenario: Scenario
    out: Path


@dataclass(frozen=True)
class Outcome:
    summary: dict[str, Any]
    step_latency_s: float | None  # mean LLM call + following tool (agent runs only)


Results = dict[Key, Outcome]


def _preset(name: str) -> str:
    return str(PRESET_DIR / f"{name}.yaml")


def _sweep(values: Sequence[int]) -> Sweep:
    return Sweep(CONCURRENCY, tuple(str(v) for v in values), tuple(values))


def _jobs_of(preset: str, runs: Iterable[Run], out: Path) -> list[Job]:
    return [Job((preset, r.policy, r.point.get(CONCURRENCY)), r.scenario, out / preset / r.label) for r in runs]


def plan(mode: Mode, out: Path) -> list[Job]:
    """Every run of the suite, validated up front (plan_runs raises before anything runs)."""
    jobs: list[Job] = []
    for case in SERVING:
        planned = plan_runs(_preset(case.preset), SERVING_POLICIES, _sweep(mode.points(case)), mode.serving_overrides())
        jobs += _jobs_of(case.preset, planned.runs, out)
    for rl in RL:
        planned = plan_runs(_preset(rl.preset), (RL_BASELINE, "thunderagent"), None, mode.rl_overrides())
        jobs += _jobs_of(rl.preset, planned.runs, out)
    # longest first, so the pool's tail is short: RL runs, then high concurrency, ThunderAgent's
    # pause/resume bookkeeping being the slowest serving policy
    return sorted(jobs, key=lambda j: (j.key[2] is not None, -(j.key[2] or 0), j.key[1] != "thunderagent"))


# --- running -----------------------------------------------------------------------------------


def step_latency(run_dir: Path, warmup_s: float) -> float | None:
    """Mean per-step latency from the event log: a step is one LLM call plus the tool call after
    it (the paper's "reasoning plus acting period"), i.e. from a call's arrival to the arrival of
    the program's next call (holds included); a program's last call ends at its finish. Steps
    ending inside the measurement window count, as the summary's requests do."""
    started: dict[str, float] = {}
    finished: dict[str, float] = {}
    total, count = 0.0, 0

    def close(program: str, end: float) -> None:
        nonlocal total, count
        begin = started.pop(program, None)
        if begin is not None and end >= warmup_s:
            total += end - begin
            count += 1

    for event in read_events(find_events(run_dir)):
        if isinstance(event, ev.RequestArrived):
            close(event.program, event.t)
            started[event.program] = event.t
        elif isinstance(event, ev.RequestFinished):
            finished[event.program] = event.t
        elif isinstance(event, ev.ProgramFinished) and event.completed:
            close(event.program, finished.pop(event.program, event.t))
    return total / count if count else None


def execute(job: Job, reuse: bool) -> Outcome:
    """Simulate one job (in a worker process), or with ``reuse`` take its earlier run from
    ``job.out`` if that ran the very same scenario; then fold what the summary lacks from the log."""
    summary = reused_summary(job) if reuse else None
    if summary is None:
        summary = run_simulation(job.scenario, job.out)
    latency = None if job.key[2] is None else step_latency(job.out, job.scenario.metrics.warmup_s)
    return Outcome(summary, latency)


def reused_summary(job: Job) -> dict[str, Any] | None:
    """The summary of an earlier run in ``job.out``, or None when it ran anything else."""
    try:
        ran = json.loads((job.out / RUN_FILE).read_text())["scenario"]
        summary = json.loads((job.out / SUMMARY_FILE).read_text())
    except (OSError, ValueError, KeyError):
        return None
    return summary if ran == job.scenario.model_dump(mode="json") else None


def run_all(jobs: Sequence[Job], workers: int, reuse: bool = False) -> Results:
    """Runs are deterministic, so results do not depend on ``workers``."""
    if workers == 1:
        return {job.key: execute(job, reuse) for job in jobs}
    results: Results = {}
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)))
    try:
        futures: dict[Future[Outcome], Job] = {pool.submit(execute, job, reuse): job for job in jobs}
        for future in as_completed(futures):
            results[futures[future].key] = future.result()
    finally:
        pool.shutdown(cancel_futures=True)  # a failed run should not wait for the queued ones
    return results


# --- measured values ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """Lookups into the results of one preset (hit rates in percent)."""

    results: Results
    preset: str

    def summary(self, policy: str, c: int | None) -> dict[str, Any]:
        return self.results[(self.preset, policy, c)].summary

    def steps(self, policy: str, c: int | None) -> float:
        return self.summary(policy, c)["steps_per_min"]

    def hit(self, policy: str, c: int | None) -> float:
        return self.summary(policy, c)["prefix_hit_rate"] * 100

    def step_latency(self, policy: str, c: int) -> float:
        return self.results[(self.preset, policy, c)].step_latency_s or 0.0

    def call_latency(self, policy: str, c: int) -> float:
        return self.summary(policy, c)["e2e_s"]["mean"] or 0.0

    def working_set(self, policy: str, c: int) -> float:
        return self.summary(policy, c)["working_set_ratio"]

    def pool(self) -> str:
        tokens = next(o.summary["kv_pool_tokens"] for k, o in self.results.items() if k[0] == self.preset)
        return f"{tokens / 1e6:.2f}M" if tokens >= 1e6 else f"{tokens / 1e3:.0f}k"


def rollout_steps_per_min(summary: dict[str, Any], scenario_steps: int) -> float:
    """LLM calls per minute of rollout (training phases left out: the engines idle then). The
    summary holds every call (the RL presets have no warm-up) and the rollout time of completed
    steps, so the two match only when every step completed and no call was left unfinished."""
    rollout = summary["rollout"]
    if rollout is None or rollout["steps"] != scenario_steps or summary["requests_unfinished"]:
        raise RuntimeError(f"{summary['scenario']}/{summary['policy']}: the run ended before its last rollout step")
    return summary["requests_completed"] / (rollout["rollout_time_s"]["mean"] * rollout["steps"]) * 60


def rl_steps(results: Results, jobs: Sequence[Job]) -> dict[tuple[str, str], float]:
    """Rollout steps/min per (preset, policy) of the RL runs."""
    return {job.key[:2]: rollout_steps_per_min(results[job.key].summary, rollout_of(job.scenario).steps)
            for job in jobs if job.key[2] is None}


def rollout_of(scenario: Scenario) -> RolloutWorkload:
    workload = scenario.workload
    assert isinstance(workload, RolloutWorkload), "only the RL presets have rollout steps"
    return workload


# --- formatting and direction checks -----------------------------------------------------------


def pct(x: float) -> str:
    return f"{x:.0f}"


def num(x: float) -> str:
    return f"{x:,.1f}"


def times(x: float) -> str:
    return f"{x:.2f}×"


def direction(before: float, after: float, points: bool = False) -> str:
    """↑, ↓ or → (flat) with the change: relative, or in percentage points for hit rates (a
    relative change of a near-zero hit rate would read as a trend)."""
    if points:
        change, shown = after - before, f"{after - before:+.0f} pp"
        flat = FLAT * 100
    else:
        change = (after - before) / before if before else 0.0
        shown, flat = f"{change * 100:+.0f} %", FLAT
    arrow = "↑" if change > flat else "↓" if change < -flat else "→"
    return f"{arrow} {shown}"


def trend_note(paper: tuple[float, float], tasim: tuple[float, float], points: bool = False) -> tuple[str, bool]:
    """'paper ↑ +25 %, tasim ↓ -63 % ✗' and whether both go the same way."""
    p, t = direction(*paper, points=points), direction(*tasim, points=points)
    ok = p[0] == t[0]
    return f"paper {p}, tasim {t}{'' if ok else ' ✗'}", ok


def side_of_one(ratio: float) -> str:
    return "> 1" if ratio > 1 + FLAT else "< 1" if ratio < 1 - FLAT else "≈ 1"


def ratio_note(paper: float, tasim: float) -> tuple[str, bool]:
    """'paper > 1, tasim ≈ 1 ✗' and whether a ratio falls on the paper's side of 1."""
    ok = side_of_one(paper) == side_of_one(tasim)
    return f"paper {side_of_one(paper)}, tasim {side_of_one(tasim)}{'' if ok else ' ✗'}", ok


def order(values: dict[str, float]) -> str:
    """Systems from highest to lowest, ``≈`` between neighbours within FLAT of each other."""
    ranked = sorted(values, key=lambda k: values[k], reverse=True)
    text = PAPER_NAMES[ranked[0]]
    for prev, name in zip(ranked, ranked[1:]):
        text += f" {'≈' if values[prev] - values[name] <= FLAT * values[prev] else '>'} {PAPER_NAMES[name]}"
    return text


def order_conflicts(paper: dict[str, float], tasim: dict[str, float]) -> list[tuple[str, str]]:
    """Pairs (a, b) the paper puts a above b (beyond FLAT) that tasim does not."""
    return [(a, b) for a in paper for b in paper
            if paper[a] > paper[b] * (1 + FLAT) and not tasim[a] > tasim[b] * (1 + FLAT)]


@dataclass
class Table:
    """A markdown table whose every row carries paper, tasim and tasim/paper cells."""

    heads: tuple[str, ...]  # the leading label columns
    rows: list[list[str]] = field(default_factory=list)

    def add(self, labels: Sequence[str], paper: Paper, tasim: float, fmt: Callable[[float], str],
            unit: str = "", note: str = "") -> None:
        ratio = f"{tasim / paper.value:.2f}" + (" (vs mid)" if paper.high is not None else "")
        self.rows.append([*labels, paper.text(fmt, unit), f"{fmt(tasim)}{unit}", ratio, note or "—"])

    def markdown(self) -> list[str]:
        heads = [*self.heads, "paper", "tasim", "tasim/paper", "direction / note"]
        align = ["---"] * len(self.heads) + ["---:", "---:", "---:", "---"]
        return ["| " + " | ".join(heads) + " |", "| " + " | ".join(align) + " |",
                *("| " + " | ".join(row) + " |" for row in self.rows), ""]


@dataclass
class Report:
    """The markdown lines and every miss found while writing them."""

    lines: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    def add(self, *lines: str) -> None:
        self.lines += lines

    def miss(self, what: str, reason: str) -> None:
        self.misses.append(what)
        self.lines.append(f"- **Miss:** {what}. *Likely reason:* {reason}")


# --- likely reasons ----------------------------------------------------------------------------
# Each reads the measured quantities that distinguish the causes tasim can tell apart (where its
# hit rate collapses, how full the pool is, pins, pauses, preemptions), so the text stays true to
# whatever the runs measured.


def cliff_reason(m: Measured, policy: str, prev: int, c: int) -> str:
    return (f"tasim's {PAPER_NAMES[policy]} hit rate falls {m.hit(policy, prev):.0f} % → {m.hit(policy, c):.0f} % "
            f"between {prev} and {c} workflows as the offered working set grows "
            f"{m.working_set(policy, prev):.2f}× → {m.working_set(policy, c):.2f}× the {m.pool()}-token KV pool: "
            "tasim's thrashing cliff comes before the paper's. Where it falls is set by the pool and the per-program "
            f"context of `{m.preset}.yaml`, an estimate (the paper publishes neither context growth per turn nor "
            "turns per program).")


def queue_reason(m: Measured, policy: str, prev: int, c: int) -> str:
    return (f"tasim's {PAPER_NAMES[policy]} is past its cliff at both points (hit rate {m.hit(policy, prev):.0f} % → "
            f"{m.hit(policy, c):.0f} %, {m.summary(policy, c)['mean_kv_utilization'] * 100:.0f} % of the pool "
            "referenced), so more programs only lengthen the queue and keep batches full. tasim admits a request only "
            "when its whole sequence fits (Dynamo mocker semantics), so it preempts rarely "
            f"(preemptions in the window at {c}: {m.summary(policy, c)['preemptions']}); vLLM v1 admits on the "
            "scheduled chunk and preempts running requests as their decodes grow, a recompute cost that rises "
            "with concurrency: the likely source of the paper's further drop.")


def plateau_reason(m: Measured, policy: str, prev: int, c: int) -> str:
    return (f"tasim's {PAPER_NAMES[policy]} is on its plateau from {prev} workflows ({m.steps(policy, prev):.0f} → "
            f"{m.steps(policy, c):.0f} steps/min, hit rate {m.hit(policy, c):.0f} %, "
            f"{m.summary(policy, c)['pauses']} pauses in the window at {c}): it keeps the resident programs within "
            f"the pool (working set offered: {m.working_set(policy, prev):.2f}× at {prev}), so further programs wait "
            "and add no throughput. The paper's curve still rises here, so its pool holds more of these programs: "
            "the same pool-versus-context balance that brings vLLM's cliff earlier in tasim.")


def trend_reason(m: Measured, policy: str, paper: tuple[float, float], prev: int, c: int) -> str:
    """Why a throughput trend between two points differs, from the hit rates at both."""
    paper_way = direction(*paper)[0]
    tasim_way = direction(m.steps(policy, prev), m.steps(policy, c))[0]
    hit_drop = m.hit(policy, prev) - m.hit(policy, c)
    if paper_way != "↓" and tasim_way == "↓" and hit_drop >= CLIFF_PP:
        return cliff_reason(m, policy, prev, c)
    if paper_way == "↓" and abs(hit_drop) < FLAT * 100:
        return queue_reason(m, policy, prev, c)
    if paper_way == "↑" and tasim_way == "→":
        return plateau_reason(m, policy, prev, c)
    return (f"no single measured cause: tasim's {PAPER_NAMES[policy]} hit rate {m.hit(policy, prev):.0f} % → "
            f"{m.hit(policy, c):.0f} %, working set {m.working_set(policy, prev):.2f}× → "
            f"{m.working_set(policy, c):.2f}× the pool, {m.summary(policy, c)['preemptions']} preemptions at {c}.")


def unpinned_reason(m: Measured, c: int) -> str | None:
    """tasim's Continuum with no pins routes exactly as vLLM; say so when it happened."""
    if m.summary("continuum", c)["pins"]:
        return None
    return (f"tasim's Continuum took no pins at {c} workflows: it pins only when the predicted tool time (one moving "
            "average over all tool gaps) is at most `pin_threshold_s` (2 s), and the tools of "
            f"`{m.preset}.yaml` never qualify, so it serves exactly as vLLM. The paper's Continuum loses by holding "
            "KV through long tool calls (§6.4), so it does pin there; its per-tool predictions (short searches among "
            "long expert calls) are what tasim's unnamed tools cannot give")


def resident_reason(m: Measured, c: int) -> str:
    """tasim's ThunderAgent keeps a high hit rate where the paper's does not."""
    return (f"tasim's ThunderAgent runs without ACTING decay (the public scripts' default) and pauses programs until "
            f"the resident ones fit the {m.pool()}-token pool ({m.summary('thunderagent', c)['pauses']} pauses in the "
            f"window at {c}), so they keep their prefixes ({m.hit('thunderagent', c):.0f} % hits); the paper's low "
            "ThunderAgent hit rate suggests it let more programs share the pool, e.g. with the paper's 2^(−t) decay "
            "discounting programs in long tool calls, trading hits for concurrency")


def order_reason(m: Measured, conflicts: Sequence[tuple[str, str]], c: int, hits: bool) -> str:
    """Why the systems rank differently: one clause per cause found among the conflicting pairs."""
    involved = {p for pair in conflicts for p in pair}
    parts = []
    if "continuum" in involved and (unpinned := unpinned_reason(m, c)):
        parts.append(unpinned)
    if hits and any(b == "thunderagent" for _, b in conflicts):
        parts.append(resident_reason(m, c))
    if not parts:
        parts.append("no single measured cause: tasim " + ", ".join(
            f"{PAPER_NAMES[p]} {m.steps(p, c):.1f} steps/min at {m.hit(p, c):.0f} % hits" for p in sorted(involved)))
    return "; ".join(parts) + "."


def little_reason(m: Measured, prev: int, c: int, paper_steps: dict[int, Paper], paper_latency: dict[int, Paper]) -> str:
    """A closed loop's step time is concurrency / throughput (Little's law): hold both sides to it."""
    steps = (m.steps("round_robin", prev), m.steps("round_robin", c))
    tasim = (f"in a closed loop a step takes concurrency ÷ throughput (Little's law): tasim's vLLM throughput goes "
             f"{steps[0]:.1f} → {steps[1]:.1f} steps/min while programs go {prev} → {c}, so its step time must go "
             f"{prev * 60 / steps[0]:.0f} → {c * 60 / steps[1]:.0f} s")
    if prev not in paper_steps or c not in paper_steps:
        return tasim + "."
    a, b = paper_steps[prev].value, paper_steps[c].value
    return (tasim + f"; the paper's own Fig. 4 vLLM throughput ({a:.0f} → {b:.0f} steps/min) implies "
            f"{prev * 60 / a:.0f} → {c * 60 / b:.0f} s, not Fig. 1b's {paper_latency[prev].value:.0f} → "
            f"{paper_latency[c].value:.0f} s, so Fig. 1b likely comes from other runs or measures latency differently.")


def latency_ratio_reason(m: Measured, c: int) -> str:
    """In a closed loop the latency ratio of two systems is about the inverse of their throughput ratio."""
    ratio = m.steps("thunderagent", c) / m.steps("round_robin", c)
    return (f"in a closed loop a step takes concurrency ÷ throughput (Little's law), so the latency ratio is about "
            f"the inverse of the throughput ratio: tasim's ThunderAgent / vLLM throughput at {c} workflows is "
            f"{ratio:.2f}×, i.e. ≈{1 / ratio:.2f}× the latency; see the throughput rows of 3.2.")


# --- 3.1 thrashing -----------------------------------------------------------------------------


def thrashing_section(results: Results, points: Sequence[int], plots: str, report: Report) -> None:
    """Paper Fig. 1b: plain vLLM's hit rate and per-step latency as concurrency outgrows the pool."""
    m = Measured(results, "swe-agent")
    vllm = next(case for case in SERVING if case.preset == "swe-agent").throughput["round_robin"]
    metrics = (
        ("prefix hit rate", THRASHING_HIT, lambda c: m.hit("round_robin", c), pct, " %"),
        ("per-step latency (LLM call + tool)", THRASHING_E2E, lambda c: m.step_latency("round_robin", c), num, " s"),
        ("LLM-call latency (`e2e_s` mean)", THRASHING_E2E, lambda c: m.call_latency("round_robin", c), num, " s"),
    )
    table = Table(("workflows", "metric"))
    found: list[tuple[str, str]] = []
    for i, c in enumerate(points):
        for label, paper, measure, fmt, unit in metrics:
            note = ""
            if i:
                prev = points[i - 1]
                hit_rate = paper is THRASHING_HIT
                note, ok = trend_note((paper[prev].value, paper[c].value), (measure(prev), measure(c)), points=hit_rate)
                note = f"{prev}→{c}: {note}"
                if not ok:
                    reason = (cliff_reason(m, "round_robin", prev, c) if hit_rate
                              else little_reason(m, prev, c, vllm, THRASHING_E2E))
                    found.append((f"thrashing, {label}, {note}", reason))
            table.add([str(c), label], paper[c], measure(c), fmt, unit, note)
    for label, measure in (("per step", metrics[1][2]), ("LLM call", metrics[2][2])):
        table.add([f"{points[-1]} vs {points[0]}", f"latency inflation, {label}"], THRASHING_INFLATION,
                  max(measure(c) for c in points) / measure(points[0]), times,
                  note="paper: \"up to 7.14×\" (highest over lowest concurrency)")
    report.add(
        "### 3.1 KV thrashing of plain vLLM (paper Fig. 1b)",
        "",
        "`round_robin` on `swe-agent.yaml`, one backend (every per-request router routes alike there). The paper's "
        "per-step E2E latency covers one step, a reasoning plus acting period. No summary key holds that: `e2e_s` "
        "runs from an LLM call's arrival to its finish and leaves the tool out. So the suite folds the per-step "
        "latency from the event log: from an LLM call's arrival to the arrival of the program's next call (tool "
        "and any hold included; a program's last call ends at its finish), over steps ending in the window. "
        "`e2e_s` is listed against the same paper value for reference. Hit-rate trends are compared in "
        f"percentage points. KV pool {m.pool()} tokens; offered working set "
        + ", ".join(f"{m.working_set('round_robin', c):.2f}× the pool at {c}" for c in points) + ".",
        "",
        *table.markdown(),
        f"![prefix hit rate and per-step latency against concurrency]({plots}/thrashing.png)",
        "",
    )
    for what, reason in found:
        report.miss(what, reason)
    report.add("")


# --- 3.2 serving throughput --------------------------------------------------------------------


def _previous(points: Sequence[int], c: int, paper: dict[int, Paper]) -> int | None:
    """The run point before ``c`` that also has a paper value (a trend needs both ends)."""
    earlier = [p for p in points if p < c and p in paper]
    return earlier[-1] if earlier else None


def throughput_section(results: Results, case: ServingCase, points: Sequence[int], plots: str, report: Report) -> None:
    """Paper Fig. 4 for one preset: steps/min per system where the paper gives a value, the
    trend between the paper's points, the labelled ratios vs vLLM and the ordering of systems."""
    m = Measured(results, case.preset)
    table = Table(("workflows", "system"))
    for c in points:
        for policy in SERVING_POLICIES:
            paper = case.throughput[policy]
            if c not in paper:
                continue
            prev = _previous(points, c, paper)
            note = "" if prev is None else f"{prev}→{c}: " + trend_note(
                (paper[prev].value, paper[c].value), (m.steps(policy, prev), m.steps(policy, c)))[0]
            table.add([str(c), PAPER_NAMES[policy]], paper[c], m.steps(policy, c), num, note=note)
    top = points[-1]
    for policy, labelled in case.ratios.items():
        # a ratio on the wrong side of 1 is an ordering miss, reported with the ordering below
        ratio = m.steps(policy, top) / m.steps("round_robin", top)
        table.add([str(top), f"{PAPER_NAMES[policy]} / vLLM"], labelled, ratio, times,
                  note=ratio_note(labelled.value, ratio)[0])
    curves = "; ".join(f"{PAPER_NAMES[p]} " + " / ".join(f"{m.steps(p, c):.1f}" for c in points)
                       for p in SERVING_POLICIES)
    report.add(
        f"#### {case.title} (`{case.preset}.yaml`)",
        "",
        *table.markdown(),
        f"tasim at every point ({'/'.join(map(str, points))} workflows, steps/min): {curves}.",
        "",
        f"![throughput against concurrency, {case.preset}]({plots}/throughput-{case.preset}.png)",
        "",
    )
    throughput_checks(m, case, points, report)
    report.add("")


def throughput_checks(m: Measured, case: ServingCase, points: Sequence[int], report: Report) -> None:
    """The ordering of systems at every point with three paper values, and each system's trend
    between the paper's points: each miss with its likely reason."""
    for c in points:
        if not all(c in case.throughput[p] for p in SERVING_POLICIES):
            continue
        paper = {p: case.throughput[p][c].value for p in SERVING_POLICIES}
        tasim = {p: m.steps(p, c) for p in SERVING_POLICIES}
        ordering = f"paper {order(paper)}; tasim {order(tasim)}"
        if conflicts := order_conflicts(paper, tasim):
            report.miss(f"{case.preset} throughput order at {c} workflows: {ordering}",
                        order_reason(m, conflicts, c, hits=False))
        else:
            report.add(f"- Throughput order at {c} workflows: {ordering}: same order.")
    for policy in SERVING_POLICIES:
        paper = case.throughput[policy]
        for c in points:
            prev = _previous(points, c, paper)
            if prev is None:
                continue
            ends = (paper[prev].value, paper[c].value)
            note, ok = trend_note(ends, (m.steps(policy, prev), m.steps(policy, c)))
            if not ok:
                report.miss(f"{case.preset}, {PAPER_NAMES[policy]} throughput {prev}→{c} workflows: {note}",
                            trend_reason(m, policy, ends, prev, c))


# --- 3.3 hit rates and latency per system ------------------------------------------------------


def policy_metrics_section(results: Results, points: Sequence[int], case: ServingCase, report: Report) -> None:
    """§6.4 for one preset: prefix hit rate per system (Fig. 5) and per-step latency at the
    largest concurrency (Fig. 10), with the paper's trends and orderings checked."""
    m = Measured(results, case.preset)
    table = Table(("workflows", "system", "metric"))
    hits = {k: v for k, v in case.hit_rates.items() if k[1] in points}
    for (policy, c), paper in sorted(hits.items(), key=lambda kv: (kv[0][1], SERVING_POLICIES.index(kv[0][0]))):
        table.add([str(c), PAPER_NAMES[policy], "prefix hit rate"], paper, m.hit(policy, c), pct, " %")
    top = points[-1]
    for policy, paper in case.latency.items():
        labels = [str(top), PAPER_NAMES[policy]]
        table.add([*labels, "per-step latency (LLM call + tool)"], paper, m.step_latency(policy, top), num, " s")
        table.add([*labels, "LLM-call latency (`e2e_s` mean)"], paper, m.call_latency(policy, top), num, " s")
    latency_ratio = m.step_latency("thunderagent", top) / m.step_latency("round_robin", top)
    if case.latency_ratio is not None:
        table.add([str(top), "ThunderAgent / vLLM", "per-step latency"], case.latency_ratio, latency_ratio, times,
                  note=ratio_note(case.latency_ratio.value, latency_ratio)[0])
    report.add(f"#### {case.title} (`{case.preset}.yaml`)", "", *table.markdown())
    hit_rate_checks(m, points, hits, report)
    if case.latency_ratio is not None and not ratio_note(case.latency_ratio.value, latency_ratio)[1]:
        report.miss(f"{case.preset}: ThunderAgent's per-step latency is {latency_ratio:.2f}× vLLM's at {top} "
                    f"workflows (paper {case.latency_ratio.value:.2f}×)",
                    latency_ratio_reason(m, top))
    report.add("")


def hit_rate_checks(m: Measured, points: Sequence[int], hits: dict[tuple[str, int], Paper], report: Report) -> None:
    """The paper's hit-rate ordering at the largest point and each system's trend across the sweep."""
    low, top = points[0], points[-1]
    at_top = {p: hits[(p, top)].value for p in SERVING_POLICIES if (p, top) in hits}
    if len(at_top) == len(SERVING_POLICIES):
        tasim = {p: m.hit(p, top) for p in at_top}
        ordering = f"paper {order(at_top)}; tasim {order(tasim)}"
        if conflicts := order_conflicts(at_top, tasim):
            report.miss(f"{m.preset} hit-rate order at {top} workflows: {ordering}",
                        order_reason(m, conflicts, top, hits=True))
        else:
            report.add(f"- Hit-rate order at {top} workflows: {ordering}: same order.")
    for policy in SERVING_POLICIES:
        if (policy, low) not in hits or (policy, top) not in hits:
            continue
        paper = (hits[(policy, low)].value, hits[(policy, top)].value)
        note, ok = trend_note(paper, (m.hit(policy, low), m.hit(policy, top)), points=True)
        if ok:
            report.add(f"- {PAPER_NAMES[policy]} hit rate {low}→{top} workflows: {note}.")
        else:
            above = policy == "thunderagent" and m.hit(policy, top) > paper[1]
            reason = resident_reason(m, top) + "." if above else cliff_reason(m, policy, low, top)
            report.miss(f"{m.preset}, {PAPER_NAMES[policy]} hit rate {low}→{top} workflows: {note}", reason)


# --- 3.4 RL rollout ----------------------------------------------------------------------------


def rl_section(results: Results, jobs: Sequence[Job], mode: Mode, plots: str, report: Report) -> None:
    """Paper Table 2: rollout steps/min, vLLM + SGLang Model Gateway against ThunderAgent."""
    steps = rl_steps(results, jobs)
    table = Table(("workload", "system"))
    for case in RL:
        base, ta = steps[(case.preset, RL_BASELINE)], steps[(case.preset, "thunderagent")]
        for policy, paper, value in ((RL_BASELINE, case.baseline, base), ("thunderagent", case.thunderagent, ta)):
            hit = results[(case.preset, policy, None)].summary["prefix_hit_rate"] * 100
            table.add([case.title, f"{PAPER_NAMES[policy]} (`{policy}`)"], paper, value, num,
                      note=f"hit rate {hit:.0f} %")
        labelled = Paper(case.thunderagent.value / case.baseline.value, approx=False)
        table.add([case.title, "ThunderAgent / baseline"], labelled, ta / base, times,
                  note=ratio_note(labelled.value, ta / base)[0])
    scenario = next(job.scenario for job in jobs if job.key[0] == RL[0].preset)
    w, backends = rollout_of(scenario), scenario.cluster.backends
    report.add(
        "### 3.4 RL rollout (paper Table 2)",
        "",
        f"`{RL[0].preset}.yaml` and `{RL[1].preset}.yaml`: the swe-agent and openhands program shapes on {backends} "
        f"GLM-4.6 FP8 8×H100 TP8 backends, {w.steps} steps of {w.prompts_per_step} prompts × "
        f"{w.samples_per_prompt} samples under a global cap of {w.max_concurrency} trajectories, prefix caches "
        "emptied after each weight update. Steps/min = LLM calls / rollout time (training phases left out). The "
        "paper's baseline is vLLM behind SGLang Model Gateway, whose default policy is `cache_aware` (the worker "
        f"with the longest prefix match unless load is unbalanced), so it is modelled by `{RL_BASELINE}`, tasim's "
        "prefix-overlap-against-load router, not by `round_robin`, which ignores prefixes.",
        "",
        *table.markdown(),
        f"![RL rollout steps/min]({plots}/rl-rollout.png)",
        "",
    )
    per_node = w.max_concurrency // backends
    for case in RL:
        base, ta = steps[(case.preset, RL_BASELINE)], steps[(case.preset, "thunderagent")]
        serving = next(s for s in SERVING if s.preset == case.serving)
        if per_node in mode.points(serving):
            report.add(per_node_note(Measured(results, case.serving), serving, case, base, per_node, backends))
        if not ratio_note(case.thunderagent.value / case.baseline.value, ta / base)[1]:
            report.miss(f"{case.title} rollout: ThunderAgent / baseline is {ta / base:.2f}× in tasim, "
                        f"{case.thunderagent.value / case.baseline.value:.2f}× in the paper",
                        f"tasim's hit rates: baseline {Measured(results, case.preset).hit(RL_BASELINE, None):.0f} %, "
                        f"ThunderAgent {Measured(results, case.preset).hit('thunderagent', None):.0f} %.")
    report.add("")


def per_node_note(m: Measured, serving: ServingCase, case: RlCase, base: float, per_node: int, backends: int) -> str:
    """Set the RL baseline beside ``backends`` one-node serving runs at the per-node load."""
    one = m.steps("round_robin", per_node)
    close = abs(one * backends - base) <= 3 * FLAT * base
    verdict = (f"the baseline behaves like {backends} separately thrashing nodes, so its distance from the paper is "
               "largely the serving vLLM distance of 3.2" if close else
               f"the {backends}-node baseline does not reduce to one-node serving here")
    paper = serving.throughput["round_robin"].get(per_node)
    paper_text = "" if paper is None else (
        f" The paper's one-node vLLM at {per_node} workflows (≈{paper.value:.0f}) × {backends} = "
        f"{paper.value * backends:.0f}, against its Table 2 baseline of {case.baseline.value:.1f}.")
    return (f"- {case.title}: per node the rollout carries {per_node} trajectories; tasim's one-node "
            f"`{serving.preset}` vLLM at {per_node} workflows gives {one:.1f} steps/min, × {backends} = "
            f"{one * backends:.1f}, against its RL baseline's {base:.1f}: {verdict}.{paper_text}")


# --- plots -------------------------------------------------------------------------------------

DPI = 120
WORKFLOWS_LABEL = "concurrent workflows (programs in flight)"


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)  # the Agg canvas, attached explicitly: never needs a display
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def _paper_points(ax: Any, paper: dict[int, Paper], color: str, label: str) -> None:
    """The paper's values as hollow squares, dashed between them when there are several."""
    xs = sorted(paper)
    ax.plot(xs, [paper[x].value for x in xs], linestyle="--" if len(xs) > 1 else "none", marker="s",
            markersize=8, fillstyle="none", color=color, label=label, zorder=3)


def throughput_plot(results: Results, case: ServingCase, points: Sequence[int], path: Path) -> Path:
    m = Measured(results, case.preset)
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    for policy in SERVING_POLICIES:
        name = PAPER_NAMES[policy]
        # vLLM drawn widest and underneath: where a policy serves exactly as vLLM, both stay visible
        wide = policy == "round_robin"
        ax.plot(points, [m.steps(policy, c) for c in points], marker="o", color=COLORS[policy],
                linewidth=4 if wide else 1.8, markersize=9 if wide else 6, zorder=1 if wide else 2,
                label=f"tasim · {name} ({policy})")
        _paper_points(ax, case.throughput[policy], COLORS[policy], f"paper · {name}")
    ax.set_xticks(list(points))
    ax.set_ylim(bottom=0)
    ax.set_xlabel(WORKFLOWS_LABEL)
    ax.set_ylabel("throughput (steps/min; a step is one LLM call)")
    ax.set_title(f"Throughput against concurrency · {case.preset}\n{case.title}", fontsize="medium")
    ax.legend(fontsize="small", ncol=2)
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def thrashing_plot(results: Results, points: Sequence[int], path: Path) -> Path:
    m = Measured(results, "swe-agent")
    fig = Figure(figsize=(11, 4.6))
    hit_ax, lat_ax = fig.subplots(1, 2)
    hit_ax.plot(points, [m.hit("round_robin", c) for c in points], marker="o", color=COLORS["round_robin"],
                label="tasim · vLLM (round_robin)")
    _paper_points(hit_ax, THRASHING_HIT, "black", "paper · vLLM (Fig. 1b)")
    hit_ax.set_ylim(0, 105)
    hit_ax.set_ylabel("prefix hit rate (% of prompt tokens)")
    hit_ax.set_title("Prefix hit rate")
    lat_ax.plot(points, [m.step_latency("round_robin", c) for c in points], marker="o", color=COLORS["round_robin"],
                label="tasim · per step (LLM call + tool)")
    lat_ax.plot(points, [m.call_latency("round_robin", c) for c in points], marker="^", linestyle=":",
                color="tab:purple", label="tasim · per LLM call (e2e_s)")
    _paper_points(lat_ax, THRASHING_E2E, "black", "paper · per-step E2E (Fig. 1b)")
    lat_ax.set_ylim(bottom=0)
    lat_ax.set_ylabel("mean latency (s)")
    lat_ax.set_title("Per-step latency")
    for ax in (hit_ax, lat_ax):
        ax.set_xticks(list(points))
        ax.set_xlabel(WORKFLOWS_LABEL)
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)
    fig.suptitle("KV thrashing of plain vLLM · swe-agent, GLM-4.6 FP8, one 8×H100 TP8 backend")
    return _save(fig, path)


def rl_plot(results: Results, jobs: Sequence[Job], path: Path) -> Path:
    steps = rl_steps(results, jobs)
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    width = 0.38
    for offset, policy in ((-width / 2, RL_BASELINE), (width / 2, "thunderagent")):
        xs = [i + offset for i in range(len(RL))]
        ax.bar(xs, [steps[(case.preset, policy)] for case in RL], width, color=COLORS[policy], alpha=0.8,
               label=f"tasim · {PAPER_NAMES[policy]} ({policy})")
        paper = [(case.baseline if policy == RL_BASELINE else case.thunderagent).value for case in RL]
        ax.plot(xs, paper, linestyle="none", marker="s", markersize=9, fillstyle="none", color="black",
                label="paper (Table 2)" if policy == RL_BASELINE else None)
    ax.set_xticks(range(len(RL)), [case.title for case in RL])
    ax.set_xlabel("agent workload (GLM-4.6 FP8, 2 × 8×H100 TP8, N = 144)")
    ax.set_ylabel("rollout throughput (steps/min)")
    ax.set_title("RL rollout throughput · paper Table 2")
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def write_plots(results: Results, jobs: Sequence[Job], mode: Mode, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    swe = next(case for case in SERVING if case.preset == "swe-agent")
    written = [thrashing_plot(results, mode.points(swe), directory / "thrashing.png")]
    for case in SERVING:
        written.append(throughput_plot(results, case, mode.points(case), directory / f"throughput-{case.preset}.png"))
    written.append(rl_plot(results, jobs, directory / "rl-rollout.png"))
    return written


# --- the document ------------------------------------------------------------------------------


def _window(jobs: Sequence[Job], preset: str) -> str:
    scenario = next(job.scenario for job in jobs if job.key[0] == preset)
    return f"{scenario.metrics.warmup_s:g}–{scenario.duration_s:g} s"


def markdown(results: Results, jobs: Sequence[Job], mode: Mode, plots: str, wall_s: float, processes: int,
             reused: bool) -> str:
    """The whole generated span: method, the four experiments, and every miss gathered at the end."""
    report = Report()
    windows = "; ".join(f"`{case.preset}` {_window(jobs, case.preset)}" for case in SERVING)
    simulated = sum(outcome.summary["wall_time_s"] or 0.0 for outcome in results.values())
    report.add(
        "Generated by `make paper-shapes` (`python -m tasim.validation.paper_shapes"
        + (" --quick" if mode.quick else "") + "`); do not edit by hand. Paper values are the ThunderAgent paper's "
        "(arXiv 2602.13692 §6, transcribed in `shared/reference/thunderagent.md` §6.2–6.4); ≈ marks values read "
        "off its plots, and a range is compared at its midpoint. tasim/paper is the measured value over the paper's. "
        f"Direction checks count a change within ±{FLAT * 100:.0f} % (hit rates: ±{FLAT * 100:.0f} percentage "
        "points) as flat (→) and values that close as tied (≈); ✗ marks a miss, and every miss is listed with its "
        "likely "
        "reason under its table and again in 3.5.",
        "",
        "Systems: vLLM = `round_robin` (one backend, so any per-request router is the same), Continuum = "
        "`continuum`, ThunderAgent = `thunderagent` (`variant: upstream` with its defaults: Δt = 5 s and no ACTING "
        "decay, as the paper's public reproduction scripts run it). Presets run unchanged but for the concurrency"
        + (" and 60 s runs (`--quick`: first and last points only, tiny RL batches)" if mode.quick else "")
        + f". Measurement windows (simulated time): {windows}; the paper measured 10–70 min (mini-SWE-agent) and "
        f"600–7,800 s (ToolOrchestra). Seed 0, tasim {__version__}. {len(results)} runs; "
        + ("this text was rendered with `--reuse` from the runs of an earlier invocation" if reused
           else f"this invocation took {wall_s / 60:.1f} min of wall time on {processes} processes")
        + f"; simulation wall time summed over the runs: {simulated / 60:.1f} min.",
        "",
    )
    swe = next(case for case in SERVING if case.preset == "swe-agent")
    thrashing_section(results, mode.points(swe), plots, report)
    report.add("### 3.2 Serving throughput against concurrency (paper Fig. 4)", "")
    for case in SERVING:
        throughput_section(results, case, mode.points(case), plots, report)
    report.add("### 3.3 Prefix hit rate and per-step latency per system (paper §6.4, Figs. 5 and 10)", "")
    for case in SERVING:
        policy_metrics_section(results, mode.points(case), case, report)
    rl_section(results, jobs, mode, plots, report)
    report.add("### 3.5 Misses at a glance", "")
    report.add(*(f"{i}. {what}." for i, what in enumerate(report.misses, 1)) if report.misses else ("None.",))
    return "\n".join(report.lines).rstrip("\n") + "\n"


def splice(document: Path, text: str) -> None:
    """Replace only what lies between the marker lines. The file is read right before the write
    and replaced atomically, because other generators and people edit its other sections."""
    content = document.read_text()
    head, begin, rest = content.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"error: {document}: markers {BEGIN} ... {END} not found")
    partial = document.with_name(document.name + ".partial")
    partial.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")
    partial.replace(document)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60 s runs, two points per sweep, tiny RL (for tests)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel simulation processes")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="run directories go here")
    parser.add_argument("--doc", type=Path, default=DEFAULT_DOC, help="the document whose marked span is replaced")
    parser.add_argument("--plots", type=Path, default=DEFAULT_PLOTS, help="PNG directory (linked from the document)")
    parser.add_argument("--reuse", action="store_true",
                        help="take runs already in --out that ran the very same scenario instead of rerunning them")
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


if __name__ == "__main__":
    main()
