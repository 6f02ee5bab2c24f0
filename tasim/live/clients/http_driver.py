"""HTTP agent driver: runs a scenario's agent programs against the frontend's OpenAI API.

Each program is the plan the simulator would run (`tasim.workloads.plan_program`, same seed and
index), made concrete as token ids: a system prompt shared by every program, a task prompt of
its own (or its prompt group's), and per turn the engine's actual output followed by a tool
observation, so prompts grow turn by turn exactly as the engine cached them. Calls go to
``/v1/completions`` as token-id prompts (or as text, ``prompt_format="text"``) with
``x-dynamo-session-id``; tool waits are the plan's latencies divided by ``time_scale``. A
program's client releases it with one ``x-dynamo-session-final`` request (also when a call
failed) as ``workload.release`` says: right after its last call, ``delay_s`` later (scaled like
tool waits; the slot's next program starts meanwhile), or never. The run ends with the last
program's last call, as a simulated one does: releases still due then are not sent.

With ``decisions_url`` (``live.routing: pin``) each call asks the tasim router there for its
worker and goes to the frontend pinned to it (`tasim.live.clients.pinned`), and the session-final goes
to the router alone. With ``observed`` (``live.routing: dynamo-*``) Dynamo's own plug-in routes
and the driver logs what it sees of each call (`tasim.live.clients.observed`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp

from tasim.config.scenario import AgentWorkload, Scenario
from tasim.core.determinism import arrival_rng
from tasim.core.errors import LiveError
from tasim.live.clients.observed import ObservedCalls
from tasim.live.clients.pinned import CallFailed, PinnedCalls, WorkerFailed, completion_request, stream_completion
from tasim.live.clients.tokens import FIRST_TOKEN_ID, PlanTokens
from tasim.workloads import ProgramPlan, plan_program

REQUEST_TIMEOUT_S = 3600.0

PromptFormat = Literal["tokens", "text"]


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One completed call as the client saw it; ``worker`` is what the router reported,
    ``usage`` the OpenAI usage of the reply."""

    program: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    request: str
    worker: str
    max_tokens: int
    usage: dict[str, Any]


@dataclass
class DriverResult:
    programs: int = 0
    requests: int = 0
    failed_requests: int = 0
    session_finals: int = 0
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)  # only with record_calls


# (request id, worker, output token ids, OpenAI usage) of a completed call
_Reply = tuple[str, str, list[int], dict[str, Any]]


class DriverError(LiveError):
    """The scenario cannot be driven live; the message says why."""


def live_workload(scenario: Scenario, programs: int | None) -> tuple[AgentWorkload, int]:
    workload = scenario.workload
    if not isinstance(workload, AgentWorkload):
        raise DriverError(f"the http driver runs agent workloads (workload.kind: agent), not {workload.kind!r}")
    count = programs or workload.programs
    if count is None:
        raise DriverError("live runs need a finite workload: set workload.programs in the scenario or pass --programs")
    return workload, count


