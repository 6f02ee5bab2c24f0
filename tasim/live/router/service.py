"""The tasim router: a Dynamo component that serves a tasim policy between the Dynamo frontend
and Dynamo workers (``python -m tasim.live.router.service CONFIG.json``; `tasim.live.stack.launcher` starts it).

It registers the public model name with the frontend (workers sit under an internal name, so
traffic for the public name always passes here), subscribes to every worker's KV events, and
for each preprocessed request reads the program from ``agent_context`` (the frontend's mapping of
``x-dynamo-session-id``), lets `PolicyHost` decide, forwards the request unchanged to the chosen
worker instance and streams the reply back. A ``session_final`` request ends the program and
never reaches an engine (one for a program the router does not know succeeds as well). A session
id the host refuses (longer than `MAX_PROGRAM_ID_CHARS`) is answered with Dynamo's
``InvalidArgument``, which the frontend turns into HTTP 400 with the message. The final chunk
carries ``engine_data.tasim`` (request id, worker, the output token ids) for clients that ask for
``nvext.extra_fields: ["engine_data"]``.

Workers are named ``w0 … wN-1``; `tasim.live.router.membership` learns which Dynamo instance is which
and watches them. A call whose worker is lost under it (the connection fails, or the stream breaks
off: Dynamo's ``Unavailable``) is sent again on another worker, up to ``live.max_retries`` times,
with the output already streamed appended to its prompt, so the client sees one uninterrupted
reply (as Dynamo's request migration does); the policy has meanwhile heard of the lost worker and
placed its programs elsewhere. With no worker serving, calls get HTTP 503 (Dynamo's frontend
shows no message for a 5xx; the router's log and status name the lost workers). Status (JSON)
and Prometheus metrics are served over HTTP on 127.0.0.1, as are
``POST /run/start`` and ``POST /run/end``, which bracket the measured run in the event log
(otherwise it starts at the first request and ends at shutdown); ``POST /run/mark`` logs the RL
step boundaries a rollout driver reports, ``POST /caches/clear`` empties the workers'
prefix caches as a weight update does, and ``POST /v1/weight_sync/begin|end`` bracket a
trainer's weight update for the policy (`tasim.live.router.decisions`).

A weight sync begun with ``abort: true`` does at the router what verl 0.9.1 does at its servers:
every call streaming is stopped at its worker (Dynamo's stop-generating, which the engine
honours) and ends for its client with the output streamed so far, a last chunk with finish reason
``cancelled`` and ``engine_data.tasim.aborted: true``: Dynamo 1.6.1's frontend reports an
engine's ``cancelled`` as ``"stop"`` on /v1/completions, so the abort travels in the
``engine_data`` answer (``nvext.engine_data.tasim``) only. The host logs the call as retried
with the tokens it generated; the client's retry is the turn's next call. Calls routed until the
sync ends wait at the router (verl's closed gate) and reach their workers in arrival order.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from tasim.config.scenario import Scenario
from tasim.config.workers import cluster_view
from tasim.core import events as ev
from tasim.hosting.policy_host import build_policy, run_header
from tasim.live.router.decisions import Decisions, decision_app, routing_priority, serve_app
from tasim.live.router.kv_events import KvEvent, KvEventSubscriber
from tasim.live.router.live_host import Call, Held, InvalidProgramId, NoWorkerServing, PolicyHost
from tasim.live.router.membership import Membership
from tasim.live.router.status import prometheus_text, status_snapshot
from tasim.results.eventlog import EventWriter

logger = logging.getLogger("tasim.live.router.service")

MARKS = ("rollout_started", "rollout_finished", "training_started", "training_finished", "group_sampled")
CLEAR_DISCOVERY_S = 2.0  # how long to look for the workers' clear_kv_blocks endpoint


class RouterConfig(BaseModel):
    """Everything the router process needs; written by the stack launcher as JSON."""

    model_config = ConfigDict(extra="forbid")

    scenario: dict[str, Any]
    namespace: str = "dynamo"
    worker_endpoint: str = "backend.generate"
    model_name: str
    model_path: str
    kv_event_endpoints: list[str]
    events_path: str
    status_port: int
    time_scale: float = 1.0


class _Router:
    def __init__(self, config: RouterConfig, runtime: Any) -> None:
        self.config = config
        self.runtime = runtime
        self.scenario = Scenario.model_validate(config.scenario)
        self.view = cluster_view(self.scenario)
        if len(config.kv_event_endpoints) != len(self.view.workers):
            raise ValueError(f"{len(config.kv_event_endpoints)} KV event endpoints for {len(self.view.workers)} workers")
        self.block_size = self.view.workers[0].block_size
        policy = build_policy(self.scenario, self.view)
        self.writer = EventWriter(Path(config.events_path))
        self._t0 = time.monotonic()
        self.host = PolicyHost(
            policy, self._now, self._emit, self.block_size, self.scenario.metrics.log_kv_events, self.scenario.live.program_idle_ttl_s
        )
        self.kv = KvEventSubscriber(dict(zip(self.view.worker_ids, config.kv_event_endpoints)), self._on_kv_event)
        self.members: Membership | None = None
        live = self.scenario.live
        ttl = live.program_idle_ttl_s / config.time_scale if live.program_idle_ttl_s is not None else None
        self.streaming: set[_Reply] = set()  # attempts streaming now, which a weight sync may cut
        cut = self.cut_streams if live.routing == "proxy" else None
        self.decisions = Decisions(
            self.host, lambda worker: self.instance_of.get(worker), self._confirm_lost, live.max_retries, ttl, self.begin_run, cut
        )
        self._watch_task: asyncio.Task[None] | None = None
        self.client: Any = None
        self.ready = False
        self.running = False
        self.ended = False
        self._tick_task: asyncio.Task[None] | None = None
        self._without_clear_endpoint: set[int] = set()  # worker instances that serve no clear_kv_blocks

    def mark(self, kind: str, step: int, trajectories: int = 0, group: str = "", versions: tuple[int, int] = (0, 0)) -> ev.Event:
        """Log an RL step boundary the driver reports (``POST /run/mark``); ``group_sampled``
        names the GRPO group the trainer took and the weight versions its calls were served by."""
        self.begin_run()
        now = self._now()
        if kind == "rollout_started":
            event: ev.Event = ev.RolloutStarted(now, step, trajectories)
        elif kind == "rollout_finished":
            event = ev.RolloutFinished(now, step)
        elif kind == "training_started":
            event = ev.TrainingStarted(now, step)
        elif kind == "training_finished":
            event = ev.TrainingFinished(now, step)
        elif kind == "group_sampled":
            if not group:
                raise ValueError("group_sampled names its group")
            event = ev.GroupSampled(now, step, group, *versions)
        else:
            raise ValueError(f"unknown kind {kind!r}")
        self._emit(event)
        return event

    def _proof(self, call: Call, output: list[int]) -> dict[str, Any]:
        """What ``engine_data.tasim`` tells the client of its call: ``version`` is the weight
        version the workers served it with (the last sync ended; 0 before any), which verl's
        servers report as ``global_steps`` for its off-policy accounting."""
        version = self.host.synced_version or 0
        return {"request": call.spec.id, "worker": call.worker, "held_s": call.held_s, "output_token_ids": output, "version": version}

    def _emit(self, event: ev.Event) -> None:
        if self.running:  # the log holds the measured run only: RunStarted ... RunEnded
            self.writer.write(event)

    def _now(self) -> float:
        return (time.monotonic() - self._t0) * self.config.time_scale

    # --- start-up ------------------------------------------------------------------------------

    async def start(self) -> None:
        endpoint = self.runtime.endpoint(f"{self.config.namespace}.{self.config.worker_endpoint}")
        self.client = await endpoint.client()
        subscribed = asyncio.Event()
        self._kv_task = asyncio.create_task(self.kv.run(subscribed))
        await subscribed.wait()
        await asyncio.sleep(0.5)  # ZMQ subscriptions take a moment to reach the publishers
        self.members = Membership(self.client, self.view.worker_ids, self.block_size, self.config.model_name, self.host, self.kv)
        await self.members.map_all()
        self._watch_task = asyncio.create_task(self.members.watch())
        self.ready = True

    @property
    def instance_of(self) -> dict[str, int]:
        return self.members.instance_of if self.members else {}

    async def _confirm_lost(self, worker: str, instance: int, reason: str) -> None:
        """A pinned call failed on ``instance`` (its client says): lose the worker if it does
        not answer a probe."""
        if self.members is not None:
            await self.members.confirm(worker, instance, reason)

    def begin_run(self) -> None:
        """Start the clock and the log: on ``POST /run/start``, or at the first request."""
        if self.running or self.ended:
            return
        self._t0 = time.monotonic()
        self.writer.write(run_header(self.scenario, self.view))
        if self.host.policy.tick_interval_s:
            self._tick_task = asyncio.create_task(self._ticks(self.host.policy.tick_interval_s))
        self.running = True

    def end_run(self) -> None:
        """End the log: on ``POST /run/end`` (the driver is done), or at shutdown."""
        if not self.running:
            return
        self.running, self.ended = False, True
        if self._tick_task is not None:
            self._tick_task.cancel()
        self.writer.write(ev.RunEnded(self._now(), 0, self.host.in_flight))
        self.writer.flush()

    def _on_kv_event(self, worker: str, event: KvEvent) -> None:
        if self.members is not None and event.kind == "stored":
            self.members.stored(worker, event.blocks)
        if self.ready:
            self.host.kv_event(worker, event)

    async def _ticks(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s / self.config.time_scale)
            self.host.tick()
            self.decisions.expire_unreported()

    # --- requests ------------------------------------------------------------------------------

    async def generate(self, request: dict[str, Any], context: Any = None) -> AsyncIterator[dict[str, Any]]:
        self.begin_run()
        agent = request.get("agent_context") or {}
        program = agent.get("session_id") or None
        if program is not None and agent.get("session_final"):
            self.host.session_final(program)
            return
        token_ids = list(request.get("token_ids") or ())
        max_tokens = int((request.get("stop_conditions") or {}).get("max_tokens") or 0)
        try:
            call = await admitted(self.host, self.host.decide(program, token_ids, max_tokens, agent.get("parent_session_id") or None), context)
        except InvalidProgramId as exc:
            raise _dynamo_error("InvalidArgument", str(exc)) from None
        except NoWorkerServing as exc:
            raise _dynamo_error("WorkerUnavailable", str(exc)) from None
        if call is None:
            return
        async for chunk in self._forward(call, request, context):
            yield chunk

    async def _forward(self, call: Call, request: dict[str, Any], context: Any) -> AsyncIterator[dict[str, Any]]:
        """Stream the reply from the call's worker. If the worker is lost under it, the call
        goes on where it broke off, on the worker the policy picks next."""
        assert self.members is not None
        reply = _Reply(list(request.get("token_ids") or ()), dict(request.get("stop_conditions") or {}))
        attempt = request
        for retries in itertools.count():
            instance = self.members.instance_of[call.worker]
            try:
                async with contextlib.aclosing(self._stream(call, attempt, instance, reply)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                break
            except BaseException as exc:
                if reply.aborted and isinstance(exc, Exception):  # the cut stream ended in an error
                    break
                if not (_worker_lost(exc) and retries < self.scenario.live.max_retries):
                    self.host.fail(call, "cancelled" if isinstance(exc, (asyncio.CancelledError, GeneratorExit)) else f"error: {exc}")
                    raise
                self.members.lose(call.worker, instance, str(exc))
                reason = f"worker {call.worker} lost: {exc}"
            if reply.complete:  # every token came; only the stream's end was lost
                yield reply.end(self._proof(call, reply.output))
                break
            try:
                admission = self.host.retry(call, reply.prompt + reply.output, reply.rest_of(), reason)
            except NoWorkerServing as exc:  # the host failed the call
                raise _dynamo_error("WorkerUnavailable", str(exc)) from None
            resent = await admitted(self.host, admission, context)
            if resent is None:  # the client went away while the retry was held
                return
            call, attempt = resent, reply.next_attempt(request)
        if reply.aborted:
            self.host.aborted_by_sync(call, len(reply.output) - reply.carried)
            yield reply.cut(self._proof(call, reply.output))
            return
        if not reply.finished:
            self.host.fail(call, "stream ended without a finish reason")
            return
        self.host.finish(call, *reply.engine_usage(call.spec.prompt_tokens))

    def cut_streams(self) -> int:
        """Stop every attempt streaming now (a weight sync with abort); the number stopped."""
        cut = 0
        for reply in self.streaming:
            if not (reply.aborted or reply.finished):  # a reply whose last chunk came is complete
                reply.aborted = True
                reply.context.stop_generating()
                cut += 1
        return cut

    async def _stream(self, call: Call, request: dict[str, Any], instance: int, reply: _Reply) -> AsyncGenerator[dict[str, Any], None]:
        """One attempt: the worker's chunks, recorded in ``reply``; it waits first while a
        weight sync holds calls. A cut ends it at once (chunks still under way are dropped)."""
        from dynamo.runtime import Context  # the router process has Dynamo; importers of this module need not

        if not self.host.gate.is_set():
            await self.host.gate.wait()
        reply.context = Context()
        self.streaming.add(reply)
        try:
            first = True
            async for chunk in await self.client.direct(prioritized(request, call.priority), instance, annotated=False, context=reply.context):
                if reply.aborted:
                    return
                if isinstance(chunk, dict):
                    tokens = chunk.get("token_ids") or ()
                    if tokens and first:
                        first = False
                        self.host.call_first_token(call)
                    reply.add(chunk, tokens)
                    if reply.finished:
                        chunk["engine_data"] = {**(chunk.get("engine_data") or {}), "tasim": self._proof(call, reply.output)}
                        if chunk.get("completion_usage"):
                            chunk["completion_usage"] = reply.client_usage()
                yield chunk
        finally:
            self.streaming.discard(reply)
            if not reply.finished:  # cut, broken off or given up: the engine stops too
                reply.context.stop_generating()

    # --- status and shutdown -------------------------------------------------------------------

    async def clear_caches(self) -> dict[str, Any]:
        """Empty every worker's prefix cache, as after a weight update, through the workers'
        ``clear_kv_blocks`` endpoint (Dynamo's vLLM and SGLang workers serve it; the mocker
        does not). The workers then publish the removals, which reach the policy as usual."""
        endpoint = self.runtime.endpoint(f"{self.config.namespace}.{self.config.worker_endpoint.split('.')[0]}.clear_kv_blocks")
        client = await endpoint.client()
        # Wait for the endpoint of workers not looked for yet; one that served none after a
        # whole wait (the mocker) is not waited for again at the next weight update.
        unknown = set(self.instance_of.values()) - self._without_clear_endpoint
        deadline = time.monotonic() + CLEAR_DISCOVERY_S
        while not unknown <= set(client.instance_ids()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        served = set(client.instance_ids())
        self._without_clear_endpoint |= unknown - served
        replies: dict[str, Any] = {}
        for worker, instance in sorted(self.instance_of.items()):
            if instance not in served:
                replies[worker] = {"status": "unsupported", "message": "the worker serves no clear_kv_blocks endpoint"}
                continue
            async for reply in await client.direct({}, instance, annotated=False):
                replies[worker] = reply
        return {"cleared": all(r.get("status") == "success" for r in replies.values()), "workers": replies}

    def status(self) -> dict[str, Any]:
        return status_snapshot(self)

    def close(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
        if self.members is not None:
            self.members.close()
        self.end_run()
        self.writer.close()


async def admitted(host: PolicyHost, admission: Call | Held, context: Any) -> Call | None:
    """The routed call: at once, or when the policy resumes its program; None if the client
    went away while it was held. A held call given up (the client left, or the request's task
    was cancelled) is rolled back by the host, so a later resume routes nothing for it."""
    if isinstance(admission, Call):
        return admission
    waiting = asyncio.ensure_future(host.wait(admission))
    if context is None:
        return await waiting  # cancelling this await cancels the wait too
    stopped = asyncio.ensure_future(context.async_killed_or_stopped())
    try:
        await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        await _give_up(host, waiting)
        raise
    finally:
        stopped.cancel()
    if not waiting.done():  # the client went away while its call was held
        await _give_up(host, waiting)
        return None
    return waiting.result()


async def _give_up(host: PolicyHost, waiting: asyncio.Future[Call]) -> None:
    """Give up a held call: the host rolls it back, or fails it if it was routed already."""
    if waiting.done():
        if not waiting.cancelled() and waiting.exception() is None:
            host.fail(waiting.result(), "cancelled before it was forwarded")
        return
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)


@dataclass(eq=False)  # kept in a set by identity
class _Reply:
    """One client call's reply across attempts: the output so far, and the engine's usage of
    the current attempt, whose prompt holds the ``carried`` output tokens of earlier ones."""

    prompt: list[int]
    stop: dict[str, Any]
    output: list[int] = field(default_factory=list)
    carried: int = 0
    usage: dict[str, Any] = field(default_factory=dict)
    finished: bool = False
    context: Any = None  # the current attempt's Dynamo context, which stops it at its worker
    aborted: bool = False  # a weight sync cut it

    @property
    def max_tokens(self) -> int:
        return int(self.stop.get("max_tokens") or 0)

    @property
    def complete(self) -> bool:
        return bool(self.max_tokens) and len(self.output) >= self.max_tokens

    def add(self, chunk: dict[str, Any], tokens: Any) -> None:
        self.output.extend(tokens)
        self.usage = chunk.get("completion_usage") or self.usage
        self.finished = bool(chunk.get("finish_reason"))

    def rest_of(self) -> int:
        """Tokens still to come (0: no limit)."""
        return self.max_tokens - len(self.output) if self.max_tokens else 0

    def next_attempt(self, request: dict[str, Any]) -> dict[str, Any]:
        """The request for the rest of the reply: the output so far appended to the prompt."""
        stop = dict(self.stop)
        if self.max_tokens:
            stop["max_tokens"] = self.rest_of()
        if stop.get("min_tokens"):
            stop["min_tokens"] = max(0, int(stop["min_tokens"]) - len(self.output))
        self.carried, self.usage = len(self.output), {}
        return {**request, "token_ids": self.prompt + self.output, "stop_conditions": stop}

    def engine_usage(self, prompt_tokens: int) -> tuple[int, int, int]:
        """(prompt, completion, cached) tokens of the current attempt, as its engine reported."""
        usage = self.usage
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return int(usage.get("prompt_tokens", prompt_tokens)), int(usage.get("completion_tokens", len(self.output) - self.carried)), int(cached)

    def client_usage(self) -> dict[str, Any]:
        """The usage as the client's one call: earlier attempts' output was not prompt to it."""
        usage = self.usage
        if not self.carried:
            return usage
        return {
            **usage,
            "prompt_tokens": usage.get("prompt_tokens", self.carried) - self.carried,
            "completion_tokens": usage.get("completion_tokens", 0) + self.carried,
        }

    def cut(self, proof: dict[str, Any]) -> dict[str, Any]:
        """The last chunk of a reply a weight sync cut: the output so far stands, marked aborted."""
        self.finished = True
        usage = {"prompt_tokens": len(self.prompt), "completion_tokens": len(self.output), "total_tokens": len(self.prompt) + len(self.output)}
        return {"token_ids": [], "finish_reason": "cancelled", "completion_usage": usage, "engine_data": {"tasim": {**proof, "aborted": True}}}

    def end(self, proof: dict[str, Any]) -> dict[str, Any]:
        """A final chunk for a reply whose tokens all came but whose stream broke before its end."""
        self.finished = True
        self.usage = {"prompt_tokens": len(self.prompt) + self.carried, "completion_tokens": len(self.output) - self.carried}
        return {"token_ids": [], "finish_reason": "length", "engine_data": {"tasim": proof}}


def _worker_lost(exc: BaseException) -> bool:
    """Dynamo 1.6.1 reports a worker it cannot reach ("TCP connection ... failed") and a stream
    that broke off ("Stream ended before generation completed") as plain exceptions whose
    message starts with its error code ``Unavailable``; its typed errors are accepted too."""
    return isinstance(exc, Exception) and (str(exc).startswith("Unavailable") or type(exc).__name__ in _LOST_WORKER_ERRORS)


_LOST_WORKER_ERRORS = frozenset({"CannotConnect", "Disconnected", "StreamIncomplete", "WorkerUnavailable", "EngineShutdown"})


def _dynamo_error(kind: str, message: str) -> Exception:
    """One of Dynamo's typed errors, which the frontend turns into an HTTP status: 400 with the
    message for ``InvalidArgument``, 503 "Service temporarily unavailable" for
    ``WorkerUnavailable`` (Dynamo shows no message of a 5xx; the router's status does)."""
    from dynamo.llm import exceptions  # the router process has Dynamo; importers of this module need not

    error: type[Exception] = getattr(exceptions, kind)
    return error(message)


def prioritized(request: dict[str, Any], priority: int) -> dict[str, Any]:
    """``request`` as a worker must get it to queue the call at ``priority``: with its
    `routing_priority`, the field Dynamo's frontend fills from ``nvext.agent_hints.priority``."""
    if not priority:
        return request
    return {**request, "routing": {**(request.get("routing") or {}), "priority": routing_priority(priority)}}


async def _status_server(router: _Router, port: int) -> web.AppRunner:
    async def status(_: web.Request) -> web.Response:
        return web.json_response(router.status())

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=prometheus_text(router), content_type="text/plain", charset="utf-8")

    async def run_start(_: web.Request) -> web.Response:
        router.begin_run()
        return web.json_response({"running": router.running})

    async def run_end(_: web.Request) -> web.Response:
        router.end_run()
        return web.json_response({"ended": router.ended})

    async def run_mark(request: web.Request) -> web.Response:
        try:
            body = await request.json()
            versions = (int(body.get("min_version", 0)), int(body.get("max_version", 0)))
            event = router.mark(str(body["kind"]), int(body["step"]), int(body.get("trajectories", 0)), str(body.get("group", "")), versions)
        except (ValueError, KeyError, TypeError) as exc:
            shape = "{kind: " + "|".join(MARKS) + ", step: int, trajectories: int, group: str, min_version: int, max_version: int}"
            return web.json_response({"error": f"bad mark: {exc} (body: {shape})"}, status=400)
        return web.json_response({"t": event.t})

    app = decision_app(router.decisions)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/run/start", run_start)
    app.router.add_post("/run/end", run_end)
    app.router.add_post("/run/mark", run_mark)

    async def clear_caches(_: web.Request) -> web.Response:
        return web.json_response(await router.clear_caches())

    app.router.add_post("/caches/clear", clear_caches)
    return await serve_app(app, port)


