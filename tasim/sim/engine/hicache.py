"""Host (CPU) KV tier of one engine with SGLang HiCache's semantics (``HiRadixCache``).

Read from ``sgl-project/sglang``: ``python/sglang/srt/mem_cache/hiradix_cache.py`` at 263bc85d
(cited as ``hiradix``), ``mem_cache/radix_cache.py`` at 006b0e3d (``radix``),
``managers/cache_controller.py`` at 001067ff (``controller``) and the scheduler's
``process_batch_result_prefill`` / ``_decode`` (``output_processor``). tasim's GPU block is
SGLang's page; SGLang's radix nodes are runs of pages, kept here per block: a node's hit count,
host copy and recency are its blocks' (a node split copies them, radix ``_split_node``).

The tree. Every block some request *inserted* has a `_Node`: on the GPU (the engine's block
pool holds its hash), with a host copy, or both. A request inserts its full blocks when its
prefill completes unfinished (``cache_unfinished_req``) and when it finishes
(``cache_finished_req``, its committed tokens: all but the last generated one), as
output_processor does; chunked-prefill inserts and decode steps insert nothing countable. An
insert adds one hit to each of its blocks on the GPU, new ones included; a host-only block it
meets was recomputed and is re-adopted without a hit (hiradix ``insert``, ``_inc_hit_count``).

Write policies (``hicache_write_policy``; hiradix ``__init__``):

* ``write_through`` / ``write_through_selective``: a block not backed up whose hits reach 1 / 2
  is written to the host at that insert; an insert's blocks to write form one D2H copy per run
  of consecutive blocks (SGLang: one per node), entering the D2H lane at the end of the step
  that inserted them (``controller.write`` starts it at once). The written blocks and their
  prefix are held on the GPU until the copy is done (``inc_lock_ref`` in ``write_backup``): a
  reference in the block pool, released by `HiCache.complete`. On GPU eviction a backed-up
  block stays as host-only; one not backed up leaves the tree (``_evict_regular``).
* ``write_back``: no hit counting; a block is written only when the GPU evicts it not backed
  up, and the eviction waits for the copy (``evict`` then ``writing_check(write_back=True)``):
  the copy enters the D2H lane when the step that evicted it starts, and that step cannot start
  its forward before it is done (`HiCache.flush_until`).

A write needs host slots: if too few are free, ``evict_host`` of the write's size, then the
write is skipped if they are still too few (the block stays not backed up; a later insert tries
again). SGLang's write-back asserts instead (``assert node.backuped``); tasim drops the block.

Host eviction (hiradix ``evict_host``): leaves of the tree only, least recently used first, and
only host-only blocks (a block also on the GPU keeps its host copy); evicting one leaves the
tree and may make its parent the next leaf. Recency (radix ``LRUStrategy``: the node's
``last_access_time``) is a counter stamped on every block of an insert (root first, as SGLang's
per-node ``time.monotonic()``) and on the host-only blocks a lookup walks. Lookups do not stamp
the GPU prefix (SGLang's ``match_prefix`` does): walking it per admission would cost what the
block pool's extents save, and it matters only once those blocks leave the GPU.

Lookup and load-back (hiradix ``match_prefix``, ``init_load_back``, ``load_back``): after the
GPU prefix, the contiguous host-only blocks (the GPU prefix and the lookup are capped at the
request's tokens less one, as SGLang matches ``fill_ids[:-1]`` page-aligned); all of them are
loaded, or none if they are fewer than ``load_back_threshold`` tokens (default 10). The host
copy stays. A load is not parked as vLLM's is: SGLang allocates the device pages at once, puts
them in the tree (``node.value``) and starts the H2D copy when the batch launches
(``ready_to_load_host_cache`` → ``controller.start_loading``), layer by layer, with each layer's
forward waiting for that layer's copy (``LayerDoneCounter.wait_until``). tasim models this as:
the blocks are the request's GPU blocks from its admission, the copy enters the H2D lane when
that step starts (or once a write-back of its blocks is done), and the step cannot end before
the copy is done: its duration is at least the copy's. This ignores the compute of the last
layer after its copy (a lower bound on that step) and that a load waits behind the batch's
write-backs.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Literal

from tasim.core.model import BlockHash
from tasim.sim.engine.block_pool import BlockPool, Claim
from tasim.sim.engine.host_tier import TransferLane

WritePolicy = Literal["write_through", "write_through_selective", "write_back"]
WRITE_POLICIES: tuple[WritePolicy, ...] = ("write_through", "write_through_selective", "write_back")

_NONE = 0  # no host copy
_WRITING = 1  # its write is in flight (the block is held on the GPU meanwhile)
_READY = 2  # a host copy


class _Node:
    """One inserted block: its parent's hash (None at depth 0), the inserted blocks hanging
    off it, its hits, where its KV is, and its recency stamp."""

    __slots__ = ("parent", "children", "hits", "on_gpu", "host", "stamp", "readopted", "ready_at")

    def __init__(self, parent: BlockHash | None) -> None:
        self.parent = parent
        self.children = 0
        self.hits = 0
        self.on_gpu = True
        self.host = _NONE
        self.stamp = 0
        self.readopted = False  # recomputed while host-only: its next insert adds no hit
        self.ready_at = 0.0  # a write-back: when its host copy is complete


class _Copy:
    """One copy job: a write (D2H) of ``keys`` holding ``lock`` on the GPU, or a load (H2D)."""

    __slots__ = ("load", "keys", "lock", "done")

    def __init__(self, load: bool, keys: list[BlockHash], lock: Claim | None, done: float) -> None:
        self.load = load
        self.keys = keys
        self.lock = lock
        self.done = done


class HiCache:
    """SGLang HiCache's host tier behind one engine's GPU block pool (see the module docstring).

    The engine's KV cache manager tells it of inserts (`insert`), of the GPU's stored and
    removed blocks (`on_gpu_events`), asks it for host hits (`lookup`), starts loads
    (`load_back`) and completes the copies done by a step's start (`complete`)."""

    def __init__(
        self,
        capacity: int,
        block_pool: BlockPool,
        block_size: int,
        block_bytes: int,
        d2h_gbps: float | None,
        h2d_gbps: float | None,
        write_policy: WritePolicy = "write_through",
        load_back_threshold: int = 10,
    ) -> None:
        if capacity <= 0:
            raise ValueError("host capacity must be positive")
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"unknown write policy {write_policy!r}")
        self.capacity = capacity
        self.block_pool = block_pool
        self.block_size = block_size
        self.block_bytes = block_bytes
        self.write_policy = write_policy
        self.write_back = write_policy == "write_back"
        self.write_threshold = 1 if write_policy == "write_through" else 2
        self.load_back_threshold = load_back_threshold
        self.d2h = TransferLane(d2h_gbps)
        self.h2d = TransferLane(h2d_gbps)
        self.used = 0  # host slots holding a copy or a write in flight
        self.hits = 0  # blocks loaded back
        self.stored = 0  # blocks whose write completed
        self.evicted = 0  # host copies evicted
        self.next_done = float("inf")  # the earliest done of the copies in flight
        self._nodes: dict[BlockHash, _Node] = {}
        self._stamp = 0
        # Host-only leaves that may be next to evict: (stamp, serial, key), stale entries skipped.
        self._candidates: list[tuple[int, int, BlockHash]] = []
        self._serial = 0
        self._copies: list[_Copy] = []  # in flight, in submission order
        self._now = 0.0  # the start of the step being scheduled
        self._write_back_done: dict[BlockHash, float] = {}  # written back in this step -> done
        self._events: dict[BlockHash, bool] = {}  # host KV events: key -> stored (else removed)

    # --- queries ---------------------------------------------------------------------------

    @property
    def free(self) -> int:
        return self.capacity - self.used

    @property
    def evictions_wait(self) -> bool:
        """Whether a GPU eviction may wait for a write (write-back)."""
        return self.write_back

    def node_state(self, key: BlockHash) -> tuple[int, bool, str] | None:
        """A block's hits, whether it is on the GPU and its host copy ('none', 'writing',
        'ready'); None when it is not in the tree (for tests and debugging)."""
        node = self._nodes.get(key)
        if node is None:
            return None
        return node.hits, node.on_gpu, ("none", "writing", "ready")[node.host]

    def host_only(self) -> list[BlockHash]:
        """Blocks whose KV is only on the host, in host eviction order if all were leaves (for tests)."""
        nodes = self._nodes
        keys = [key for key, node in nodes.items() if not node.on_gpu and node.host == _READY]
        return sorted(keys, key=lambda key: nodes[key].stamp)

    def lock_claims(self) -> list[Claim]:
        """The GPU references held by writes in flight (for the block pool's audit)."""
        return [copy.lock for copy in self._copies if copy.lock is not None]

    def lookup(self, hashes: Sequence[BlockHash], start: int, limit: int) -> int:
        """Host-only blocks of ``hashes`` from ``start`` (the GPU prefix) below ``limit``, all of
        them or 0 when they are fewer than ``load_back_threshold`` tokens; stamps them."""
        nodes = self._nodes
        depth = start
        while depth < limit:
            node = nodes.get(hashes[depth])
            if node is None or node.on_gpu or node.host != _READY:
                break
            depth += 1
        blocks = depth - start
        if not blocks:
            return 0
        for d in range(start, depth):
            self._touch(hashes[d], nodes[hashes[d]])
        return blocks if blocks * self.block_size >= self.load_back_threshold else 0

    # --- the engine's calls --------------------------------------------------------------------

    def load_back(self, hashes: Sequence[BlockHash], start: int, stop: int, now: float) -> float:
        """Load the host-only blocks ``start`` to ``stop`` (a `lookup` hit), now the request's GPU
        blocks; returns when the H2D copy is done. The host copies stay."""
        nodes = self._nodes
        enter = now
        for depth in range(start, stop):
            node = nodes[hashes[depth]]
            node.on_gpu = True
            if node.ready_at > enter:
                enter = node.ready_at
        self.hits += stop - start
        done = self.h2d.submit(enter, (stop - start) * self.block_bytes)
        self._in_flight(_Copy(True, [], None, done))
        return done

    def insert(self, hashes: Sequence[BlockHash], stop: int, now: float) -> None:
        """A request inserts its blocks ``0`` to ``stop`` (all on the GPU, held by it) at ``now``,
        the end of the step: hits counted, and under write-through the blocks due written."""
        nodes = self._nodes
        count = not self.write_back
        threshold = self.write_threshold
        due: list[int] = []
        parent: BlockHash | None = None
        for depth in range(stop):
            key = hashes[depth]
            node = nodes.get(key)
            if node is None:
                node = nodes[key] = _Node(parent)
                if parent is not None:
                    nodes[parent].children += 1
            elif node.readopted or not node.on_gpu:
                node.readopted = False  # recomputed over its host copy: no hit (hiradix insert)
                node.on_gpu = True
                self._touch(key, node)
                parent = key
                continue
            self._touch(key, node)
            parent = key
            if count:
                node.hits += 1
                if node.host == _NONE and node.hits >= threshold:
                    due.append(depth)
        run_start = 0
        for i, depth in enumerate(due):
            if i + 1 == len(due) or due[i + 1] != depth + 1:
                self._write_through(hashes, due[run_start], depth + 1, now)
                run_start = i + 1

    def on_gpu_events(self, stored: Sequence[BlockHash], removed: Sequence[BlockHash]) -> None:
        """The GPU pool cached ``stored`` and evicted ``removed`` (net, since the last call)."""
        nodes = self._nodes
        for key in stored:
            node = nodes.get(key)
            if node is not None and not node.on_gpu:
                node.on_gpu = True
                node.readopted = True
        self.on_gpu_evicted(removed)

    def on_gpu_evicted(self, removed: Sequence[BlockHash]) -> None:
        """The GPU pool just evicted ``removed``: told at once, as SGLang's tree changes when it
        evicts, so that a lookup later in the same step finds their host copies (a block told
        twice is ignored the second time)."""
        nodes = self._nodes
        for key in removed:
            node = nodes.get(key)
            if node is None or not node.on_gpu:
                continue  # never inserted: not in SGLang's tree
            node.on_gpu = False
            if node.host != _NONE:  # host-only now (a write in flight holds its block: never here)
                if node.host == _READY and not node.children:
                    self._push(key, node)
            elif not (self.write_back and self._write_back(key, node)):
                self._delete(key, node)

    def flush_until(self, removed: Sequence[BlockHash]) -> float:
        """When the write-backs of ``removed`` (just evicted from the GPU) are done (0.0: none)."""
        until = 0.0
        done_of = self._write_back_done
        if done_of:
            for key in removed:
                done = done_of.get(key, 0.0)
                if done > until:
                    until = done
        return until

    def complete(self, now: float) -> None:
        """A step starts at ``now``: complete the copies done by then, in submission order (a
        write's blocks become host copies and are no longer held on the GPU)."""
        self._now = now
        self._write_back_done = {}
        if self.next_done > now:
            return
        still: list[_Copy] = []
        earliest = float("inf")
        nodes = self._nodes
        for copy in self._copies:
            if copy.done > now:
                still.append(copy)
                earliest = min(earliest, copy.done)
                continue
            if copy.lock is not None:
                self.block_pool.release(copy.lock)
            for key in copy.keys:
                node = nodes.get(key)
                if node is not None and node.host == _WRITING:
                    node.host = _READY
                    self.stored += 1
                    self._event(key, True)
                    if not node.on_gpu and not node.children:
                        self._push(key, node)
        self._copies = still
        self.next_done = earliest

    def reset(self, now: float) -> None:
        """Empty the tier at ``now``, as SGLang's cache flush before a weight update does
        (hiradix ``reset``: the controller's queues cleared, the host pool cleared, the tree
        rebuilt; verl-recipe's SGLang engine flushes before every update): writes still in
        flight are dropped and their GPU blocks released, every host copy is reported removed.
        SGLang flushes only with nothing running, so no load may be in flight (refused)."""
        self.complete(now)
        if any(copy.load for copy in self._copies):
            raise RuntimeError("the prefix cache cannot be reset while a host load is in flight")
        for copy in self._copies:
            if copy.lock is not None:
                self.block_pool.release(copy.lock)
        for key, node in self._nodes.items():
            if node.host == _READY:
                self._event(key, False)
        self._nodes = {}
        self._candidates = []
        self._copies = []
        self._write_back_done = {}
        self.used = 0
        self.next_done = float("inf")

    def take_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """Host KV events since the last call: keys stored (written) and removed (evicted)."""
        events = self._events
        self._events = {}
        return [key for key, stored in events.items() if stored], [key for key, stored in events.items() if not stored]

    def audit(self) -> str | None:
        """The first broken invariant of the bookkeeping, or None."""
        nodes = self._nodes
        used = sum(1 for node in nodes.values() if node.host != _NONE)
        if used != self.used or used > self.capacity:
            return f"{used} host copies, the tier counts {self.used} of {self.capacity}"
        children: dict[BlockHash, int] = {}
        for key, node in nodes.items():
            if not node.on_gpu and node.host == _NONE:
                return f"block {key} is in the tree with its KV nowhere"
            if node.parent is not None and node.parent in nodes:
                children[node.parent] = children.get(node.parent, 0) + 1
        for key, node in nodes.items():
            if node.children != children.get(key, 0):
                return f"block {key} counts {node.children} children, {children.get(key, 0)} hang off it"
        return None

    # --- internals -------------------------------------------------------------------------

    def _touch(self, key: BlockHash, node: _Node) -> None:
        self._stamp += 1
        node.stamp = self._stamp
        if not node.on_gpu and node.host == _READY and not node.children:
            self._push(key, node)

    def _push(self, key: BlockHash, node: _Node) -> None:
        self._serial += 1
        heapq.heappush(self._candidates, (node.stamp, self._serial, key))
        if len(self._candidates) > 2 * len(self._nodes) + 64:
            nodes = self._nodes
            self._candidates = [entry for entry in self._candidates if self._evictable(nodes.get(entry[2]), entry[0])]
            heapq.heapify(self._candidates)

    @staticmethod
    def _evictable(node: _Node | None, stamp: int) -> bool:
        return node is not None and node.stamp == stamp and not node.on_gpu and node.host == _READY and not node.children

    def _in_flight(self, copy: _Copy) -> None:
        self._copies.append(copy)
        if copy.done < self.next_done:
            self.next_done = copy.done

    def _allocate(self, count: int) -> bool:
        """Take ``count`` host slots; if too few are free, evict the host of ``count`` first
        (``write_backup``: ``evict_host(len(node.value))`` then one more try)."""
        if count > self.free:
            self._evict_host(count)
            if count > self.free:
                return False
        self.used += count
        return True

    def _write_through(self, hashes: Sequence[BlockHash], start: int, stop: int, now: float) -> None:
        """Write blocks ``start`` to ``stop`` (on the GPU), holding them and their prefix there
        until the copy is done; skipped when the host has no room for them."""
        if not self._allocate(stop - start):
            return
        nodes = self._nodes
        keys = list(hashes[start:stop])
        for key in keys:
            nodes[key].host = _WRITING
        resident, _ = self.block_pool.prefix_hits(hashes, stop)
        lock = self.block_pool.acquire(hashes, resident)
        done = self.d2h.submit(now, len(keys) * self.block_bytes)
        self._in_flight(_Copy(False, keys, lock, done))

    def _write_back(self, key: BlockHash, node: _Node) -> bool:
        """Write back a block the GPU just evicted; False when the host has no room for it."""
        if not self._allocate(1):
            return False
        done = self.d2h.submit(self._now, self.block_bytes)
        node.host = _READY
        node.ready_at = done
        self.stored += 1
        self._event(key, True)
        self._write_back_done[key] = done
        if not node.children:
            self._push(key, node)
        return True

    def _delete(self, key: BlockHash, node: _Node) -> None:
        """The block leaves the tree (its host copy, if any, is already gone). A block evicted
        from the GPU before its children (rare: its write was skipped for want of room while
        theirs was not) takes its host-only subtree with it, which no lookup can reach any more:
        SGLang unlinks that subtree and never frees its host slots; tasim frees them."""
        nodes = self._nodes
        del nodes[key]
        if node.children:
            for child_key in [k for k, child in nodes.items() if child.parent == key]:
                child = nodes[child_key]
                if child.on_gpu or child.host != _READY:
                    child.parent = None  # still on the GPU: a root of its own from now on
                    continue
                child.host = _NONE
                self.used -= 1
                self.evicted += 1
                self._event(child_key, False)
                self._delete(child_key, child)
        parent_key = node.parent
        if parent_key is None:
            return
        parent = self._nodes.get(parent_key)
        if parent is None:
            return
        parent.children -= 1
        if not parent.children and not parent.on_gpu and parent.host == _READY:
            self._push(parent_key, parent)

    def _evict_host(self, count: int) -> None:
        """Evict up to ``count`` host-only leaves, least recently used first (``evict_host``)."""
        nodes = self._nodes
        candidates = self._candidates
        evicted = 0
        while evicted < count and candidates:
            stamp, _, key = heapq.heappop(candidates)
            node = nodes.get(key)
            if not self._evictable(node, stamp):
                continue
            assert node is not None
            node.host = _NONE
            self.used -= 1
            self.evicted += 1
            evicted += 1
            self._event(key, False)
            self._delete(key, node)

    def _event(self, key: BlockHash, stored: bool) -> None:
        events = self._events
        events.pop(key, None)
        events[key] = stored
