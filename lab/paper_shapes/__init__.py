"""The paper-shape suite of docs/results/validation.md: tasim against the curves and tables the
ThunderAgent paper publishes (arXiv 2602.13692 §6.2-6.4, entered in
``measurements/thunderagent-paper.yaml``).

    python -m lab.paper_shapes [--quick] [--jobs N] [--out DIR]
                                            [--doc docs/results/validation.md] [--plots docs/results/paper-shapes] [--reuse]

Three experiments, each run with the shipped presets and only the concurrency (and, with
``--quick``, the length) overridden:

1. KV thrashing of plain vLLM (``round_robin``, ``swe-agent.yaml``, one backend) at 24-96
   workflows: prefix hit rate and per-step latency (paper Fig. 1b).
2. Throughput against concurrency for vLLM, Continuum and ThunderAgent on the SWE-agent,
   OpenHands and ToolOrchestra presets (paper Fig. 4 and its SWE-agent trend), with the per-policy
   hit rates and latencies of §6.4.
3. RL rollout steps/min on two nodes, N = 144 (paper Table 2).

The generated markdown replaces only the span between the ``paper-shapes`` markers of the
document, and the plots go to ``docs/results/paper-shapes/``. Every number in the text is measured by
the run that writes it; direction checks (trends, orderings, ratios on either side of 1) mark
where tasim misses the paper, with the measured quantities that point at the likely cause.

The paper's values are the points of ``measurements/thunderagent-paper.yaml``, the file ``python
-m tasim validate published`` holds every preset against; the runs and the metrics they are read
with are that command's too (`tasim.validation.published`). This suite adds what a table of points
cannot: the curves over the paper's concurrency axes and the direction checks along them.

Modules: ``paper`` (the presets and axes, and the file's values), ``plan`` and ``execution`` (which
simulations, and running them), ``measured`` (numbers read from the runs), ``directions``, ``ordering``
and ``reasons`` (direction checks and the likely reasons for a miss), ``tables`` (markdown tables),
one module per document section (``thrashing``, ``throughput``, ``policy_metrics``,
``rl_rollout``), ``markdown`` and ``splice`` (the generated span and its place in the document),
``curves`` (the plots) and ``command`` (the command line).
"""