class HttpAgentDriver:
    def __init__(
        self,
        base_url: str,
        model_name: str,
        scenario: Scenario,
        vocab_size: int,
        time_scale: float = 1.0,
        programs: int | None = None,
        prompt_format: PromptFormat = "tokens",
        model_path: Path | None = None,
        record_calls: bool = False,
        decisions_url: str | None = None,
        observed: ObservedCalls | None = None,
        worker_names: Callable[[int], str] | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.decisions_url = decisions_url
        self._pinned: PinnedCalls | None = None
        self.observed = observed
        self.worker_names = worker_names
        self.model_name = model_name
        self.scenario = scenario
        self.workload, self.count = live_workload(scenario, programs)
        self.tokens = PlanTokens(scenario.seed, vocab_size)
        self.time_scale = time_scale
        self.prompt_format = prompt_format
        self._detokenize = _detokenizer(model_path) if prompt_format == "text" else None
        self.record_calls = record_calls
        self.result = DriverResult()
        self._later_finals: set[asyncio.Task[None]] = set()

    # --- token content -------------------------------------------------------------------------

    def _plan(self, index: int) -> ProgramPlan:
        return plan_program(self.workload, self.scenario.seed, index, self.scenario.max_context_tokens)

    # --- running -------------------------------------------------------------------------------

    async def run(self) -> DriverResult:
        started = time.perf_counter()
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
            self._session = session
            self._pinned = PinnedCalls(session, self.decisions_url, self.url) if self.decisions_url else None
            try:
                if self.workload.arrival == "closed":
                    indexes = iter(range(self.count))
                    await asyncio.gather(*(self._slot(indexes) for _ in range(min(self.workload.concurrency, self.count))))
                else:
                    await self._poisson()
            finally:
                pending = list(self._later_finals)  # releases not due before the run's end
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                if self._pinned is not None:
                    await self._pinned.close()
        self.result.wall_s = time.perf_counter() - started
        return self.result

    async def _slot(self, indexes: Any) -> None:
        for index in indexes:
            await self._program(index)

    async def _poisson(self) -> None:
        assert self.workload.rate_per_s is not None
        arrivals = arrival_rng(self.scenario.seed)
        tasks = []
        for index in range(self.count):
            await asyncio.sleep(float(arrivals.exponential(1.0 / self.workload.rate_per_s)) / self.time_scale)
            tasks.append(asyncio.create_task(self._program(index)))
        await asyncio.gather(*tasks)

    async def _program(self, index: int) -> None:
        plan = self._plan(index)
        self.result.programs += 1
        headers = {"x-dynamo-session-id": plan.id}
        if plan.group is not None:
            headers["x-dynamo-parent-session-id"] = f"group{plan.group}"
        context = self.tokens.prompt(plan)
        try:
            await asyncio.sleep(plan.setup_s / self.time_scale)
            for turn, step in enumerate(plan.turns):
                if turn:
                    await asyncio.sleep(plan.turns[turn - 1].tool_latency_s / self.time_scale)
                output = await self._call(context, step.output_tokens, headers)
                if output is None:
                    break
                context = context + output + self.tokens.observation(plan, turn)
        finally:
            await self._release(headers, plan.release_after_s)

    async def _release(self, headers: dict[str, str], after_s: float | None) -> None:
        if after_s == 0.0:
            await self._final(headers)
        elif after_s is not None:
            task = asyncio.create_task(self._final_after(headers, after_s / self.time_scale))
            self._later_finals.add(task)
            task.add_done_callback(self._later_finals.discard)

    async def _final_after(self, headers: dict[str, str], wait_s: float) -> None:
        await asyncio.sleep(wait_s)
        await self._final(headers)

    async def _call(self, context: list[int], max_tokens: int, headers: dict[str, str]) -> list[int] | None:
        """One call; its output token ids, or None if it failed (counted, with the error)."""
        program = headers["x-dynamo-session-id"]
        self.result.requests += 1
        body = {
            "model": self.model_name,
            "prompt": self._detokenize(context) if self._detokenize else context,
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
        }
        try:
            if self._pinned is not None:
                reply = await self._pinned.complete(body, context, max_tokens, program, headers.get("x-dynamo-parent-session-id"))
                request, worker, output, usage = reply.call, reply.worker, reply.output_token_ids, reply.usage
            elif self.observed is not None:
                request, worker, output, usage = await self._observed_call(self.observed, body, context, max_tokens, headers)
            else:
                request, worker, output, usage = await self._proxied_call(body, headers)
        except (TimeoutError, aiohttp.ClientError, CallFailed, WorkerFailed, RuntimeError, KeyError, TypeError, ValueError) as exc:
            self.result.failed_requests += 1
            self.result.errors.append(f"{program}: {exc}")
            return None
        if self.record_calls:
            self.result.calls.append(CallRecord(program, context, output, request, worker, max_tokens, usage))
        return output

    async def _proxied_call(self, body: dict[str, Any], headers: dict[str, str]) -> _Reply:
        """Through the tasim router, whose final chunk names the request and worker."""
        async with self._session.post(self.url, json=body | {"nvext": {"extra_fields": ["engine_data"]}}, headers=headers) as reply:
            payload = await reply.json(content_type=None)
            if reply.status != 200:
                raise RuntimeError(f"HTTP {reply.status}: {str(payload)[:200]}")
        proof = payload["nvext"]["engine_data"]["tasim"]
        return proof["request"], proof["worker"], list(proof["output_token_ids"]), payload.get("usage") or {}

    async def _observed_call(
        self, observed: ObservedCalls, body: dict[str, Any], context: list[int], max_tokens: int, headers: dict[str, str]
    ) -> _Reply:
        """A call Dynamo's own plug-in routes; the client logs what it sees of it."""
        request = observed.sent(headers["x-dynamo-session-id"], len(context), max_tokens)
        worker = ""

        async def routed(chunk: dict[str, Any]) -> None:
            nonlocal worker
            instance = ((chunk.get("nvext") or {}).get("worker_id") or {}).get("decode_worker_id")
            assert self.worker_names is not None
            worker = self.worker_names(int(instance)) if instance is not None else "unknown"
            observed.routed(request, worker)

        try:
            reply = await stream_completion(self._session, self.url, completion_request(body, True, ("worker_id",)), headers, routed)
        except BaseException as exc:
            observed.failed(request, worker, f"{type(exc).__name__}: {exc}"[:300])
            raise
        observed.finished(request, worker, *reply.usage_counts(len(context)))
        return request, worker, reply.output_token_ids, reply.usage

    async def _final(self, headers: dict[str, str]) -> None:
        if self._pinned is not None:
            try:
                await self._pinned.end(headers["x-dynamo-session-id"])
                self.result.session_finals += 1
            except (TimeoutError, aiohttp.ClientError, CallFailed) as exc:
                self.result.errors.append(f"{headers['x-dynamo-session-id']}: session-final failed: {exc}")
            return
        body = {"model": self.model_name, "prompt": [FIRST_TOKEN_ID] if not self._detokenize else "end", "max_tokens": 1}
        try:
            async with self._session.post(self.url, json=body, headers={**headers, "x-dynamo-session-final": "true"}) as reply:
                await reply.read()
            self.result.session_finals += 1
            if self.observed is not None:  # Dynamo's plug-in released it (its ThunderAgent runs the final as one token)
                self.observed.released(headers["x-dynamo-session-id"])
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.result.errors.append(f"{headers['x-dynamo-session-id']}: session-final failed: {exc}")


def _detokenizer(model_path: Path | None) -> Any:
    from tokenizers import Tokenizer

    if model_path is None:
        raise DriverError("text prompts need the model folder's tokenizer")
    tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
