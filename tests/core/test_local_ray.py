"""A private Ray cluster listens on 127.0.0.1 only: its own servers and an actor's."""

from __future__ import annotations

import os

import psutil
import pytest

from tasim.core.local_ray import CLUSTER_MODE_VARIABLE, init_local_ray

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.processes


def _listening_addresses() -> set[str]:
    """The addresses this process and everything it started listen on."""
    me = psutil.Process()
    addresses = set()
    for process in [me, *me.children(recursive=True)]:
        try:
            connections = process.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        addresses |= {c.laddr.ip.removeprefix("::ffff:") for c in connections if c.status == psutil.CONN_LISTEN}  # IPv4-mapped
    return addresses


def test_the_cluster_and_its_actors_listen_on_loopback_only() -> None:
    before = os.environ.get(CLUSTER_MODE_VARIABLE)
    init_local_ray(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        # a server an actor opens where Ray says its node is, as TransferQueue's do
        @ray.remote
        class Server:
            def __init__(self) -> None:
                import socket

                self.socket = socket.create_server((ray.util.get_node_ip_address(), 0))

            def address(self) -> str:
                return str(self.socket.getsockname()[0])

        server = Server.remote()  # type: ignore[attr-defined]
        assert ray.get(server.address.remote()) == "127.0.0.1"
        assert [node["NodeManagerAddress"] for node in ray.nodes()] == ["127.0.0.1"]
        assert _listening_addresses() == {"127.0.0.1"}
    finally:
        ray.shutdown()
    assert os.environ.get(CLUSTER_MODE_VARIABLE) == before  # put back for a later real cluster
