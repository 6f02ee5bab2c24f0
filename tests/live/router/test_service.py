"""`tasim.live.router.service`: a proxied call carries its priority where Dynamo's vLLM worker reads it."""

from __future__ import annotations

import pytest

# the live extra
pytest.importorskip("msgpack")
pytest.importorskip("zmq")
pytest.importorskip("xxhash")


def test_a_proxied_call_carries_its_priority_where_dynamos_vllm_worker_reads_it() -> None:
    from tasim.live.router.service import prioritized

    request = {"token_ids": [1, 2], "routing": {"priority_jump": 0.0}}
    # queue 3 of a priority policy (lower first) -> routing.priority -3 -> vLLM priority 3
    assert prioritized(request, 3) == {"token_ids": [1, 2], "routing": {"priority_jump": 0.0, "priority": -3}}
    assert prioritized({"token_ids": [1]}, 1) == {"token_ids": [1], "routing": {"priority": -1}}
    assert prioritized(request, 0) is request  # no priority: the request as the frontend sent it
    assert request == {"token_ids": [1, 2], "routing": {"priority_jump": 0.0}}  # never changed in place