async def serve(config: RouterConfig) -> None:
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runtime = DistributedRuntime(loop, os.environ.get("DYN_DISCOVERY_BACKEND", "file"), os.environ.get("DYN_REQUEST_PLANE", "tcp"))
    router = _Router(config, runtime)
    status = await _status_server(router, config.status_port)
    try:
        await router.start()
        if router.scenario.live.routing != "proxy":  # pin: decisions only; dynamo-*: Dynamo's plug-in decides
            await stop.wait()
            return
        endpoint = runtime.endpoint(f"{config.namespace}.tasim_router.generate")
        await register_model(
            model_input=ModelInput.Tokens,
            model_type=ModelType.Chat | ModelType.Completions,
            endpoint=endpoint,
            model_path=config.model_path,
            model_name=config.model_name,
            worker_type=WorkerType.Aggregated,
        )
        serving = asyncio.ensure_future(endpoint.serve_endpoint(router.generate, graceful_shutdown=False))
        await asyncio.wait({serving, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
        if serving.done():
            serving.result()  # surfaces why serving stopped
    finally:
        router.close()
        await status.cleanup()
        runtime.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tasim.live.router.service CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s tasim-router %(levelname)s %(message)s")
    config = RouterConfig.model_validate(json.loads(Path(args[0]).read_text()))
    import uvloop

    uvloop.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
