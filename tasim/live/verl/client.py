"""A verl 0.9.1 server client that sends every turn through the Dynamo frontend as part of a
program, so the tasim router (or any program-aware Dynamo router) sees verl trajectories.

It is an `LLMServerClient` (what `AgentLoopManager` hands to every agent loop) whose
``generate(request_id, *, prompt_ids, sampling_params, ...)`` POSTs the token ids to
``/v1/completions`` instead of calling a verl server actor. verl's ``request_id`` is stable for a
trajectory, so it is the program id, sent as ``X-Dynamo-Session-ID`` on every turn; the output
token ids come back in ``nvext.engine_data.tasim``, with the weight version that served them
(verl's ``global_steps``, which its partial-rollout client turns into a trajectory's
min/max version). A call a weight sync cut (the router's
``aborted`` flag there: Dynamo's frontend reports the engine's abort as finish reason "stop")
comes back with the output so far and ``stop_reason="aborted"``, which verl's fully-async client
sends again with that output appended to the prompt. ``end_program`` sends the one
``X-Dynamo-Session-Final: true`` request that releases the program, and fails loudly when its
reply carries choices: then the request reached a model worker, i.e. the router was bypassed.
Keyword arguments verl adds over time (``mm_processor_output``, ``priority``, ...) are accepted
and dropped, unlike the recipe's client, which broke on verl 0.9.1 that way. Transport errors,
408, 429 and 5xx are retried.

With ``decisions_url`` (``live.routing: pin``) every turn asks the tasim router there for its
worker and streams from the frontend pinned to it (`tasim.live.clients.pinned`, which also sends a turn
again when its worker fails), and ``end_program`` tells the router alone.

The client is pickled into every verl agent-loop worker (a Ray actor); its HTTP session is made
lazily in the process and event loop that uses it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from omegaconf import DictConfig
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from tasim.live.clients.pinned import PinnedCalls

RETRYABLE = frozenset({408, 429}) | frozenset(range(500, 600))
FINAL_PROMPT = [3]  # any token: the router answers a session-final without an engine


class RouterBypassed(RuntimeError):
    """A session-final request reached a model worker: the router is not in the path."""


class DynamoProgramClient(LLMServerClient):
    def __init__(
        self,
        config: DictConfig,
        base_url: str,
        model_name: str,
        max_attempts: int = 3,
        retry_delay_s: float = 0.1,
        timeout_s: float = 3600.0,
        decisions_url: str | None = None,
    ) -> None:
        # No load balancer (verl's default, None): every call goes to the Dynamo frontend.
        super().__init__(config)
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.model_name = model_name
        self.max_attempts = max_attempts
        self.retry_delay_s = retry_delay_s
        self.timeout_s = timeout_s
        self.decisions_url = decisions_url
        self._session: aiohttp.ClientSession | None = None
        self._pinned: PinnedCalls | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_session"] = state["_pinned"] = None  # sessions belong to one process and event loop
        return state

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data or video_data or audio_data:
            raise ValueError("DynamoProgramClient sends token ids only; multimodal data is not supported")
        max_tokens = self._max_tokens(len(prompt_ids), sampling_params)
        body = {"model": self.model_name, "prompt": list(prompt_ids), "max_tokens": max_tokens, "nvext": {"extra_fields": ["engine_data"]}}
        for key in ("temperature", "top_p", "min_tokens", "ignore_eos", "stop_token_ids"):
            if sampling_params.get(key) is not None:
                body[key] = sampling_params[key]
        if sampling_params.get("min_tokens") is not None:  # a resumed call's budget shrinks; verl leaves min_tokens as it was
            body["min_tokens"] = min(int(sampling_params["min_tokens"]), max_tokens)
        if self.decisions_url is not None:
            pinned = await self._pinned_calls().complete(body, list(prompt_ids), max_tokens, program=str(request_id))
            return TokenOutput(
                token_ids=pinned.output_token_ids,
                stop_reason="aborted" if pinned.finish_reason == "abort" else "completed",
                # pinned streams bypass the router, which alone knows the weight version; weight syncs
                # with aborts are proxy-mode only, so version 0 is what the workers serve here.
                extra_fields={"global_steps": 0, "num_cached_tokens": pinned.cached_tokens, "worker": pinned.worker},
            )
        reply = await self._post(body, {"x-dynamo-session-id": str(request_id)})
        try:
            proof = reply["nvext"]["engine_data"]["tasim"]
            choice = reply["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"reply for {request_id} lacks choices or nvext.engine_data.tasim (is the tasim router in the path?)") from None
        usage = reply.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return TokenOutput(
            token_ids=list(proof["output_token_ids"]),
            stop_reason="aborted" if proof.get("aborted") or choice.get("finish_reason") == "abort" else "completed",
            extra_fields={"global_steps": int(proof.get("version", 0)), "num_cached_tokens": int(cached), "worker": proof.get("worker")},
        )

    async def end_program(self, program_id: str) -> None:
        """Release the program at the router; call once, after its in-flight turns drained."""
        if self.decisions_url is not None:
            await self._pinned_calls().end(str(program_id))
            return
        headers = {"x-dynamo-session-id": str(program_id), "x-dynamo-session-final": "true"}
        reply = await self._post({"model": self.model_name, "prompt": FINAL_PROMPT, "max_tokens": 1}, headers)
        if reply.get("choices"):
            raise RouterBypassed(f"session-final for {program_id} reached a model worker: the router was bypassed")

    async def close(self) -> None:
        """Close this process's HTTP session (verl's workers keep theirs for their lifetime)."""
        if self._pinned is not None:
            await self._pinned.close()
        if self._session is not None and not self._session.closed:
            await self._session.close()

    def _pinned_calls(self) -> PinnedCalls:
        assert self.decisions_url is not None
        session = self._http()
        if self._pinned is None or self._pinned.session is not session:
            self._pinned = PinnedCalls(session, self.decisions_url, self.url)
        return self._pinned

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s), connector=aiohttp.TCPConnector(limit=0))
        return self._session

    def _max_tokens(self, prompt_tokens: int, sampling_params: dict[str, Any]) -> int:
        if sampling_params.get("max_tokens"):
            return int(sampling_params["max_tokens"])
        # verl's servers cap a turn at the rollout's response budget left after the prompt.
        rollout = self.config.actor_rollout_ref.rollout
        prompt_length: int = rollout.prompt_length
        response_length: int = rollout.response_length
        return max(1, min(response_length, prompt_length + response_length - prompt_tokens))

    async def _post(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        session = self._http()
        for attempt in range(1, self.max_attempts + 1):
            try:
                async with session.post(self.url, json=body, headers=headers) as response:
                    if response.status in RETRYABLE and attempt < self.max_attempts:
                        await response.read()
                    elif response.status != 200:
                        raise RuntimeError(f"{self.url}: HTTP {response.status}: {(await response.text())[:300]}")
                    else:
                        return await response.json(content_type=None) or {}
            except (TimeoutError, aiohttp.ClientConnectionError):
                if attempt == self.max_attempts:
                    raise
            await asyncio.sleep(self.retry_delay_s * attempt)
        raise AssertionError("unreachable")


class PartialRolloutDynamoClient(FullyAsyncLLMServerClient, DynamoProgramClient):
    """verl 0.9.1's partial-rollout client (what its asynchronous trainers hand the agent loops)
    over the Dynamo transport: its ``generate`` loop calls `DynamoProgramClient.generate`, and when
    a weight sync cuts a call (``stop_reason="aborted"``) waits 1 s and sends the prompt plus the
    output so far for the tokens still to come, so the loop sees one whole turn."""

    def __init__(self, config: DictConfig, base_url: str, model_name: str, **kwargs: Any) -> None:
        # FullyAsyncLLMServerClient's own __init__ would hand DynamoProgramClient a load balancer.
        DynamoProgramClient.__init__(self, config, base_url, model_name, **kwargs)
        self._only_hybrid = False  # no load balancer to wait on: the router holds calls in a sync
