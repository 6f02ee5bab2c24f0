"""Decision-only routing (``live.routing: pin``): the policy decides, the tokens go around it.

In proxy mode every streamed chunk crosses the tasim router in Python. Here the router only
answers "which worker for this call of this program" and hears how the call ended; the client
then sends the call to the Dynamo frontend pinned to that worker (header
``x-dynamo-worker-instance-id``; the frontend runs ``--router-mode direct``, which refuses a call
without a pin), and the tokens stream worker → frontend → client in Rust. The same `PolicyHost`
as in proxy mode makes every decision, holds a paused program's call, ends programs and writes
the same event log.

The service (JSON over HTTP on the router's status port, 127.0.0.1)::

    POST /v1/route  {program?, parent?, token_ids | tokens, max_tokens}  → {call, worker, instance_id, pin, held_s}
    POST /v1/first  {call}                                      → 204   first token seen (optional)
    POST /v1/done   {call, prompt_tokens, completion_tokens, cached_tokens}  → 204
    POST /v1/fail   {call, reason}                              → 204   the call failed for good
    POST /v1/retry  {call, reason, token_ids | tokens, max_tokens}  → like /v1/route
    POST /v1/end    {program}                                   → {known}   the session-final
    POST /v1/weight_sync/begin  {version, abort?}               → {version, began, aborted?}
    POST /v1/weight_sync/end    {version}                       → {version, ended, released}

The prompt comes as ``token_ids`` or, cheaper to send and to read, as ``tokens``: base64 of the
ids packed as little-endian u32, the bytes Dynamo hashes. ``/v1/route`` waits while the policy
holds the program, as a proxied call does; a client that goes away meanwhile rolls the call
back. ``program`` null is a one-off call. ``pin`` holds the headers to send with the call.
``/v1/retry`` is for a call whose pinned worker failed under it (connection refused, stream cut,
the instance gone): the service probes that worker itself (a client's word alone takes no worker
out of service), then lets the policy place the call again, up to ``live.max_retries`` times, as
proxy mode does. ``/v1/end`` is the session-final: it never reaches an engine.
``/v1/weight_sync/begin`` and ``/end`` are for a trainer that updates the workers' weights (in any
routing mode): they bracket the update, so the policy can act on it (ThunderAgent holds every new
call until the end, then routes them; session-affinity routers forget their bindings). ``version``
is the trainer's weight version, newer at each sync; ``began`` or ``ended`` false: a repeat that
changed nothing; ``released``: the held calls routed at the end. ``abort: true`` (proxy routing
only) is verl's sync: every call the router streams is cut (``aborted``: how many; each ends for
its client with the output so far and ``engine_data.tasim.aborted`` true, so it sends the call
again, prompt plus partial output), and calls routed until the end wait at the router before they
reach a worker, in arrival order. Bad bodies, unknown calls,
refused ids and a sync that contradicts the last one (409) get 4xx with a one-line
``{"error": ...}``; with no worker serving, 503. ``GET /v1/socket`` offers the same operations as
WebSocket frames (below).

A call whose client never reports its end would keep its program alive for ever; calls routed
longer ago than the program idle TTL with no report are failed, so their programs expire.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec
from aiohttp import web

from tasim.live.frames import Outbox, split
from tasim.live.router.live_host import Call, Held, InvalidProgramId, NoWorkerServing, PolicyHost, Prompt, WeightSyncConflict

# The header Dynamo's frontend pins a call with (alias of x-worker-instance-id).
PIN_HEADER = "x-dynamo-worker-instance-id"
# Dynamo's frontend copies this header into the request's routing.priority (as it does
# nvext.agent_hints.priority), unchanged.
PRIORITY_HEADER = "x-dynamo-request-priority"
MAX_BODY_BYTES = 64 << 20  # a 1M-token prompt as JSON fits

TokenId = Annotated[int, msgspec.Meta(ge=0, lt=1 << 32)]  # Dynamo hashes tokens as u32


def routing_priority(priority: int) -> int:
    """The ``routing.priority`` that queues a call at ``priority`` (a policy's `Route.priority`,
    lower first): Dynamo 1.6.1's vLLM worker runs a call at vLLM priority ``-routing.priority``."""
    return -priority


Count = Annotated[int, msgspec.Meta(ge=0)]
Reason = Annotated[str, msgspec.Meta(min_length=1, max_length=1000)]


