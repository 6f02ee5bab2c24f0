"""How far tasim can be trusted: against Dynamo's own simulator and against the ThunderAgent paper.

Against Dynamo (``dynamo.replay``): one workload is written as a Mooncake-format trace
(`workload_trace`), replayed through Dynamo's Rust replay of its mocker engines and real router
(`dynamo_replay`) and through tasim with the same engine settings (`tasim_replay`); both sides'
per-request records go through one set of metric definitions (`measures`), so a difference is
the simulators', not the bookkeeping's. `against_dynamo` runs and tabulates one scenario
(``tasim validate dynamo``); `matrix` runs every configuration for docs/validation.md.

Against the paper: `paper_shapes` (``make paper-shapes``). Both generators write their section
of docs/validation.md through `doc_section`.
"""


class ValidationUnavailable(ValueError):
    """A validation that cannot run: the workload has no trace form, or Dynamo is missing or failed."""
