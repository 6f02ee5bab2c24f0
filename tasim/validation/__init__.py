"""Cross-validation against Dynamo's own simulator (``dynamo.replay``).

One workload is written as a Mooncake-format trace (`workload_trace`), replayed through
Dynamo's Rust replay of its mocker engines and real router (`dynamo_replay`) and through tasim
with the same engine settings (`tasim_replay`); both sides' per-request records go through one
set of metric definitions (`measures`), so a difference is the simulators', not the bookkeeping's.
"""


class ValidationUnavailable(ValueError):
    """A validation that cannot run: the workload has no trace form, or Dynamo is missing."""
