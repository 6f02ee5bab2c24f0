"""A weight sync that aborts, on a real stack (Dynamo frontend + tasim router in proxy mode +
mocker workers), as verl 0.9.1 syncs: ``POST /v1/weight_sync/begin {"abort": true}`` cuts the
call streaming, whose client (`DynamoProgramClient`) gets the output so far as an aborted call;
its retry (prompt plus that output) and a new call made during the sync wait at the router until
the sync ends, and then complete. Nothing is left in the router, and no request id is used twice.
verl's own `FullyAsyncLLMServerClient` loop over the same transport (`PartialRolloutDynamoClient`)
resumes a cut turn; each reply names the weight version that served it; the trainer's report of
a sampled group is logged; a client that hangs up mid-stream still stops its call at the worker."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

pytest.importorskip("dynamo.llm")
pytest.importorskip("verl")
from conftest import REPO  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from tasim.config.scenario import load_scenario  # noqa: E402
from tasim.core import events as ev  # noqa: E402
from tasim.live.run import finite_scenario  # noqa: E402
from tasim.live.stack.launcher import LiveStack  # noqa: E402
from tasim.live.verl.client import DynamoProgramClient, PartialRolloutDynamoClient  # noqa: E402
from tasim.results.eventlog import EVENTS_PLAIN, read_events  # noqa: E402

pytestmark = [pytest.mark.processes, pytest.mark.slow]

LONG = 800  # output tokens of the call the sync cuts: several seconds on the mocker
ROLLOUT = {"name": "vllm", "prompt_length": 256, "response_length": LONG, "full_determinism": False}
CONFIG = OmegaConf.create({"actor_rollout_ref": {"rollout": ROLLOUT}})
SAMPLING = {"ignore_eos": True}


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer: dict[str, Any] = json.loads(reply.read())
        return answer


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    scenario = finite_scenario(load_scenario(REPO / "scenarios" / "live-mocker.yaml", ["policy.name=round_robin", "policy.params={}"]), None)
    workdir = tmp_path_factory.mktemp("abort")
    with LiveStack(scenario, workdir=workdir / "stack", events_path=workdir / EVENTS_PLAIN) as live:
        yield live


def test_an_aborting_sync_cuts_the_call_and_its_retry_waits_for_the_end(stack: LiveStack) -> None:
    sync = f"{stack.status_url}/v1/weight_sync"
    prompt = list(range(10, 110))

    async def go() -> dict[str, Any]:
        client = DynamoProgramClient(CONFIG, stack.base_url, stack.model_name)
        try:
            first = asyncio.ensure_future(client.generate("A", prompt_ids=prompt, sampling_params={"max_tokens": LONG, **SAMPLING}))
            while not stack.status()["requests"]["in_flight"]:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # some tokens stream
            began = await asyncio.to_thread(_post, f"{sync}/begin", {"version": 1, "abort": True})
            cut = await asyncio.wait_for(first, 30)
            # verl's retry: prompt plus partial output, for the tokens still to come; and a new call
            rest = {"max_tokens": LONG - len(cut.token_ids), **SAMPLING}
            retry = asyncio.ensure_future(client.generate("A", prompt_ids=prompt + cut.token_ids, sampling_params=rest))
            while not stack.status()["requests"]["in_flight"]:
                await asyncio.sleep(0.05)
            other = asyncio.ensure_future(client.generate("B", prompt_ids=list(range(500, 600)), sampling_params={"max_tokens": 8, **SAMPLING}))
            while stack.status()["requests"]["in_flight"] < 2:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            during = stack.status()["requests"]
            waited = not retry.done() and not other.done()
            ended = await asyncio.to_thread(_post, f"{sync}/end", {"version": 1})
            retried, new = await asyncio.wait_for(asyncio.gather(retry, other), 60)
            for program in ("A", "B"):
                await client.end_program(program)
        finally:
            await client.close()
        return {"began": began, "cut": cut, "during": during, "waited": waited, "ended": ended, "retried": retried, "new": new}

    stack.begin_run()
    out = asyncio.run(go())
    status = stack.status()
    stack.end_run()
    cut, retried = out["cut"], out["retried"]
    assert out["began"] == {"version": 1, "began": True, "aborted": 1}
    assert cut.stop_reason == "aborted" and 0 < len(cut.token_ids) < LONG and cut.extra_fields["worker"] in ("w0", "w1")
    assert out["waited"] and out["during"]["in_flight"] == 2  # routed, held at the router until the end
    assert out["ended"] == {"version": 1, "ended": True, "released": 0}
    assert retried.stop_reason == "completed" and len(cut.token_ids) + len(retried.token_ids) == LONG
    assert out["new"].stop_reason == "completed" and len(out["new"].token_ids) == 8
    # each reply names the weight version that served it (verl's global_steps)
    assert [r.extra_fields["global_steps"] for r in (cut, retried, out["new"])] == [0, 1, 1]
    # Nothing leaked.
    assert status["programs"]["live"] == 0 and status["programs"]["table"] == {}
    assert status["requests"] == {"in_flight": 0, "finished": 2, "failed": 0, "retried": 0, "refused": 0, "session_finals": 2}
    events = list(read_events(Path(stack.events_path)))
    retries = [e for e in events if isinstance(e, ev.RequestRetried)]
    assert [(e.request, e.program, e.worker, e.output_tokens) for e in retries] == [("A.0", "A", cut.extra_fields["worker"], len(cut.token_ids))]
    arrived = [e.request for e in events if isinstance(e, ev.RequestArrived)]
    assert arrived == ["A.0", "A.0r2", "B.0"] and len(set(arrived)) == len(arrived)
    finished = {e.request: e for e in events if isinstance(e, ev.RequestFinished)}
    assert sorted(finished) == ["A.0r2", "B.0"]
    assert (finished["A.0r2"].prompt_tokens, finished["A.0r2"].output_tokens) == (len(prompt) + len(cut.token_ids), LONG - len(cut.token_ids))
    sync_end = next(e.t for e in events if isinstance(e, ev.WeightSyncFinished))
    firsts = {e.request: e.t for e in events if isinstance(e, ev.FirstToken)}
    assert firsts["A.0"] < sync_end <= min(firsts["A.0r2"], firsts["B.0"])  # the gate held both until the end
    programs = [(e.program, e.completed) for e in events if isinstance(e, ev.ProgramFinished)]
    assert sorted(programs) == [("A", True), ("B", True)]
    assert stack.alive() == ["worker0", "worker1", "router", "frontend"]


def test_verls_fully_async_client_resumes_a_cut_call_after_the_sync(stack: LiveStack) -> None:
    """One ``generate`` of verl's `FullyAsyncLLMServerClient`: the sync cuts the first call, the
    loop sends prompt plus partial output 1 s later, the router holds it until the end, and the
    turn's whole output comes back as one."""
    sync = f"{stack.status_url}/v1/weight_sync"
    prompt = list(range(300, 400))

    async def go() -> tuple[Any, dict[str, Any], dict[str, Any]]:
        client = PartialRolloutDynamoClient(CONFIG, stack.base_url, stack.model_name)
        try:
            turn = asyncio.ensure_future(client.generate("D", prompt_ids=prompt, sampling_params={"max_tokens": LONG, **SAMPLING}))
            while not stack.status()["requests"]["in_flight"]:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            began = await asyncio.to_thread(_post, f"{sync}/begin", {"version": 2, "abort": True})
            await asyncio.sleep(2.0)  # verl's client waits 1 s, then its retry waits at the router
            assert not turn.done() and stack.status()["requests"]["in_flight"] == 1
            await asyncio.to_thread(_post, f"{sync}/end", {"version": 2})
            output = await asyncio.wait_for(turn, 60)
            await client.end_program("D")
        finally:
            await client.close()
        return output, began, stack.status()

    before = stack.status()["requests"]
    output, began, status = asyncio.run(go())
    assert began == {"version": 2, "began": True, "aborted": 1}
    assert len(output.token_ids) == LONG and output.stop_reason == "length"
    # begun under version 1 (the test before synced it), finished under 2: what verl tags the trajectory with
    assert (output.extra_fields["min_global_steps"], output.extra_fields["max_global_steps"]) == (1, 2)
    assert status["programs"]["table"] == {}
    counts = {key: status["requests"][key] - before[key] for key in ("in_flight", "finished", "failed", "session_finals")}
    assert counts == {"in_flight": 0, "finished": 1, "failed": 0, "session_finals": 1}  # the cut call is neither