class _Frame(msgspec.Struct, tag_field="op", forbid_unknown_fields=True, kw_only=True):
    """One request to the service: an HTTP body (``op`` optional there), or a socket frame,
    where ``id`` asks for an answer carrying it."""

    id: int | None = None


class RouteBody(_Frame, tag="route"):
    token_ids: list[TokenId] | None = None
    tokens: bytes | None = None  # the same packed as little-endian u32 (base64 in JSON): cheaper
    max_tokens: Count = 0
    program: str | None = None
    parent: str | None = None


class CallBody(_Frame, tag="first"):
    call: str


class DoneBody(_Frame, tag="done"):
    call: str
    prompt_tokens: Count
    completion_tokens: Count
    cached_tokens: Count = 0


class FailBody(_Frame, tag="fail"):
    call: str
    reason: Reason


class RetryBody(_Frame, tag="retry"):
    call: str
    reason: Reason
    token_ids: list[TokenId] | None = None
    tokens: bytes | None = None
    max_tokens: Count = 0


class EndBody(_Frame, tag="end"):
    program: str


class _WeightSyncBody(_Frame):
    version: Count  # the trainer's weight version (verl: its global step)


class WeightSyncBeginBody(_WeightSyncBody, tag="weight_sync_begin"):
    abort: bool = False  # cut the calls in flight and hold new ones at the router until the end


class WeightSyncEndBody(_WeightSyncBody, tag="weight_sync_end"):
    pass


class CancelFrame(_Frame, tag="cancel"):
    """Socket only: the client gave up waiting for the answer to frame ``id`` (a held call
    is rolled back, as when an HTTP client goes away); answered ``{"cancelled": true}`` in
    place of the question's answer if that was still to come."""


Frame = RouteBody | CallBody | DoneBody | FailBody | RetryBody | EndBody | WeightSyncBeginBody | WeightSyncEndBody | CancelFrame
_FIELDS = {kind: ", ".join(f for f in kind.__struct_fields__ if f != "id") for kind in Frame.__args__}


BodyT = TypeVar("BodyT", bound=msgspec.Struct)

# The router's instance of a worker (None while it has none), and a check of a worker a client
# reports failing: (worker, instance, reason), awaited before the call is placed again.
InstanceOf = Callable[[str], int | None]
ConfirmLost = Callable[[str, int, str], Awaitable[None]]
# Cut every call the router streams (a weight sync with abort); the number cut.
CutStreams = Callable[[], int]


class DecisionError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class _Routed:
    call: Call
    instance: int
    at: float  # monotonic time it was handed out
    attempts: int  # routings of this client call so far (1 + retries)
    first_seen: bool = False


