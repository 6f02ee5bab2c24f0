"""The likely reason written under each miss.

Each reads the measured quantities that distinguish the causes tasim can tell apart (where its
hit rate collapses, how full the pool is, pins, pauses, preemptions), so the text stays true to
whatever the runs measured.
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.paper_shapes.directions import FLAT, direction
from lab.paper_shapes.measured import Measured
from lab.paper_shapes.paper import PAPER_NAMES
from tasim.validation.published.measurement_file import Published

# A hit-rate fall of this many percentage points between two points is a thrashing cliff.
CLIFF_PP = 20

LITTLES_LAW = "in a closed loop a step takes concurrency ÷ throughput (Little's law)"


def cliff_reason(m: Measured, policy: str, prev: int, c: int) -> str:
    return (
        f"tasim's {PAPER_NAMES[policy]} hit rate falls {m.hit(policy, prev):.0f} % → {m.hit(policy, c):.0f} % "
        f"between {prev} and {c} workflows as the offered working set grows "
        f"{m.working_set(policy, prev):.2f}× → {m.working_set(policy, c):.2f}× the {m.pool()}-token KV pool: "
        "tasim's thrashing cliff and the paper's fall at different concurrencies. Where tasim's falls is set by "
        f"the pool and the per-program context of `{m.preset}.yaml`, an estimate or a fit (see its header; the "
        "paper publishes neither context growth per turn nor turns per program)."
    )


def queue_reason(m: Measured, policy: str, prev: int, c: int) -> str:
    return (
        f"tasim's {PAPER_NAMES[policy]} is past its cliff at both points (hit rate {m.hit(policy, prev):.0f} % → "
        f"{m.hit(policy, c):.0f} %, {m.summary(policy, c)['mean_kv_utilization'] * 100:.0f} % of the pool "
        "referenced), so more programs only lengthen the queue and keep batches full. tasim admits a request only "
        "when its whole sequence fits (Dynamo mocker semantics), so it preempts rarely "
        f"(preemptions in the window at {c}: {m.summary(policy, c)['preemptions']}); vLLM v1 admits on the "
        "scheduled chunk and preempts running requests as their decodes grow, a recompute cost that rises "
        "with concurrency: the likely source of the paper's further drop."
    )


def plateau_reason(m: Measured, policy: str, prev: int, c: int) -> str:
    return (
        f"tasim's {PAPER_NAMES[policy]} is on its plateau from {prev} workflows ({m.steps(policy, prev):.0f} → "
        f"{m.steps(policy, c):.0f} calls/min, hit rate {m.hit(policy, c):.0f} %, "
        f"{m.summary(policy, c)['pauses']} pauses in the window at {c}): it keeps the resident programs within "
        f"the pool (working set offered: {m.working_set(policy, prev):.2f}× at {prev}), so further programs wait "
        "and add no throughput. The paper's curve still rises here, so its pool holds more of these programs: "
        "the same pool-versus-context balance that sets where vLLM's cliff falls in tasim."
    )


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
    return (
        f"no single measured cause: tasim's {PAPER_NAMES[policy]} hit rate {m.hit(policy, prev):.0f} % → "
        f"{m.hit(policy, c):.0f} %, working set {m.working_set(policy, prev):.2f}× → "
        f"{m.working_set(policy, c):.2f}× the pool, {m.summary(policy, c)['preemptions']} preemptions at {c}."
    )


def unpinned_reason(m: Measured, c: int) -> str | None:
    """tasim's Continuum with no pins routes exactly as vLLM; say so when it happened."""
    if m.summary("continuum", c)["pins"]:
        return None
    return (
        f"tasim's Continuum took no pins at {c} workflows: it pins only when the predicted tool time (a moving "
        "average per named tool, one over all gaps where the preset names none) is at most `pin_threshold_s` "
        f"(2 s), and the tools of `{m.preset}.yaml` never qualify, so it serves exactly as vLLM. The paper's "
        "Continuum differs from its vLLM here, so it did pin: its tools were shorter than the preset's (whose "
        "tool time is an estimate or a fit, see its header), or its per-tool predictions picked out the short "
        "ones among long ones, which a preset without `workload.tools` cannot show"
    )


def resident_reason(m: Measured, c: int) -> str:
    """tasim's ThunderAgent keeps a high hit rate where the paper's does not."""
    return (
        f"tasim's ThunderAgent runs without ACTING decay (the public scripts' default) and pauses programs until "
        f"the resident ones fit the {m.pool()}-token pool ({m.summary('thunderagent', c)['pauses']} pauses in the "
        f"window at {c}), so they keep their prefixes ({m.hit('thunderagent', c):.0f} % hits); the paper's low "
        "ThunderAgent hit rate suggests it let more programs share the pool, e.g. with the paper's 2^(−t) decay "
        "discounting programs in long tool calls, trading hits for concurrency"
    )


def order_reason(m: Measured, conflicts: Sequence[tuple[str, str]], c: int, hits: bool) -> str:
    """Why the systems rank differently: one clause per cause found among the conflicting pairs."""
    involved = {p for pair in conflicts for p in pair}
    parts: list[str] = []
    if "continuum" in involved and (unpinned := unpinned_reason(m, c)):
        parts.append(unpinned)
    if hits and any(b == "thunderagent" for _, b in conflicts):
        parts.append(resident_reason(m, c))
    if not parts:
        parts.append(
            "no single measured cause: tasim "
            + ", ".join(f"{PAPER_NAMES[p]} {m.steps(p, c):.1f} calls/min at {m.hit(p, c):.0f} % hits" for p in sorted(involved))
        )
    return "; ".join(parts) + "."


def little_reason(m: Measured, prev: int, c: int, paper_steps: dict[int, Published], paper_latency: dict[int, Published]) -> str:
    """A closed loop's step time is concurrency / throughput (Little's law): hold both sides to it."""
    steps = (m.steps("round_robin", prev), m.steps("round_robin", c))
    tasim = (
        f"{LITTLES_LAW}: tasim's vLLM throughput goes "
        f"{steps[0]:.1f} → {steps[1]:.1f} calls/min while programs go {prev} → {c}, so its step time must go "
        f"{prev * 60 / steps[0]:.0f} → {c * 60 / steps[1]:.0f} s"
    )
    if prev not in paper_steps or c not in paper_steps:
        return tasim + "."
    a, b = paper_steps[prev].value, paper_steps[c].value
    return (
        tasim + f"; the paper's own Fig. 4 vLLM throughput ({a:.0f} → {b:.0f} steps/min) implies "
        f"{prev * 60 / a:.0f} → {c * 60 / b:.0f} s, not Fig. 1b's {paper_latency[prev].value:.0f} → "
        f"{paper_latency[c].value:.0f} s, so Fig. 1b likely comes from other runs or measures latency differently."
    )


def latency_ratio_reason(m: Measured, c: int) -> str:
    """In a closed loop the latency ratio of two systems is about the inverse of their throughput ratio."""
    ratio = m.steps("thunderagent", c) / m.steps("round_robin", c)
    return (
        f"{LITTLES_LAW}, so the latency ratio is about "
        f"the inverse of the throughput ratio: tasim's ThunderAgent / vLLM throughput at {c} workflows is "
        f"{ratio:.2f}×, i.e. ≈{1 / ratio:.2f}× the latency; see the throughput rows of 3.2."
    )
