"""Readers that turn recorded request traces into plain frozen dataclasses (no simulation).

- :func:`read_mooncake`: Mooncake JSONL (one request per line, open-loop arrivals).
- :func:`read_dynamo_agent_trace`: Dynamo request traces (``dynamo.request.trace.v1``),
  grouped into agent sessions of turns separated by tool or think gaps.

Both remap the trace's prefix-block ids onto engine-block hashes in their own namespace
(see :mod:`tasim.workloads.trace_formats.reading`) and raise :class:`TraceError` naming ``path:line``.
"""

from tasim.workloads.trace_formats.dynamo_agent import TraceSession, TraceTurn, read_dynamo_agent_trace
from tasim.workloads.trace_formats.mooncake import TraceRequest, ideal_prefix_hit_rate, read_mooncake
from tasim.workloads.trace_formats.reading import TRACE_HASH_NAMESPACE, TraceError

__all__ = [
    "TRACE_HASH_NAMESPACE",
    "TraceError",
    "TraceRequest",
    "TraceSession",
    "TraceTurn",
    "ideal_prefix_hit_rate",
    "read_dynamo_agent_trace",
    "read_mooncake",
]
