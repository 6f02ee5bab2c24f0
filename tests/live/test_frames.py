"""`tasim.live.frames`: batching the decision socket's frames per turn of the event loop. The
real WebSocket ends run in tests/live/router/test_decisions.py; here a recording socket shows exactly which
messages leave, and when."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from tasim.live.frames import Outbox, split


class RecordingSocket:
    """Keeps each message sent; ``delay_s`` holds a send open, ``error`` makes it fail."""

    def __init__(self, delay_s: float = 0.0, error: Exception | None = None) -> None:
        self.closed = False
        self.sent: list[bytes] = []
        self.delay_s = delay_s
        self.error = error

    async def send_bytes(self, data: bytes, compress: int | None = None) -> None:
        if self.error is not None:
            raise self.error
        self.sent.append(data)
        await asyncio.sleep(self.delay_s)


def test_frames_put_in_one_turn_leave_as_one_message_in_order() -> None:
    async def go() -> None:
        socket = RecordingSocket()
        outbox = Outbox(socket)
        first = outbox.put({"op": "route", "id": 1})
        second = outbox.put({"op": "done", "call": "A.0"})
        assert first is second and socket.sent == []  # nothing leaves before the next turn
        await first
        outbox.put({"op": "end", "id": 2})
        await outbox.drain()
        assert socket.sent == [b'[{"op":"route","id":1},{"op":"done","call":"A.0"}]', b'{"op":"end","id":2}']

    asyncio.run(go())


def test_drain_waits_for_a_send_in_progress_and_a_failed_send_reaches_its_frames() -> None:
    async def go() -> None:
        slow = RecordingSocket(delay_s=0.2)
        outbox = Outbox(slow)
        sent = outbox.put({"op": "done", "call": "A.0"})
        await asyncio.sleep(0.05)  # flushed, the send still in progress
        assert not sent.done()
        await outbox.drain()
        assert sent.done() and slow.sent == [b'{"op":"done","call":"A.0"}']

        broken = Outbox(RecordingSocket(error=ConnectionResetError("Cannot write to closing transport")))
        with pytest.raises(ConnectionResetError, match="closing transport"):
            await broken.put({"op": "done", "call": "B.0"})
        broken.put({"op": "done", "call": "C.0"})  # nobody waits for this one: no warning at exit
        await broken.drain()

    asyncio.run(go())


@pytest.mark.parametrize(
    ("message", "frames"),
    [
        (b'{"op":"end","program":"A"}', [{"op": "end", "program": "A"}]),
        ('{"op":"end","program":"A"}', [{"op": "end", "program": "A"}]),
        (b' [{"op":"first","call":"A.0"}, {"op":"end","program":"A"}]', [{"op": "first", "call": "A.0"}, {"op": "end", "program": "A"}]),
        ('\n\t[{"op":"end","program":"A"}]', [{"op": "end", "program": "A"}]),
        (b"[]", []),
    ],
)
def test_split_gives_the_frames_of_a_message(message: bytes | str, frames: list[dict[str, str]]) -> None:
    assert [msgspec.json.decode(frame) for frame in split(message)] == frames


def test_split_refuses_a_batch_that_is_not_json() -> None:
    with pytest.raises(msgspec.DecodeError, match="truncated"):
        split(b'[{"op":"end"')
