"""`DynamoProgramClient` against a scripted HTTP endpoint: the replies a real stack rarely gives
(overload, a router bypass) and verl's extra keyword arguments."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

pytest.importorskip("verl")
from conftest import serve_completions  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from tasim.live.verl.client import DynamoProgramClient, RouterBypassed  # noqa: E402

CONFIG = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "prompt_length": 64, "response_length": 32, "full_determinism": False}}})


def _ok(tokens: list[int]) -> dict[str, Any]:
    return {
        "choices": [{"text": "", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": len(tokens), "prompt_tokens_details": {"cached_tokens": 4}},
        "nvext": {"engine_data": {"tasim": {"request": "p.0", "worker": "w1", "output_token_ids": tokens}}},
    }


async def _serve(replies: list[tuple[int, dict[str, Any]]], seen: list[tuple[dict[str, str], dict[str, Any]]]) -> tuple[web.AppRunner, str]:
    async def completions(request: web.Request) -> web.Response:
        seen.append((dict(request.headers), await request.json()))
        status, body = replies.pop(0)
        return web.json_response(body, status=status)

    return await serve_completions(completions)


def test_generate_retries_overload_and_tolerates_verl_keyword_arguments() -> None:
    seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def go() -> Any:
        runner, url = await _serve([(503, {}), (429, {}), (200, _ok([7, 8, 9]))], seen)
        try:
            client = DynamoProgramClient(CONFIG, url, "m", retry_delay_s=0.01)
            try:
                return await client.generate(
                    "traj-1", prompt_ids=[1, 2, 3, 4, 5], sampling_params={"temperature": 1.0}, mm_processor_output=None, priority=3, future_kwarg=1
                )
            finally:
                await client.close()
        finally:
            await runner.cleanup()

    output = asyncio.run(go())
    assert output.token_ids == [7, 8, 9] and output.stop_reason == "completed"
    assert output.extra_fields["num_cached_tokens"] == 4 and output.extra_fields["worker"] == "w1"
    assert len(seen) == 3  # two retried overloads, then the reply
    headers, body = seen[-1]
    assert headers["x-dynamo-session-id"] == "traj-1"
    # verl's server budget: min(response_length, prompt_length + response_length - prompt)
    assert body == {"model": "m", "prompt": [1, 2, 3, 4, 5], "max_tokens": 32, "nvext": {"extra_fields": ["engine_data"]}, "temperature": 1.0}


def test_session_final_fails_loudly_when_it_reaches_a_worker() -> None:
    seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def go() -> None:
        runner, url = await _serve([(200, {"choices": []}), (200, _ok([5]))], seen)
        try:
            client = DynamoProgramClient(CONFIG, url, "m")
            await client.end_program("traj-1")  # the router answered: no choices
            with pytest.raises(RouterBypassed, match="traj-2.*bypassed"):
                await client.end_program("traj-2")  # a worker answered
            await client.close()
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert [h["x-dynamo-session-final"] for h, _ in seen] == ["true", "true"]


def test_non_retryable_errors_and_exhausted_retries_raise() -> None:
    async def go(replies: list[tuple[int, dict[str, Any]]]) -> str:
        runner, url = await _serve(replies, [])
        try:
            client = DynamoProgramClient(CONFIG, url, "m", max_attempts=2, retry_delay_s=0.01)
            with pytest.raises(RuntimeError) as failure:
                await client.generate("t", prompt_ids=[1], sampling_params={"max_tokens": 4})
            await client.close()
            return str(failure.value)
        finally:
            await runner.cleanup()

    assert "HTTP 400" in asyncio.run(go([(400, {"message": "bad"})]))
    assert "HTTP 503" in asyncio.run(go([(503, {}), (503, {})]))


def test_client_pickles_without_its_session() -> None:
    import pickle

    client = DynamoProgramClient(CONFIG, "http://127.0.0.1:1", "m")
    clone = pickle.loads(pickle.dumps(client))
    assert clone.url == "http://127.0.0.1:1/v1/completions" and clone._session is None


def test_a_call_a_weight_sync_cut_is_reported_aborted_with_its_partial_output() -> None:
    """Dynamo's frontend reports the engine's abort as finish reason "stop"; the router's
    ``aborted`` flag in ``engine_data.tasim`` is what marks the call aborted."""
    cut = _ok([7, 8])
    cut["choices"][0]["finish_reason"] = "stop"
    cut["nvext"]["engine_data"]["tasim"]["aborted"] = True
    stopped = _ok([9])
    stopped["choices"][0]["finish_reason"] = "stop"

    async def go() -> list[Any]:
        runner, url = await _serve([(200, cut), (200, stopped)], [])
        try:
            client = DynamoProgramClient(CONFIG, url, "m")
            try:
                return [await client.generate("traj-1", prompt_ids=[1, 2, 3], sampling_params={}) for _ in range(2)]
            finally:
                await client.close()
        finally:
            await runner.cleanup()

    aborted, completed = asyncio.run(go())
    assert (aborted.token_ids, aborted.stop_reason) == ([7, 8], "aborted")
    assert (completed.token_ids, completed.stop_reason) == ([9], "completed")
