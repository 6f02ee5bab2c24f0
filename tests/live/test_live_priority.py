"""How a call's priority reaches a worker, checked on the real Dynamo frontend.

A priority-setting policy (Autellix) runs live on vLLM workers only: tasim puts a call's
priority p (lower first) into the request's ``routing.priority`` as -p, since Dynamo 1.6.1's
vLLM worker runs a call at vLLM priority ``-routing.priority`` (``dynamo/vllm/handlers.py``).
In proxy mode the router writes the field itself; in pin mode the client sends the
``x-dynamo-request-priority`` header that the router hands out, and the frontend must copy it
into ``routing.priority`` unchanged. That copy is what this test checks, on the frontend in
front of a router that records the requests it is given. No vLLM worker runs on this machine,
so the last hop is read from Dynamo's source, not run.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from tasim.config.scenario import load_scenario
from tasim.live.router.decisions import PRIORITY_HEADER
from tasim.live.stack.launcher import LiveStack

pytest.importorskip("dynamo.llm")
pytestmark = [pytest.mark.processes, pytest.mark.slow]

SCENARIO = REPO / "scenarios" / "live-mocker.yaml"

# The tasim router, recording the routing field of every request the frontend gives it.
RECORDING_ROUTER = """
import json, sys
import tasim.live.router.service as router

generate = router._Router.generate

async def recorded(self, request, context=None):
    with open({record!r}, "a") as out:
        out.write(json.dumps(request.get("routing")) + "\\n")
    async for chunk in generate(self, request, context):
        yield chunk

router._Router.generate = recorded
sys.exit(router.main())
"""


def test_the_frontend_copies_the_priority_header_into_routing_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "routing.jsonl"
    script = tmp_path / "recording_router.py"
    script.write_text(RECORDING_ROUTER.format(record=str(record)))
    spawn = LiveStack._spawn

    def spawn_recording(self: LiveStack, name: str, args: list[str], env: dict[str, str] | None = None) -> Any:
        if name == "router":
            args = [sys.executable, str(script), args[-1]]
        return spawn(self, name, args, env)

    monkeypatch.setattr(LiveStack, "_spawn", spawn_recording)
    with LiveStack(load_scenario(SCENARIO), workdir=tmp_path / "stack") as stack:
        stack.begin_run()
        for program, headers in (("a", {PRIORITY_HEADER: "-3"}), ("b", {})):
            body = {"model": stack.model_name, "prompt": list(range(1, 40)), "max_tokens": 2}
            request = urllib.request.Request(
                f"{stack.base_url}/v1/completions",
                data=json.dumps(body).encode(),
                headers={"content-type": "application/json", "x-dynamo-session-id": program, **headers},
            )
            with urllib.request.urlopen(request, timeout=60) as reply:
                assert reply.status == 200
        stack.end_run()
    routings = [json.loads(line) for line in record.read_text().splitlines()]
    assert [r.get("priority") for r in routings] == [-3, None]
