"""The simulator: processes for programs, workers and the policy host in simulated time, on tasim's own event kernel
(`runner`, `clock`), the workload drivers (`drivers`, `rollout`), invariant checks (`checks`),
one simulation written as a run folder (`simulation`), the engine of each worker (`engine`) and
the perf models that time its steps (`perf`). Its hottest modules may be compiled: see
`tasim.native`.

May import: `tasim.hosting`, `tasim.workloads`, `tasim.results` and the layers below them;
never `tasim.live`."""

from tasim.native import search_path

__path__ = search_path(__name__, __path__)
