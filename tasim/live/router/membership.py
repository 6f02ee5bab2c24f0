"""Which Dynamo instance is which worker, and which workers are serving.

Workers are named ``w0 … wN-1`` in the order of their KV-event endpoints. Which instance is which
worker is learned, not assumed: the router sends an instance a one-block probe and watches which
endpoint reports that block stored. This also refuses to start when a worker publishes no KV
events, the silent misconfiguration that turns a KV router into a load balancer.

After start, `Membership.watch` reads service discovery twice a second. A worker whose instance
left it (Dynamo's file discovery drops a dead process within about 8 s) is lost; so, at once, is
a worker a call could not reach or whose stream broke off (`lose`, from the router). A new
instance is probed like at start and takes over the worker whose endpoint reported the probe: a
restarted or replaced worker, which Dynamo gives a new instance id (the stale-pin failure of
Dynamo #13100 cannot happen: programs follow worker names, not instance ids). A lost worker
whose instance is still listed (a stream broke, the process lives) is probed again every few
seconds and serves again when it answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from tasim.core.model import BlockHash
from tasim.live.hashing import sequence_hashes
from tasim.live.router.kv_events import KvEventSubscriber
from tasim.live.router.live_host import PolicyHost

logger = logging.getLogger("tasim.live.router.membership")

PROBE_TIMEOUT_S = 30.0
CONFIRM_TIMEOUT_S = 5.0  # a worker a pinned call failed on must answer a probe within this
WATCH_INTERVAL_S = 0.5
REPROBE_INTERVAL_S = 3.0  # a lost worker still listed in discovery: how often to try it again
PROBE_DIGIT_BASE = 100  # probe numbers are written in tokens 7 … 106, fine for any vocabulary
PROBE_FIRST_TOKEN = 7


def probe_tokens(number: int, block_size: int) -> list[int]:
    """One full block no workload sends, distinct for every ``number``: token 1 repeated, then
    ``number`` in base 100, then 3."""
    digits: list[int] = []
    while True:
        number, digit = divmod(number, PROBE_DIGIT_BASE)
        digits.append(PROBE_FIRST_TOKEN + digit)
        if not number:
            break
    tail = digits[::-1] + [3]
    if len(tail) > block_size:
        raise ValueError(f"probe number needs {len(tail)} tokens; the block size is {block_size}")
    return [1] * (block_size - len(tail)) + tail


def probe_request(model: str, tokens: list[int]) -> dict[str, Any]:
    return {
        "model": model,
        "token_ids": tokens,
        "stop_conditions": {"max_tokens": 1},
        "sampling_options": {},
        "output_options": {},
        "eos_token_ids": [],
        "annotations": [],
    }


class Membership:
    """``client``: Dynamo's client of the workers' generate endpoint; ``host`` hears of lost
    and joined workers; ``kv`` is told to expect a fresh event sequence from a lost worker."""

    def __init__(self, client: Any, worker_ids: tuple[str, ...], block_size: int, model_name: str, host: PolicyHost, kv: KvEventSubscriber) -> None:
        self.client = client
        self.worker_ids = worker_ids
        self.block_size = block_size
        self.model_name = model_name
        self.host = host
        self.kv = kv
        self.instance_of: dict[str, int] = {}
        self._probes: dict[BlockHash, asyncio.Future[str]] = {}
        self._probe_count = 0
        self._probing: dict[int, asyncio.Task[None]] = {}  # instances with a probe under way
        self._unmapped: dict[int, float] = {}  # new instances whose probe reported no KV event, and when
        self._replaced: set[int] = set()  # instances a worker's replacement took over from: never probed again
        self._last_reprobe: dict[str, float] = {}
        self._confirming: dict[int, asyncio.Future[None]] = {}  # instances being checked after a client's report

    # --- start-up ------------------------------------------------------------------------------

    async def map_all(self) -> None:
        """Wait for one instance per worker and learn which is which."""
        wanted = len(self.worker_ids)
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while len(self.client.instance_ids()) < wanted:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(self.client.instance_ids())} of {wanted} workers registered within {PROBE_TIMEOUT_S:g} s")
            await asyncio.sleep(0.2)
        for instance in sorted(self.client.instance_ids()):
            worker = await self._identify(instance)
            if worker is None:
                raise RuntimeError(f"worker instance {instance} published no KV event for a probe: are KV events enabled on every worker?")
            self.instance_of[worker] = instance
        if sorted(self.instance_of) != sorted(self.worker_ids):
            raise RuntimeError(f"probes mapped instances to {sorted(self.instance_of)}, expected {list(self.worker_ids)}")

    def stored(self, worker: str, blocks: tuple[BlockHash, ...]) -> None:
        """A worker reported blocks stored: resolves the probe that caused it, if any."""
        if not self._probes:
            return
        for block in blocks:
            probe = self._probes.get(block)
            if probe is not None and not probe.done():
                probe.set_result(worker)

    async def _identify(self, instance: int) -> str | None:
        """Probe ``instance``; the worker whose endpoint reports the probe block, or None."""
        self._probe_count += 1
        tokens = probe_tokens(self._probe_count, self.block_size)
        block = sequence_hashes(tokens, self.block_size)[0]
        found = self._probes[block] = asyncio.get_running_loop().create_future()
        try:
            if not await self._answers(instance, tokens):
                return None
            return await asyncio.wait_for(found, timeout=PROBE_TIMEOUT_S)
        except TimeoutError:
            return None
        finally:
            del self._probes[block]

    async def _answers(self, instance: int, tokens: list[int], timeout_s: float = PROBE_TIMEOUT_S) -> bool:
        """Whether ``instance`` completes a one-token call within ``timeout_s``."""

        async def call() -> None:
            async for _ in await self.client.direct(probe_request(self.model_name, tokens), instance):
                pass

        try:
            await asyncio.wait_for(call(), timeout=timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Dynamo raises plain exceptions for unreachable instances
            logger.info("probe of instance %d failed: %s", instance, exc)
            return False
        return True

    # --- losing and joining ---------------------------------------------------------------------

    def lose(self, worker: str, instance: int, reason: str) -> None:
        """``instance`` of ``worker`` failed a call or left discovery. Nothing happens when the
        worker was lost already, or has been replaced by another instance meanwhile."""
        if self.instance_of.get(worker) != instance or not self.host.worker_lost(worker, reason):
            return
        self.kv.forget(worker)  # a restarted worker numbers its events from the start again
        self._last_reprobe[worker] = time.monotonic()
        logger.warning("worker %s (instance %d) lost: %s", worker, instance, reason)

    async def confirm(self, worker: str, instance: int, reason: str) -> None:
        """A client reports that a call pinned to ``instance`` of ``worker`` failed: the worker
        is lost if that instance does not answer a probe. Reports about one instance share one
        probe; a worker already lost or replaced is not probed."""
        if self.instance_of.get(worker) != instance or worker in self.host.lost:
            return
        check = self._confirming.get(instance)
        if check is None:
            check = self._confirming[instance] = asyncio.ensure_future(self._confirm(worker, instance, reason))
            check.add_done_callback(lambda _: self._confirming.pop(instance, None))
        await asyncio.shield(check)

    async def _confirm(self, worker: str, instance: int, reason: str) -> None:
        self._probe_count += 1
        if not await self._answers(instance, probe_tokens(self._probe_count, self.block_size), CONFIRM_TIMEOUT_S):
            self.lose(worker, instance, reason)

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                self.check(set(self.client.instance_ids()))
            except Exception:  # a bug here must not stop the watch
                logger.exception("checking the workers failed")

    def check(self, listed: set[int]) -> None:
        """One look at discovery's ``listed`` instances."""
        now = time.monotonic()
        for worker, instance in list(self.instance_of.items()):
            if instance not in listed:
                self.lose(worker, instance, "left service discovery")
            elif worker in self.host.lost and now - self._last_reprobe.get(worker, 0.0) >= REPROBE_INTERVAL_S:
                self._last_reprobe[worker] = now
                self._start(instance, self._reprobe(worker, instance))
        self._replaced &= listed  # instance ids are random 64-bit numbers: none comes back
        known = set(self.instance_of.values()) | self._replaced
        for instance in sorted(listed - known):
            if now - self._unmapped.get(instance, -PROBE_TIMEOUT_S) >= PROBE_TIMEOUT_S:
                self._start(instance, self._join(instance))

    def close(self) -> None:
        for task in (*self._probing.values(), *self._confirming.values()):
            task.cancel()

    def _start(self, instance: int, probe: Coroutine[Any, Any, None]) -> None:
        if instance in self._probing:
            probe.close()
            return
        task = self._probing[instance] = asyncio.ensure_future(probe)
        task.add_done_callback(lambda _: self._probing.pop(instance, None))

    async def _join(self, instance: int) -> None:
        worker = await self._identify(instance)
        if worker is None:
            self._unmapped[instance] = time.monotonic()
            logger.warning("new worker instance %d answered no probe with a KV event; it gets no traffic for now", instance)
            return
        self._unmapped.pop(instance, None)
        # Only one process can publish on an endpoint, so the worker's old instance is gone.
        old = self.instance_of[worker]
        self.lose(worker, old, f"replaced by instance {instance}")
        self._replaced.add(old)
        self.instance_of[worker] = instance
        if self.host.worker_joined(worker):
            logger.warning("worker %s joined as instance %d", worker, instance)

    async def _reprobe(self, worker: str, instance: int) -> None:
        """A lost worker whose instance discovery still lists serves again once it answers."""
        self._probe_count += 1
        answers = await self._answers(instance, probe_tokens(self._probe_count, self.block_size))
        if answers and self.instance_of.get(worker) == instance and self.host.worker_joined(worker):
            logger.warning("worker %s (instance %d) answers again", worker, instance)
