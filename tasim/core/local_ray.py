"""A private Ray cluster that listens on the loopback address only.

``ray.init(_node_ip_address="127.0.0.1")`` alone does not do it: Ray replaces a loopback address
by the machine's routable one so that other nodes could join (Ray 2.60's
``services.resolve_ip_for_localhost``), and its raylet, object store, dashboard agent and every
server an actor opens on ``ray.util.get_node_ip_address()`` (TransferQueue's ZMQ sockets, for
one) then listen there. Ray keeps loopback only with its cluster mode off, which it reads from
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``: at import in every worker (they inherit the variable from
the raylet this process starts) and in ``ray_constants`` here, already imported. Both are set
for the start and put back after it, so a later join of a real cluster in this process works.
"""

from __future__ import annotations

import os
from typing import Any

LOOPBACK = "127.0.0.1"
CLUSTER_MODE_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def init_local_ray(**options: Any) -> None:
    """``ray.init`` a new single-machine cluster on 127.0.0.1 with ``options``."""
    import ray
    from ray._private import ray_constants

    variable = os.environ.get(CLUSTER_MODE_VARIABLE)
    cluster_mode = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[CLUSTER_MODE_VARIABLE] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(_node_ip_address=LOOPBACK, **options)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster_mode
        if variable is None:
            del os.environ[CLUSTER_MODE_VARIABLE]
        else:
            os.environ[CLUSTER_MODE_VARIABLE] = variable
