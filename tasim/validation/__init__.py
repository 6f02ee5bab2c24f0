"""How far tasim can be trusted: against Dynamo's own simulator, vLLM's scheduler and published
measurements, and calibration to the latter.

Against Dynamo (``dynamo.replay``): one workload is written as a Mooncake-format trace
(`workload_trace`), replayed through Dynamo's Rust replay of its mocker engines and real router
(`dynamo_replay`) and through tasim with the same engine settings (`tasim_replay`); both sides'
per-request records go through one set of metric definitions (`measures`), so a difference is
the simulators', not the bookkeeping's. `against_dynamo` runs and tabulates one scenario
(``tasim validate dynamo``). Against vLLM: `against_vllm` with vLLM's scheduler as an engine
(`vllm_engine`). Against published numbers: `published`; fitting to them: `calibration`.

May import: `tasim.tools`, `tasim.sim`, `tasim.live` and every layer below them."""

from collections.abc import Callable

# Hears of each host copy job an engine plans (`against_vllm`, both engines): worker, request,
# "load" or "store", the request's blocks it copies (their indexes in its prompt), the start of
# the step that planned it, and when it is done.
TransferObserver = Callable[[str, str, str, tuple[int, ...], float, float], None]


class ValidationUnavailable(ValueError):
    """A validation that cannot run: the workload has no trace form, or Dynamo is missing or failed."""