class Decisions:
    """The service's state: the calls handed out and not yet reported, around ``host``.
    ``on_request`` runs before each routing and weight sync (the router starts its measured
    run there); ``cut_streams`` is the proxying router's, None where calls bypass the router."""

    def __init__(
        self,
        host: PolicyHost,
        instance_of: InstanceOf,
        confirm_lost: ConfirmLost,
        max_retries: int,
        report_timeout_s: float | None,
        on_request: Callable[[], None] = lambda: None,
        cut_streams: CutStreams | None = None,
    ) -> None:
        self.host = host
        self.instance_of = instance_of
        self.confirm_lost = confirm_lost
        self.max_retries = max_retries
        self.report_timeout_s = report_timeout_s
        self.on_request = on_request
        self.cut_streams = cut_streams
        self.calls: OrderedDict[str, _Routed] = OrderedDict()  # oldest routing first
        self.unreported = 0  # calls failed because their client never reported their end
        self._decoders: dict[type[msgspec.Struct], msgspec.json.Decoder[Any]] = {}
        self._frame_decoder: msgspec.json.Decoder[Frame] = msgspec.json.Decoder(Frame)

    # --- the operations ------------------------------------------------------------------------

    async def route(self, body: RouteBody) -> dict[str, Any]:
        admission = self._decide(body)
        return self._hand_out(admission, 1) if isinstance(admission, Call) else await self._route_held(admission)

    def _decide(self, body: RouteBody) -> Call | Held:
        self.on_request()
        self.expire_unreported()
        try:
            return self.host.decide(body.program, _prompt(body), body.max_tokens, body.parent)
        except InvalidProgramId as exc:
            raise DecisionError(400, str(exc)) from None
        except NoWorkerServing as exc:
            raise DecisionError(503, str(exc)) from None

    def first(self, body: CallBody) -> None:
        routed = self._routed(body.call)
        if not routed.first_seen:  # a repeated report changes nothing
            routed.first_seen = True
            self.host.call_first_token(routed.call)

    def done(self, body: DoneBody) -> None:
        routed = self._take(body.call)
        self.host.finish(routed.call, body.prompt_tokens, body.completion_tokens, body.cached_tokens)

    def fail(self, body: FailBody) -> None:
        self.host.fail(self._take(body.call).call, f"client: {body.reason}")

    async def retry(self, body: RetryBody) -> dict[str, Any]:
        prompt = _prompt(body)
        routed = self._take(body.call)
        call = routed.call
        reason = f"client: {body.reason}"
        if routed.attempts > self.max_retries:
            self.host.fail(call, f"{reason} (after {self.max_retries} retries)")
            raise DecisionError(503, f"call {body.call} failed on {routed.attempts} workers; giving up ({self.max_retries} retries allowed)")
        self.calls[call.spec.id] = routed  # in flight while its worker is checked
        try:
            await self.confirm_lost(call.worker, routed.instance, reason)
        except BaseException:  # the client left meanwhile
            if self.calls.pop(call.spec.id, None) is routed:
                self.host.fail(call, f"{reason} (the retry was given up)")
            raise
        if self.calls.pop(call.spec.id, None) is not routed:
            raise DecisionError(409, f"call {body.call} expired while its worker was checked")
        try:
            admission = self.host.retry(call, prompt, body.max_tokens, f"worker {call.worker}: {reason}")
        except NoWorkerServing as exc:  # the host failed the call
            raise DecisionError(503, str(exc)) from None
        return self._hand_out(await self._admitted(admission), routed.attempts + 1)

    def end(self, body: EndBody) -> dict[str, Any]:
        return {"known": self.host.session_final(body.program)}

    def weight_sync_begin(self, body: WeightSyncBeginBody) -> dict[str, Any]:
        if body.abort and self.cut_streams is None:
            raise DecisionError(400, "abort needs live.routing proxy: with pin routing the calls stream past the router")
        self.on_request()
        try:
            began = self.host.begin_weight_sync(body.version, gate=body.abort)
        except WeightSyncConflict as exc:
            raise DecisionError(409, str(exc)) from None
        if not body.abort:
            return {"version": body.version, "began": began}
        return {"version": body.version, "began": began, "aborted": self.cut_streams() if began and self.cut_streams else 0}

    def weight_sync_end(self, body: WeightSyncEndBody) -> dict[str, Any]:
        self.on_request()
        try:
            released = self.host.end_weight_sync(body.version)
        except WeightSyncConflict as exc:
            raise DecisionError(409, str(exc)) from None
        return {"version": body.version, "ended": released is not None, "released": released or 0}

    def expire_unreported(self, now: float | None = None) -> None:
        """Fail the calls handed out longer than the report timeout ago (oldest first)."""
        if self.report_timeout_s is None:
            return
        now = time.monotonic() if now is None else now
        while self.calls:
            call_id, routed = next(iter(self.calls.items()))
            if now - routed.at <= self.report_timeout_s:
                return
            del self.calls[call_id]
            self.unreported += 1
            self.host.fail(routed.call, f"no report from the client within {self.report_timeout_s:g} s")

    # --- helpers -------------------------------------------------------------------------------

    async def _admitted(self, admission: Call | Held) -> Call:
        if isinstance(admission, Call):
            return admission
        try:
            return await self.host.wait(admission)  # cancelled if the client goes away: rolled back
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            raise DecisionError(409, f"program {admission.spec.program} ended while its call was held") from None

    def _hand_out(self, call: Call, attempts: int) -> dict[str, Any]:
        instance = self.instance_of(call.worker)
        if instance is None:  # cannot happen while the host counts the worker as serving
            self.host.fail(call, f"worker {call.worker} has no instance")
            raise DecisionError(503, f"worker {call.worker} has no Dynamo instance")
        self.calls[call.spec.id] = _Routed(call, instance, time.monotonic(), attempts)
        pin = {PIN_HEADER: str(instance)} | ({PRIORITY_HEADER: str(routing_priority(call.priority))} if call.priority else {})
        return {"call": call.spec.id, "worker": call.worker, "instance_id": instance, "pin": pin, "held_s": call.held_s}

    def _routed(self, call_id: str) -> _Routed:
        routed = self.calls.get(call_id)
        if routed is None:
            raise DecisionError(404, f"no call {call_id[:100]!r} is routed and unreported (ids come from /v1/route)")
        return routed

    def _take(self, call_id: str) -> _Routed:
        routed = self._routed(call_id)
        del self.calls[call_id]
        return routed

    # --- HTTP ----------------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        async def route(request: web.Request) -> web.Response:
            return _json(await self.route(await self._body(request, RouteBody)))

        async def first(request: web.Request) -> web.Response:
            self.first(await self._body(request, CallBody))
            return web.Response(status=204)

        async def done(request: web.Request) -> web.Response:
            self.done(await self._body(request, DoneBody))
            return web.Response(status=204)

        async def fail(request: web.Request) -> web.Response:
            self.fail(await self._body(request, FailBody))
            return web.Response(status=204)

        async def retry(request: web.Request) -> web.Response:
            return _json(await self.retry(await self._body(request, RetryBody)))

        async def end(request: web.Request) -> web.Response:
            return _json(self.end(await self._body(request, EndBody)))

        async def sync_begin(request: web.Request) -> web.Response:
            return _json(self.weight_sync_begin(await self._body(request, WeightSyncBeginBody)))

        async def sync_end(request: web.Request) -> web.Response:
            return _json(self.weight_sync_end(await self._body(request, WeightSyncEndBody)))

        handlers: tuple[tuple[str, Handler], ...] = (
            ("route", route),
            ("first", first),
            ("done", done),
            ("fail", fail),
            ("retry", retry),
            ("end", end),
            ("weight_sync/begin", sync_begin),
            ("weight_sync/end", sync_end),
        )
        for path, handler in handlers:
            app.router.add_post(f"/v1/{path}", _answering_errors(handler))
        app.router.add_get("/v1/socket", self._socket)

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        """The same operations as frames over one WebSocket (``{"op": "route", "id": 1, ...}``),
        which costs a client far less than an HTTP exchange per operation. A message holds one
        frame or a JSON array of them (`tasim.live.frames`); answers are batched the same way.
        Frames are handled in order; a route or retry answers when decided (others may be
        answered meanwhile), and only frames with an ``id`` are answered: ``{"id": ..., ...}``
        or ``{"id": ..., "status": 4xx|5xx, "error": ...}`` (an error of a frame without an id
        is answered with ``id`` null). A question gets exactly one answer: a ``cancel`` of one
        still waiting is answered ``{"id": ..., "cancelled": true}`` in its place, one already
        answered gets nothing more. Closing the socket gives up every call it is still
        waiting for."""
        socket = web.WebSocketResponse(max_msg_size=MAX_BODY_BYTES, compress=False)  # small frames: deflate would cost more than it saves
        await socket.prepare(request)
        outbox = Outbox(socket)
        waiting: dict[int, asyncio.Task[None]] = {}
        try:
            async for message in socket:
                if message.type not in (web.WSMsgType.TEXT, web.WSMsgType.BINARY):
                    continue
                try:
                    frames = split(message.data)
                except msgspec.DecodeError as exc:
                    outbox.put({"id": None, "status": 400, "error": f"bad message: not JSON ({exc})"})
                    continue
                for data in frames:
                    self._frame(outbox, data, waiting)
        finally:
            for task in waiting.values():
                task.cancel()
            await outbox.drain()
        return socket

    def _frame(self, outbox: Outbox, data: str | bytes | msgspec.Raw, waiting: dict[int, asyncio.Task[None]]) -> None:
        frame: Frame | None = None
        try:
            frame = self._frame_decoder.decode(data)
            answer = self._carry_out(outbox, frame, waiting)
        except DecisionError as exc:
            outbox.put({"id": frame.id if frame else None, "status": exc.status, "error": str(exc)})
            return
        except msgspec.ValidationError as exc:
            outbox.put({"id": None, "status": 400, "error": f"bad frame: {exc} (ops: {_OPS})"})
            return
        except msgspec.DecodeError as exc:
            outbox.put({"id": None, "status": 400, "error": f"bad frame: not JSON ({exc})"})
            return
        if answer is not None and frame.id is not None:
            outbox.put({**answer, "id": frame.id})

    def _carry_out(self, outbox: Outbox, frame: Frame, waiting: dict[int, asyncio.Task[None]]) -> dict[str, Any] | None:
        """The answer to a frame now, or None when there is none yet (a held call or a retry,
        answered by a task of their own) or none at all (a cancel)."""
        if isinstance(frame, CancelFrame):
            task = waiting.get(frame.id) if frame.id is not None else None
            if task is None:  # answered already (or never asked): that answer was the last word
                return None
            task.cancel()  # it has not answered, and now never will: this answer is the last word
            return {"cancelled": True}
        if not isinstance(frame, (RouteBody, RetryBody)):
            return self._now(frame)
        if frame.id is None:
            raise DecisionError(400, f"a {frame.__struct_config__.tag} frame needs an id")
        if isinstance(frame, RouteBody):
            admission = self._decide(frame)
            if isinstance(admission, Call):  # the common case: answered at once, no task
                return self._hand_out(admission, 1)
            deciding = self._route_held(admission)
        else:
            deciding = self.retry(frame)
        waiting[frame.id] = asyncio.ensure_future(self._answer_later(outbox, frame.id, deciding, waiting))
        return None

    def _now(self, frame: CallBody | DoneBody | FailBody | EndBody | WeightSyncBeginBody | WeightSyncEndBody) -> dict[str, Any]:
        """Carry out a report, a program end or a weight sync's begin or end."""
        if isinstance(frame, CallBody):
            self.first(frame)
        elif isinstance(frame, DoneBody):
            self.done(frame)
        elif isinstance(frame, FailBody):
            self.fail(frame)
        elif isinstance(frame, EndBody):
            return self.end(frame)
        elif isinstance(frame, WeightSyncBeginBody):
            return self.weight_sync_begin(frame)
        elif isinstance(frame, WeightSyncEndBody):
            return self.weight_sync_end(frame)
        return {}

    async def _route_held(self, held: Held) -> dict[str, Any]:
        return self._hand_out(await self._admitted(held), 1)

    async def _answer_later(self, outbox: Outbox, frame_id: int, deciding: Awaitable[dict[str, Any]], waiting: dict[int, asyncio.Task[None]]) -> None:
        try:
            answer = await deciding
        except DecisionError as exc:
            answer = {"status": exc.status, "error": str(exc)}
        finally:
            waiting.pop(frame_id, None)
        if outbox.socket.closed:  # the client left after the decision: the call was never sent
            if "call" in answer:
                self.fail(FailBody(call=answer["call"], reason="the client's socket closed before it took the call"))
            return
        outbox.put({**answer, "id": frame_id})

    async def _body(self, request: web.Request, kind: type[BodyT]) -> BodyT:
        decoder = self._decoders.get(kind)
        if decoder is None:
            decoder = self._decoders[kind] = msgspec.json.Decoder(kind)
        try:
            body: BodyT = decoder.decode(await request.read())
        except msgspec.ValidationError as exc:
            raise DecisionError(400, f"bad {request.path} body: {exc} (fields: {_FIELDS[kind]})") from None
        except msgspec.DecodeError as exc:
            raise DecisionError(400, f"bad {request.path} body: not JSON ({exc})") from None
        return body


