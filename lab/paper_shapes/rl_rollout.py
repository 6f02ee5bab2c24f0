"""Section 3.4: RL rollout steps/min on two nodes, against paper Table 2."""

from __future__ import annotations

from collections.abc import Sequence

from lab.paper_shapes.directions import FLAT, ratio_note
from lab.paper_shapes.execution import Results
from lab.paper_shapes.measured import Measured, rl_steps, rollout_of
from lab.paper_shapes.paper import PAPER_NAMES, RL, RL_BASELINE, RlCase, ServingCase, serving_case
from lab.paper_shapes.plan import Job, Mode, scenario_of
from lab.paper_shapes.tables import Report, Table, num, times


def rl_section(results: Results, jobs: Sequence[Job], mode: Mode, plots: str, report: Report) -> None:
    """Paper Table 2: rollout steps/min, vLLM + SGLang Model Gateway against ThunderAgent."""
    steps = rl_steps(results, jobs)
    measured = {case.preset: (steps[(case.preset, RL_BASELINE)], steps[(case.preset, "thunderagent")]) for case in RL}
    ratio_ok: dict[str, bool] = {}
    table = Table(("workload", "system"))
    for case in RL:
        m, (base, ta) = Measured(results, case.preset), measured[case.preset]
        for policy, paper, value in ((RL_BASELINE, case.baseline, base), ("thunderagent", case.thunderagent, ta)):
            table.add([case.title, f"{PAPER_NAMES[policy]} (`{policy}`)"], paper, value, num, note=f"hit rate {m.hit(policy, None):.0f} %")
        note, ratio_ok[case.preset] = ratio_note(case.ratio.value, ta / base)
        table.add([case.title, "ThunderAgent / baseline"], case.ratio, ta / base, times, note=note)
    scenario = scenario_of(jobs, RL[0].preset)
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
        m, (base, ta) = Measured(results, case.preset), measured[case.preset]
        serving = serving_case(case.serving)
        if per_node in mode.points(serving):
            report.add(per_node_note(Measured(results, case.serving), serving, case, base, per_node, backends))
        if not ratio_ok[case.preset]:
            report.miss(
                f"{case.title} rollout: ThunderAgent / baseline is {ta / base:.2f}× in tasim, {case.ratio.value:.2f}× in the paper",
                f"tasim's hit rates: baseline {m.hit(RL_BASELINE, None):.0f} %, ThunderAgent {m.hit('thunderagent', None):.0f} %.",
            )
    report.add("")


def per_node_note(m: Measured, serving: ServingCase, case: RlCase, base: float, per_node: int, backends: int) -> str:
    """Set the RL baseline beside ``backends`` one-node serving runs at the per-node load."""
    one = m.steps("round_robin", per_node)
    close = abs(one * backends - base) <= 3 * FLAT * base
    verdict = (
        f"the baseline behaves like {backends} separately thrashing nodes, so its distance from the paper is largely the serving vLLM distance of 3.2"
        if close
        else f"the {backends}-node baseline does not reduce to one-node serving here"
    )
    paper = serving.throughput["round_robin"].get(per_node)
    paper_text = (
        ""
        if paper is None
        else (
            f" The paper's one-node vLLM at {per_node} workflows (≈{paper.value:.0f}) × {backends} = "
            f"{paper.value * backends:.0f}, against its Table 2 baseline of {case.baseline.value:.1f}."
        )
    )
    return (
        f"- {case.title}: per node the rollout carries {per_node} trajectories; tasim's one-node "
        f"`{serving.preset}` vLLM at {per_node} workflows gives {one:.1f} calls/min, × {backends} = "
        f"{one * backends:.1f}, against its RL baseline's {base:.1f}: {verdict}.{paper_text}"
    )