def test_a_sampled_group_mark_is_taken_and_a_bad_one_refused(stack: LiveStack) -> None:
    """The trainer's report of a group it took (the event it logs is checked end to end in
    tests/live/verl/test_colocate_async.py)."""
    mark = f"{stack.status_url}/run/mark"
    taken = _post(mark, {"kind": "group_sampled", "step": 3, "group": "s1.4", "min_version": 1, "max_version": 2})
    assert set(taken) == {"t"}
    with pytest.raises(urllib.error.HTTPError) as refused:
        _post(mark, {"kind": "group_sampled", "step": 3, "group": "s1.5", "min_version": "one"})
    assert refused.value.code == 400
    message = json.loads(refused.value.read())["error"]
    assert message.startswith("bad mark: ") and "min_version: int" in message
    with pytest.raises(urllib.error.HTTPError) as nameless:
        _post(mark, {"kind": "group_sampled", "step": 3, "min_version": 1, "max_version": 2})
    assert nameless.value.code == 400 and "names its group" in json.loads(nameless.value.read())["error"]


def test_a_client_gone_mid_stream_stops_its_call_at_the_worker(stack: LiveStack) -> None:
    """Each forwarded call runs under a Dynamo context of the router's own; a client that hangs
    up still stops the engine (the worker hears the cancellation) and fails the call."""
    logs = [Path(stack.workdir) / f"worker{i}.log" for i in (0, 1)]
    before = _cancellations(logs)

    async def go() -> None:
        body = {"model": stack.model_name, "prompt": list(range(700, 800)), "max_tokens": LONG, "stream": True, "ignore_eos": True}
        url = f"{stack.base_url}/v1/completions"
        async with aiohttp.ClientSession() as session, session.post(url, json=body, headers={"x-dynamo-session-id": "C"}) as reply:
            for _ in range(20):
                await reply.content.readline()
        # leaving the block closes the connection mid-stream

    asyncio.run(go())
    deadline = time.monotonic() + 10
    while (stack.status()["requests"]["in_flight"] or _cancellations(logs) == before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stack.status()["requests"]["in_flight"] == 0 and stack.status()["requests"]["failed"] == 1
    assert _cancellations(logs) == before + 1


def _cancellations(logs: list[Path]) -> int:
    return sum(log.read_text().count("request cancellation received") for log in logs)


def test_a_call_cut_on_one_frontend_is_retried_and_finalised_through_another(stack: LiveStack) -> None:
    """verl-recipe #144's concern: a retry re-routed through another frontend, and the program
    finalised there. The program table is the router's, whichever frontend a call comes through,
    so the program ends once, completed, and nothing is left."""
    sync = f"{stack.status_url}/v1/weight_sync"
    other_url = stack.add_frontend("frontend2", "round-robin")
    deadline = time.monotonic() + 60
    while f'"{stack.model_name}"' not in urllib.request.urlopen(f"{other_url}/v1/models", timeout=10).read().decode():
        assert time.monotonic() < deadline, "the second frontend never listed the router's model"
        time.sleep(0.2)
    prompt = list(range(900, 1000))

    async def go() -> tuple[Any, Any, dict[str, Any]]:
        here = DynamoProgramClient(CONFIG, stack.base_url, stack.model_name)
        there = DynamoProgramClient(CONFIG, other_url, stack.model_name)
        try:
            first = asyncio.ensure_future(here.generate("E", prompt_ids=prompt, sampling_params={"max_tokens": LONG, **SAMPLING}))
            while not stack.status()["requests"]["in_flight"]:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(_post, f"{sync}/begin", {"version": 4, "abort": True})
            cut = await asyncio.wait_for(first, 30)
            rest_params = {"max_tokens": LONG - len(cut.token_ids), **SAMPLING}
            retry = asyncio.ensure_future(there.generate("E", prompt_ids=prompt + cut.token_ids, sampling_params=rest_params))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(_post, f"{sync}/end", {"version": 4})
            rest = await asyncio.wait_for(retry, 60)
            await there.end_program("E")
        finally:
            await here.close()
            await there.close()
        return cut, rest, stack.status()

    before = stack.status()["requests"]
    cut, rest, status = asyncio.run(go())
    assert cut.stop_reason == "aborted" and rest.stop_reason == "completed"
    assert len(cut.token_ids) + len(rest.token_ids) == LONG
    assert status["programs"]["table"] == {} and status["programs"]["live"] == 0
    counts = {key: status["requests"][key] - before[key] for key in ("in_flight", "finished", "failed", "session_finals")}
    assert counts == {"in_flight": 0, "finished": 1, "failed": 0, "session_finals": 1}  # the cut call is neither