def _prompt(body: RouteBody | RetryBody) -> Prompt:
    if (body.token_ids is None) == (body.tokens is None):
        raise DecisionError(400, "give the prompt once: token_ids (a list of ids) or tokens (base64 of little-endian u32)")
    if body.tokens is not None and len(body.tokens) % 4:
        raise DecisionError(400, f"tokens: {len(body.tokens)} bytes is not a whole number of little-endian u32 token ids")
    return body.token_ids if body.token_ids is not None else body.tokens  # type: ignore[return-value]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_encode = msgspec.json.Encoder().encode


_OPS = ", ".join(kind.__struct_config__.tag for kind in Frame.__args__)


def _json(payload: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=_encode(payload), status=status, content_type="application/json")


def _answering_errors(handler: Handler) -> Handler:
    async def answered(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except DecisionError as exc:
            return _json({"error": str(exc)}, exc.status)

    return answered


def decision_app(decisions: Decisions | None = None) -> web.Application:
    """An application with room for long prompts; ``decisions`` adds the service's routes."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    if decisions is not None:
        decisions.add_routes(app)
    return app


async def serve_app(app: web.Application, port: int) -> web.AppRunner:
    """Serve ``app`` on 127.0.0.1; a handler whose client disconnects is cancelled (so a held
    call given up is rolled back)."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner
