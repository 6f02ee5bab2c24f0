"""The client side of decision-only routing (``live.routing: pin``, `tasim.live.router.decisions`).

`PinnedCalls.complete` makes one call the way a pin-mode client must: ask the tasim router
which worker (a ``route`` frame on its decision socket, answered when the policy has placed the
call, so possibly after a pause), stream the call from the Dynamo frontend pinned to that
worker, report the first token and then the engine's usage. When the pinned worker fails under
the call (connection refused or cut, a 5xx, the instance gone, a stream that ends without a
finish reason), the call goes back to the router (``retry``), which checks the worker and lets
the policy place the call again; the client sees one reply. The output streamed before a failure is dropped and the call starts over on
its new worker. ``end`` sends a program's session-final to the router; it never reaches an
engine. The HTTP agent driver and the verl client (`tasim.live.verl.client`) both call here.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from tasim.core.errors import LiveError
from tasim.live.frames import Outbox, split
from tasim.live.hashing import pack_tokens

_encode = msgspec.json.Encoder().encode
_JSON = {"content-type": "application/json"}


class CallFailed(LiveError):
    """The router refused the call, or gave it up after its retries; the message says why."""


class WorkerFailed(Exception):
    """The worker failed the call (not the request): for a pinned call the router decides
    what comes next."""


@dataclass(frozen=True, slots=True)
class StreamedReply:
    output_token_ids: list[int]
    finish_reason: str
    usage: dict[str, Any]  # the OpenAI usage of the reply

    def usage_counts(self, prompt_tokens: int) -> tuple[int, int, int]:
        """(prompt, completion, cached) tokens as the engine reported them."""
        usage = self.usage
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return int(usage.get("prompt_tokens", prompt_tokens)), int(usage.get("completion_tokens", len(self.output_token_ids))), cached


FirstChunk = Callable[[dict[str, Any]], Awaitable[None]]


def completion_request(body: dict[str, Any], stream: bool, extra_fields: tuple[str, ...] = ()) -> dict[str, Any]:
    """``body`` asking for the output token ids (and ``extra_fields``), streamed with usage or
    as one JSON reply."""
    nvext = dict(body.get("nvext") or {})
    nvext["extra_fields"] = sorted({*nvext.get("extra_fields", ()), "completion_token_ids", *extra_fields})
    return {**body, "stream": stream, "nvext": nvext} | ({"stream_options": {"include_usage": True}} if stream else {})


async def stream_completion(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str], first_chunk: FirstChunk
) -> StreamedReply:
    """Send one `completion_request` to the frontend and read its reply; ``first_chunk`` is
    awaited with the first chunk that carries tokens (streamed only). Raises `WorkerFailed`
    when the worker failed it, `CallFailed` when the frontend refused the request itself."""
    output: list[int] = []
    finish: str | None = None
    usage: dict[str, Any] = {}
    try:
        async with session.post(url, data=_encode(body), headers={**headers, **_JSON}) as reply:
            if reply.status != 200:
                text = (await reply.text())[:300]
                if _worker_failure(reply.status, text):
                    raise WorkerFailed(f"frontend HTTP {reply.status}: {text}")
                raise CallFailed(f"frontend HTTP {reply.status}: {text}")
            if not body["stream"]:
                whole = msgspec.json.decode(await reply.read())
                choice = (whole.get("choices") or [{}])[0]
                output = list((whole.get("nvext") or {}).get("completion_token_ids") or ())
                return StreamedReply(output, choice.get("finish_reason") or "", whole.get("usage") or {})
            async for line in reply.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = msgspec.json.decode(data)
                if "error" in chunk:
                    raise WorkerFailed(f"stream error: {str(chunk['error'])[:300]}")
                tokens = (chunk.get("nvext") or {}).get("completion_token_ids") or ()
                if tokens and not output:
                    await first_chunk(chunk)
                output.extend(tokens)
                for choice in chunk.get("choices") or ():
                    finish = choice.get("finish_reason") or finish
                usage = chunk.get("usage") or usage
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise WorkerFailed(f"{type(exc).__name__}: {exc}") from None
    if finish is None:
        raise WorkerFailed("the stream ended without a finish reason")
    return StreamedReply(output, finish, usage)


@dataclass(frozen=True, slots=True)
class PinnedReply:
    call: str  # the router's id of the routing that completed
    worker: str
    output_token_ids: list[int]
    finish_reason: str
    usage: dict[str, Any]  # the OpenAI usage of the reply
    retries: int

    @property
    def cached_tokens(self) -> int:
        return int((self.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


class PinnedCalls:
    """``decisions_url``: the tasim router's HTTP address; ``completions_url``: the frontend's
    ``/v1/completions``."""

    def __init__(self, session: aiohttp.ClientSession, decisions_url: str, completions_url: str) -> None:
        self.session = session
        self.decisions_url = decisions_url.rstrip("/")
        self.completions_url = completions_url
        self._decisions: DecisionSocket | None = None

    async def complete(
        self,
        body: dict[str, Any],
        token_ids: list[int],
        max_tokens: int,
        program: str | None = None,
        parent: str | None = None,
        headers: dict[str, str] | None = None,
        stream: bool = True,
    ) -> PinnedReply:
        """``body`` is the ``/v1/completions`` request (its prompt as text or ids);
        ``token_ids`` is that prompt as token ids, which the policy hashes. ``stream`` False:
        one JSON reply, cheaper for the client, and no first-token report (no TTFT in the log)."""
        packed = pack_tokens(token_ids)
        decision = await self._decide("route", {"program": program, "parent": parent, "tokens": packed, "max_tokens": max_tokens})
        request = completion_request(body, stream)
        retries = 0
        while True:
            call = decision["call"]

            async def first_token(_: dict[str, Any], call: str = call) -> None:
                await self._report("first", {"call": call})

            try:
                reply = await stream_completion(self.session, self.completions_url, request, {**(headers or {}), **decision["pin"]}, first_token)
            except WorkerFailed as exc:
                retries += 1
                retry = {"call": decision["call"], "reason": str(exc), "tokens": packed, "max_tokens": max_tokens}
                decision = await self._decide("retry", retry)
                continue
            except BaseException as exc:
                await self._report_failure(decision["call"], exc)
                raise
            break
        prompt, output, cached = reply.usage_counts(len(token_ids))
        await self._report("done", {"call": decision["call"], "prompt_tokens": prompt, "completion_tokens": output, "cached_tokens": cached})
        return PinnedReply(decision["call"], decision["worker"], reply.output_token_ids, reply.finish_reason, reply.usage, retries)

    async def end(self, program: str) -> bool:
        """The program's session-final; True if the router knew the program."""
        known: bool = (await self._decide("end", {"program": program}))["known"]
        return known

    async def _decide(self, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = await self._socket().ask(operation, body)
        if "error" in answer:
            raise CallFailed(f"tasim router refused {operation} ({answer.get('status')}): {answer['error']}")
        return answer

    async def _report(self, operation: str, body: dict[str, Any]) -> None:
        """A report needs no answer: the socket keeps it in order with the call's others."""
        await self._socket().tell(operation, body)

    async def _report_failure(self, call: str, exc: BaseException) -> None:
        """Tell the router the call failed for good; best effort, also while being cancelled."""
        reason = "cancelled" if isinstance(exc, asyncio.CancelledError) else f"{type(exc).__name__}: {exc}"[:1000]
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.shield(self._report("fail", {"call": call, "reason": reason}))

    def _socket(self) -> DecisionSocket:
        if self._decisions is None or self._decisions.closed:
            self._decisions = DecisionSocket(self.session, f"{self.decisions_url}/v1/socket")
        return self._decisions

    async def close(self) -> None:
        if self._decisions is not None:
            await self._decisions.close()


class DecisionSocket:
    """One WebSocket to the decision service (`tasim.live.router.decisions`), shared by every call
    of a client: answers are matched to questions by id; reports go unanswered. Frames queued
    in one turn of the loop go out as one message (`tasim.live.frames`). Opened on first use;
    a question whose asker is cancelled is cancelled at the service too, and a call the service
    handed out before it heard of that is given back. Every question gets one answer (the
    service acknowledges a cancel it acted on), so none is remembered past it."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.closed = False
        self.errors: list[str] = []  # the service's answers to reports it refused
        self._ids = itertools.count(1)
        self._asked: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._abandoned: set[int] = set()  # questions whose asker was cancelled
        self._connected: asyncio.Task[Outbox] | None = None
        self._reader: asyncio.Task[None] | None = None

    async def ask(self, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        outbox = await self._open()
        if self.closed:  # the reader has failed every question asked before: so this one too
            raise CallFailed("the tasim router closed its decision socket")
        frame_id = next(self._ids)
        answer = self._asked[frame_id] = asyncio.get_running_loop().create_future()
        try:
            outbox.put({"op": operation, "id": frame_id, **body})
            return await answer
        except asyncio.CancelledError:
            if not outbox.socket.closed:
                self._abandoned.add(frame_id)
                outbox.put({"op": "cancel", "id": frame_id})
            raise
        finally:
            self._asked.pop(frame_id, None)

    async def tell(self, operation: str, body: dict[str, Any]) -> None:
        """Send a report; returns once it is sent (raises if it could not be)."""
        outbox = await self._open()
        await outbox.put({"op": operation, **body})

    async def close(self) -> None:
        self.closed = True
        if self._connected is not None and self._connected.done() and not self._connected.exception():
            outbox = self._connected.result()
            await outbox.drain()
            await outbox.socket.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _open(self) -> Outbox:
        if self._connected is None:  # concurrent first calls share one connection attempt
            self._connected = asyncio.ensure_future(self._connect())
        return await asyncio.shield(self._connected)

    async def _connect(self) -> Outbox:
        socket = await self.session.ws_connect(self.url, max_msg_size=0, autoping=True, compress=0)
        outbox = Outbox(socket)
        self._reader = asyncio.ensure_future(self._read(socket, outbox))
        return outbox

    async def _read(self, socket: aiohttp.ClientWebSocketResponse, outbox: Outbox) -> None:
        try:
            async for message in socket:
                if message.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                    continue
                for frame in split(message.data):
                    self._answered(_decode_answer(frame), outbox)
        finally:
            self.closed = True
            for waiter in self._asked.values():
                if not waiter.done():
                    waiter.set_exception(CallFailed("the tasim router closed its decision socket"))

    def _answered(self, answer: dict[str, Any], outbox: Outbox) -> None:
        frame_id = answer.pop("id", None) or 0
        waiter = self._asked.get(frame_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)
        elif frame_id in self._abandoned:  # the one answer to a question given up
            self._abandoned.discard(frame_id)
            if "call" in answer:  # answered before the cancel arrived: give the call back
                outbox.put({"op": "fail", "call": answer["call"], "reason": "the client gave up waiting for the answer"})
        elif "error" in answer:
            self.errors.append(str(answer["error"]))


_decode_answer = msgspec.json.Decoder(dict[str, Any]).decode


def _worker_failure(status: int, text: str) -> bool:
    """A frontend answer that says the pinned worker failed rather than the request was bad:
    any 5xx, and the 4xx Dynamo gives a pin to an instance it no longer lists ("Invalid
    request"; request validation errors say "Validation: ...")."""
    return status >= 500 or (status in (400, 404) and "Validation" not in text)
