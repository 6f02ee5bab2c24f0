"""The KV cache manager: the scheduler's one way to the KV blocks, shaped like vLLM v1's
``KVCacheManager`` (``vllm/v1/core/kv_cache_manager.py``).

The scheduler asks it for a request's computed prefix (`KVCacheManager.get_computed_blocks`),
whether the whole request fits (`KVCacheManager.fits`), for slots for the tokens it schedules
(`KVCacheManager.allocate_slots`: blocks taken, evicting cached ones if need be, and the blocks
the tokens complete cached under their hashes), to free a request's blocks, and for the KV
events since it last asked (`KVCacheManager.take_events`). It also keeps the pins (blocks held
for a program between its turns) and the counters a worker sample reads. Behind it is the block
pool (`tasim.sim.engine.block_pool`), which only it touches.

A request's blocks are kept on the request itself (`RequestBlocks`, which the engine's request
record extends), as plain attributes the compiled scheduler reads at C speed.

A computed prefix (`ComputedBlocks`) counts the blocks on the GPU apart from blocks found in a
slower tier (``host_blocks``, vLLM's externally computed tokens): those need no computing but do
need GPU blocks to be loaded into, which `allocate_slots` takes as it takes any others. That tier
is the optional host tier (`tasim.sim.engine.host_tier`, vLLM 0.31's OffloadingConnector), which
the manager keeps with its two copy lanes: it looks the next blocks up there after the GPU prefix,
starts loads (`KVCacheManager.start_load`) and stores (`KVCacheManager.offer_stores`), times
them when the step that made them ends (`KVCacheManager.submit_transfers`) and completes those
that are done (`KVCacheManager.complete_transfers`). Without a tier ``host_blocks`` is 0.
With ``semantics: sglang`` the tier is SGLang HiCache's instead (`tasim.sim.engine.hicache`),
behind the same lookup, events and copy lanes, plus its own calls (`KVCacheManager.insert`,
`KVCacheManager.load_back`).

Folding runs of steps (`tasim.sim.engine.fast_forward`) asks it which of the next steps touch
the pool (`KVCacheManager.plan_boundaries`); each such step then reserves slots as a scheduled
step would.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Final, TypeVar

from tasim.core.model import BlockHash
from tasim.sim.engine.block_pool import BlockPool, Claim, Eviction
from tasim.sim.engine.hicache import HiCache, WritePolicy
from tasim.sim.engine.host_tier import ExtentHostPool, HostAccess, HostCopy, HostPool, TransferLane
from tasim.sim.engine.mocker_host_tier import MockerHostPool

# touches of the pool in a folded run: step, running position, then taking a block (0) before
# completing one (1); a prefill chunk (2) comes last in running order
_TOUCH_ORDER = itemgetter(0, 1, 2)


class RequestBlocks:
    """One request's KV blocks, as the KV cache manager keeps them (the engine's request record
    extends it), and its tokens whose KV is computed, which the scheduler advances."""

    __slots__ = ("request_id", "block_hashes", "computed", "claim", "phys", "full_done", "host_access", "next_store", "host_jobs")

    def __init__(self, request_id: str, block_hashes: Sequence[BlockHash]) -> None:
        self.request_id = request_id
        self.block_hashes = block_hashes  # the chained hash of each of its full blocks
        self.computed = 0  # tokens whose KV is computed (or cached)
        self.claim = Claim(block_hashes)  # the cached blocks it references
        self.phys = 0  # physical blocks it occupies (held + private copies + tail)
        self.full_done = 0  # leading full blocks accounted for (held or private duplicate)
        # host tier only: the host keys it observed, its first block not yet offered for storing,
        # and its transfers in flight (vLLM's request transfer_jobs: a lookup waits for them)
        self.host_access: HostAccess | None = None
        self.next_store = 0
        self.host_jobs = 0


class ComputedBlocks:
    """A request's leading blocks whose KV is already computed somewhere (`get_computed_blocks`).
    Read-only (``Final``); a plain class, not a frozen dataclass: compiled, a dataclass is built by
    its interpreted ``__init__``, and one is built for every admission the scheduler tries."""

    __slots__ = ("gpu_blocks", "gpu_active_blocks", "host_blocks", "host_deferred")

    def __init__(self, gpu_blocks: int, gpu_active_blocks: int, host_blocks: int = 0, host_deferred: bool = False) -> None:
        self.gpu_blocks: Final = gpu_blocks  # cached in the GPU pool
        self.gpu_active_blocks: Final = gpu_active_blocks  # of those, referenced already: a new reference costs no capacity
        self.host_blocks: Final = host_blocks  # the next ones, in the host tier: computed, but not on the GPU
        # the host run holds a block being stored or loaded: vLLM looks the request up again next step
        self.host_deferred: Final = host_deferred

    @property
    def blocks(self) -> int:
        """Leading blocks the request need not compute."""
        return self.gpu_blocks + self.host_blocks


_NOTHING_COMPUTED = ComputedBlocks(0, 0)


class HostTierSetup:
    """An engine's host tier: ``blocks`` slots, ``block_bytes`` copied per block and rank, each
    copy lane's bandwidth in GB/s (0: instant), and whose semantics it has: vLLM's, Dynamo
    mocker's (``dynamo_mocker``, `tasim.sim.engine.mocker_host_tier`) or SGLang's (``sglang``,
    with its write policy and load-back threshold in tokens)."""

    __slots__ = (
        "blocks",
        "block_bytes",
        "d2h_gbps",
        "h2d_gbps",
        "store_threshold",
        "semantics",
        "write_policy",
        "load_back_threshold",
        "cohort_ranks",
    )

    def __init__(
        self,
        blocks: int,
        block_bytes: int,
        d2h_gbps: float = 32.0,
        h2d_gbps: float = 32.0,
        store_threshold: int = 0,
        semantics: str = "vllm",
        write_policy: WritePolicy = "write_through",
        load_back_threshold: int = 10,
        cohort_ranks: dict[BlockHash, tuple[int, ...]] | None = None,
    ) -> None:
        self.blocks: Final = blocks
        self.block_bytes: Final = block_bytes
        self.d2h_gbps: Final = d2h_gbps
        self.h2d_gbps: Final = h2d_gbps
        self.store_threshold: Final = store_threshold
        self.semantics: Final = semantics
        self.write_policy: Final = write_policy
        self.load_back_threshold: Final = load_back_threshold
        self.cohort_ranks: Final = cohort_ranks  # dynamo_mocker: see `MockerHostPool`


class _Transfer:
    """One copy job of a request: a load (H2D) of its host hit, or a store (D2H) of its blocks."""

    __slots__ = ("copy", "request", "done")

    def __init__(self, copy: HostCopy, request: RequestBlocks) -> None:
        self.copy = copy
        self.request = request
        self.done = 0.0  # when it is copied, once submitted

    @property
    def load(self) -> bool:
        return self.copy.load


class BlockBoundary:
    """A folded step that touches the pool (`KVCacheManager.plan_boundaries`): the requests that
    take or complete a block in it, in running order, each with the tokens its slots reach then."""

    __slots__ = ("index", "reserves")

    def __init__(self, index: int) -> None:
        self.index = index  # 1-based step number within the run
        self.reserves: list[tuple[RequestBlocks, int]] = []


def _deadline_order(job: _Transfer) -> tuple[float, bool]:
    return job.done, job.load


def _copies_any(copy: HostCopy, prefixes: Sequence[tuple[Sequence[BlockHash], int]]) -> bool:
    """Whether ``copy`` holds a block of any of the chain prefixes. Chained hashes: a block is
    at one depth, and two chains that share it share every block above it, so a run of the
    copy shares a block with a prefix exactly when they share the run's first block."""
    hashes = copy.hashes
    for start, stop in copy.runs:
        for chain, blocks in prefixes:
            if start < blocks and start < stop and hashes[start] == chain[start]:
                return True
    return False


def _blocks_for(tokens: int, block_size: int) -> int:
    """`tasim.core.model.blocks_for`, compiled with this module: a call from here to that one, an
    interpreted function, costs more than all else `allocate_slots` does."""
    return -(-tokens // block_size)


# any request with blocks: a step's list of the engine's own records is passed as it is (a typed
# list, which compiled code walks without the generic sequence protocol)
_Request = TypeVar("_Request", bound=RequestBlocks)


class KVCacheManager:
    """One engine's KV blocks, as its scheduler asks for them (see the module docstring)."""

    def __init__(
        self, num_blocks: int, block_size: int, enable_caching: bool = True, eviction: Eviction = "lru", cache_duplicates: bool = False
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, eviction, cache_duplicates)
        self._pins: dict[str, Claim] = {}  # program -> blocks kept referenced
        self.host: HostPool | None = None
        self.hicache: HiCache | None = None  # the host tier with SGLang's semantics instead
        self.mocker_host: MockerHostPool | None = None  # the same pool, with Dynamo mocker's semantics
        self._host_block_bytes = 0
        self.d2h = self.h2d = TransferLane(0.0)
        self._unsubmitted: list[_Transfer] = []  # made by the step being scheduled
        self._in_flight: list[_Transfer] = []  # submitted, not yet seen done
        self.next_transfer_done = float("inf")  # the earliest done of those in flight

    def add_host_tier(self, setup: HostTierSetup) -> None:
        """Put a host tier behind the GPU pool (prefix caching must be on)."""
        if not self.enable_caching:
            raise ValueError("a host tier needs prefix caching")
        if setup.semantics == "sglang":
            self.hicache = HiCache(
                setup.blocks,
                self.block_pool,
                self.block_size,
                setup.block_bytes,
                setup.d2h_gbps,
                setup.h2d_gbps,
                setup.write_policy,
                setup.load_back_threshold,
            )
            self.d2h, self.h2d = self.hicache.d2h, self.hicache.h2d
            return
        if setup.semantics == "dynamo_mocker":
            self.host = self.mocker_host = MockerHostPool(setup.blocks, setup.store_threshold, cohort_ranks=setup.cohort_ranks)
        else:
            self.host = ExtentHostPool(setup.blocks, setup.store_threshold)
        self._host_block_bytes = setup.block_bytes
        self.d2h = TransferLane(setup.d2h_gbps)
        self.h2d = TransferLane(setup.h2d_gbps)

    # --- what a worker sample reads ----------------------------------------------------------

    @property
    def active(self) -> int:
        """Blocks referenced by requests or pins, or occupied by a request outside the cache."""
        return self.block_pool.active

    @property
    def cached_blocks(self) -> int:
        return self.block_pool.cached_blocks

    @property
    def available(self) -> int:
        """Blocks an allocation can get: free plus evictable."""
        return self.block_pool.available

    # --- requests ----------------------------------------------------------------------------

    def cacheable_blocks(self, num_tokens: int) -> int:
        """Leading full blocks of ``num_tokens`` tokens that a prefix hit may cover: at least one
        token is always computed, as vLLM does for a fully cached prompt."""
        return (num_tokens - 1) // self.block_size

    def get_computed_blocks(self, request: RequestBlocks, num_tokens: int) -> ComputedBlocks:
        """The longest computed prefix of the request's first ``num_tokens`` tokens (none without
        prefix caching)."""
        if not self.enable_caching:
            return _NOTHING_COMPUTED
        hits, active = self.block_pool.prefix_hits(request.block_hashes, self.cacheable_blocks(num_tokens))
        host = self.host
        if host is None:
            if self.hicache is not None:  # SGLang matches the same tokens on both tiers
                return ComputedBlocks(hits, active, self.hicache.lookup(request.block_hashes, hits, self.cacheable_blocks(num_tokens)))
            return ComputedBlocks(hits, active)
        full = num_tokens // self.block_size
        if self.mocker_host is not None and hits < full and self.block_pool.prefix_hits(request.block_hashes, full)[0] == full:
            # the mocker looks no further when the GPU holds every full block, the last one too
            # (AISimulate adapter.rs, lookup_visited: base_g1_blocks >= prompt_keys.len())
            return ComputedBlocks(hits, active)
        # vLLM caps the host hit at the request's tokens, not one less (connector/scheduler.py:772-781)
        blocks, deferred = host.lookup(request.block_hashes, hits, full)
        return ComputedBlocks(hits, active, blocks, deferred)

    def fits(self, num_tokens: int, computed: ComputedBlocks, reserved: int = 0) -> bool:
        """Whether blocks for all ``num_tokens`` tokens could be had now, given the request's
        computed prefix (vLLM's ``full_sequence_must_fit``), leaving ``reserved`` blocks."""
        return _blocks_for(num_tokens, self.block_size) - computed.gpu_active_blocks <= self.block_pool.available - reserved

    def allocate_slots(
        self,
        request: RequestBlocks,
        num_tokens: int,
        new_computed: ComputedBlocks | None = None,
        release_pin: str | None = None,
        delay_caching: bool = False,
    ) -> bool:
        """Hold blocks for the request's first ``num_tokens`` tokens and cache the full blocks they
        complete; False, with nothing taken, when the blocks cannot be had.

        ``new_computed``: on admission, the computed prefix the request starts from, which it then
        references (ask `fits` first: the request keeps those references if its new blocks cannot
        be had). ``release_pin``: a pin whose blocks the request takes over, released once the
        request references its prefix and before allocating, so what the pin kept beyond it can
        be evicted for the request."""
        if new_computed is not None:
            hits = new_computed.gpu_blocks
            request.claim = self.block_pool.acquire(request.block_hashes, hits)
            request.phys = request.full_done = hits
            if release_pin is not None:
                self.unpin(release_pin)
        bs = self.block_size
        phys = request.phys
        if num_tokens > phys * bs:  # a block to take
            need = _blocks_for(num_tokens, bs) - phys
            pool = self.block_pool
            removed = len(pool.removed)
            if not pool.allocate(need):
                return False
            if self.hicache is not None and len(pool.removed) > removed:
                self.hicache.on_gpu_evicted(pool.removed[removed:])
            request.phys = phys + need
        full = num_tokens // bs
        if full > request.full_done and not delay_caching:  # a block to fill
            if self.enable_caching:
                self.block_pool.register_run(request.claim, request.full_done, full)
            request.full_done = full
        return True

    def free(self, request: RequestBlocks) -> None:
        """Release the request's blocks, its deepest first (they are evicted first); its cached
        ones stay cached until evicted."""
        self.block_pool.release_private(request.phys - request.claim.blocks)
        self.block_pool.release(request.claim)
        request.phys = request.full_done = 0

    def host_totals(self) -> tuple[int, float, float]:
        """Tokens stored to the host tier, and seconds each copy lane (D2H, H2D) was busy."""
        if self.host is not None:
            stored = self.host.stored
        elif self.hicache is not None:
            stored = self.hicache.stored
        else:
            return 0, 0.0, 0.0
        return stored * self.block_size, self.d2h.busy_s, self.h2d.busy_s

    def take_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """Blocks stored and blocks removed since the last call (see `BlockPool.drain_events`)."""
        if self.hicache is not None:
            stored, removed = self.block_pool.drain_events()
            self.hicache.on_gpu_events(stored, removed)
            self.next_transfer_done = self.hicache.next_done  # write-backs
            return stored, removed
        return self.block_pool.drain_events()

    # --- the host tier -----------------------------------------------------------------------

    def start_load(self, request: RequestBlocks, computed: ComputedBlocks, enter_at: float | None = None) -> None:
        """Pin the host hit of ``computed`` (after its GPU prefix) for one load, timed by the next
        `submit_transfers` (vLLM), or entering its lane at ``enter_at`` (Dynamo's mocker); the
        request stores nothing it loaded or found on the GPU."""
        host = self.host
        assert host is not None, "no host tier"
        access = request.host_access
        if access is None:
            access = request.host_access = HostAccess()
        start = computed.gpu_blocks
        stop = start + computed.host_blocks
        load = host.prepare_load(request.block_hashes, start, stop, access)
        # set, not raised: a request preempted after storing further offers those blocks again
        # (vLLM sets next_stored_chunk_idx to the cached chunks, connector/scheduler.py:1194-1196)
        request.next_store = stop
        request.host_jobs += 1
        job = _Transfer(load, request)
        if enter_at is None:
            self._unsubmitted.append(job)
            return
        job.done = self.h2d.submit(enter_at, load.blocks * self._host_block_bytes)
        if job.done < self.next_transfer_done:
            self.next_transfer_done = job.done
        self._in_flight.append(job)

    def offer_stores(self, request: RequestBlocks, stop: int) -> bool:
        """Offer the request's full blocks up to ``stop`` (computed by the end of this step) that it
        has not offered yet; those the host takes are one store, timed by the next
        `submit_transfers`. If they do not fit, the same blocks are offered again next time.
        Returns whether a store was made."""
        start = request.next_store
        if stop <= start:
            return False
        host = self.host
        assert host is not None, "no host tier"
        access = request.host_access
        if access is None:
            access = request.host_access = HostAccess()
        store = host.prepare_store(request.block_hashes, start, stop, access)
        if store is None:
            return False
        request.next_store = stop
        if not store.blocks:
            return False
        request.host_jobs += 1
        self._unsubmitted.append(_Transfer(store, request))
        return True

    def touch_host_prompt(self, request: RequestBlocks, prompt_blocks: int) -> None:
        """Dynamo's mocker only: touch the request's prompt blocks in the host's recency
        (`MockerHostPool.touch_prompt`), as it does at each lookup and each store it makes. The
        blocks of its own stores in flight are pending, so the touch skips them unread."""
        host = self.mocker_host
        assert host is not None, "no mocker host tier"
        pending: list[tuple[int, int]] = []
        if request.host_jobs:
            for job in (*self._in_flight, *self._unsubmitted):
                if job.request is request and not job.load:
                    pending.extend(job.copy.runs)
            pending.sort()
        host.touch_prompt(request.block_hashes, prompt_blocks, pending)

    def removed_mark(self) -> int:
        """Where the blocks evicted from the GPU from now on start, for `flush_since`."""
        return len(self.block_pool.removed)

    def flush_since(self, mark: int) -> float:
        """`flush_until` over the blocks evicted since ``mark`` (`removed_mark`) in this step."""
        return self.flush_until(self.block_pool.removed[mark:])

    def store_done(self, request: RequestBlocks) -> float:
        """When the request's stores in flight are copied (0.0 when none is): Dynamo's mocker
        waits for them before the step that preempts it computes (AISimulate
        engine/scheduler/vllm/host_offload.rs, ``preempt_request``)."""
        until = 0.0
        for job in self._in_flight:
            if job.request is request and not job.load and job.done > until:
                until = job.done
        return until

    def request_finished(self, request: RequestBlocks) -> None:
        """After the finished request's last offer: re-rank the host keys it observed."""
        host = self.host
        access = request.host_access
        if host is not None and access is not None:
            host.on_request_finished(access)

    def flush_until(self, removed: Sequence[BlockHash]) -> float:
        """When the stores of ``removed`` (blocks just evicted from the GPU) are copied: vLLM's
        worker waits for them before the step's forward (0.0 when none is in flight); SGLang's
        write-back waits for its writes of them."""
        if self.hicache is not None:
            return self.hicache.flush_until(removed)
        until = 0.0
        stores = [job for job in self._in_flight if not job.load]
        if stores and removed:
            wanted = set(removed)
            for job in stores:
                if job.done > until and not wanted.isdisjoint(job.copy.keys):
                    until = job.done
        return until

    def flush_request(self, request: RequestBlocks) -> float:
        """When the request's stores in flight are copied (0.0 when none): vLLM flushes those of
        a preempted request, its worker waiting for them before the step's forward
        (connector/scheduler.py:1786-1794), so they are done when the step is."""
        until = 0.0
        if request.host_jobs:
            for job in self._in_flight:
                if job.request is request and job.done > until:
                    until = job.done
        return until

    def flush_hits(self, prefixes: Sequence[tuple[Sequence[BlockHash], int]]) -> float:
        """When the stores in flight of finished requests (they hold no blocks) that copy any
        block of the chain prefixes ``prefixes`` (chain, blocks) are done (0.0 when none): vLLM
        flushes such a store when a step hands one of its source blocks to a request, as a
        prefix hit as much as a new block (connector/scheduler.py:1796-1808, the blocks of every
        request admitted in the step)."""
        until = 0.0
        if prefixes and self._in_flight:
            for job in self._in_flight:
                if not job.load and job.done > until and job.request.phys == 0 and _copies_any(job.copy, prefixes):
                    until = job.done
        return until

    def submit_transfers(self, at: float) -> None:
        """The step that made the pending loads and stores ends at ``at``: each enters its lane then."""
        bytes_per_block = self._host_block_bytes
        for job in self._unsubmitted:
            job.done = (self.h2d if job.load else self.d2h).submit(at, job.copy.blocks * bytes_per_block)
            if job.done < self.next_transfer_done:
                self.next_transfer_done = job.done
            self._in_flight.append(job)
        self._unsubmitted = []

    def complete_transfers(self, now: float) -> list[RequestBlocks]:
        """Complete the transfers copied by ``now``, in the order they were submitted; returns the
        requests whose loads completed, in that order."""
        loaded: list[RequestBlocks] = []
        if self.hicache is not None:  # no request waits for a copy
            self.hicache.complete(now)
            self.next_transfer_done = self.hicache.next_done
            return loaded
        if self.next_transfer_done > now:
            return loaded
        host = self.host
        assert host is not None, "no host tier"
        still: list[_Transfer] = []
        earliest = float("inf")
        in_flight = self._in_flight
        if self.mocker_host is not None:
            # the mocker completes transfers by deadline, a store before a load at the same time
            # (AISimulate engine/host_offload/tier.rs, ``Deadline`` order)
            in_flight = sorted(in_flight, key=_deadline_order)
        for job in in_flight:
            if job.done > now:
                still.append(job)
                if job.done < earliest:
                    earliest = job.done
                continue
            job.request.host_jobs -= 1
            if job.load:
                host.complete_load(job.copy)
                loaded.append(job.request)
            else:
                host.complete_store(job.copy)
        self._in_flight = still
        self.next_transfer_done = earliest
        return loaded

    def transfers_done(self) -> tuple[float, list[float]]:
        """When the earliest load in flight is copied (inf: none), and when each store is."""
        load_done = float("inf")
        store_dones: list[float] = []
        for job in self._in_flight:
            if not job.load:
                store_dones.append(job.done)
            elif job.done < load_done:
                load_done = job.done
        return load_done, store_dones

    @property
    def stores_in_flight(self) -> bool:
        """Whether taking a block may wait for a store of the block it evicts: only a store of a
        request that holds no blocks (finished or preempted) may copy an evictable block; a
        running request references its blocks."""
        if self.hicache is not None:
            return self.hicache.evictions_wait
        return any(not job.load and job.request.phys == 0 for job in self._in_flight)

    def take_host_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """Host blocks stored (store completed) and removed (evicted) since the last call."""
        host = self.host
        if host is None:
            return self.hicache.take_events() if self.hicache is not None else ([], [])
        return host.take_events()

    def insert(self, request: RequestBlocks, blocks: int, now: float) -> None:
        """SGLang HiCache only: the request inserts its first ``blocks`` blocks into the tree at
        ``now`` (its prefill done, or it finished), which may write some to the host."""
        assert self.hicache is not None, "no SGLang host tier"
        self.hicache.insert(request.block_hashes, blocks, now)
        self.next_transfer_done = self.hicache.next_done

    def load_back(self, request: RequestBlocks, computed: ComputedBlocks, now: float) -> float:
        """SGLang HiCache only: load the host hit of ``computed`` into the request's GPU blocks
        (just allocated); returns when the copy is done."""
        assert self.hicache is not None, "no SGLang host tier"
        start = computed.gpu_blocks
        done = self.hicache.load_back(request.block_hashes, start, start + computed.host_blocks, now)
        self.next_transfer_done = self.hicache.next_done
        return done

    def reset_prefix_cache(self, now: float) -> None:
        """Evict every unreferenced cached block (its removals come with the next events), and
        empty the host tier as vLLM does when its connector is reset too (verl 0.9.1 resets
        both after a weight update: ``reset_prefix_cache(reset_connector=True)``): its copies in
        flight are stale, their completions ignored (connector/scheduler.py ``reset_cache``:
        ``_stale_job_threshold``), and nothing waits for them any more. SGLang's tier is
        emptied first (`HiCache.reset`), so the blocks its writes held are cleared too."""
        if self.hicache is not None:
            self.hicache.reset(now)
            self.next_transfer_done = self.hicache.next_done
        self.block_pool.clear()
        host = self.host
        if host is None:
            return
        jobs = self._in_flight + self._unsubmitted
        if any(job.load for job in jobs):  # as vLLM, which refuses to reset under a request waiting for its KV
            raise RuntimeError("the prefix cache cannot be reset while a host load is in flight")
        host.reset()
        for job in jobs:
            job.request.host_jobs -= 1
        self._in_flight = []
        self._unsubmitted = []
        self.next_transfer_done = float("inf")

    # --- pins --------------------------------------------------------------------------------

    def pin(self, program: str, hashes: Sequence[BlockHash]) -> int:
        """Reference the resident leading blocks of ``hashes`` so they cannot be evicted;
        returns how many. Replaces an earlier pin of the program."""
        self.unpin(program)
        hits, _ = self.block_pool.prefix_hits(hashes, len(hashes))
        self._pins[program] = self.block_pool.acquire(hashes, hits)
        return hits

    def unpin(self, program: str) -> bool:
        """Release the program's pin; returns whether it had one."""
        claim = self._pins.pop(program, None)
        if claim is None:
            return False
        self.block_pool.release(claim)
        return True

    def has_pin(self, program: str) -> bool:
        return program in self._pins

    @property
    def pinned_blocks(self) -> int:
        return sum(claim.blocks for claim in self._pins.values())

    def pinned_hashes(self) -> list[list[BlockHash]]:
        """Each pin's blocks (for tests and debugging)."""
        return [claim.block_hashes() for claim in self._pins.values()]

    # --- checks ------------------------------------------------------------------------------

    def audit(self, running: Sequence[RequestBlocks], waiting: Sequence[RequestBlocks], every_block: bool = False) -> str | None:
        """The first broken invariant of the blocks of the engine's ``running`` and ``waiting``
        requests and of the pool, or None (``every_block``: see `BlockPool.audit`)."""
        for request in waiting:
            if request.phys or request.claim.blocks:
                return f"queued request {request.request_id} occupies {request.phys} blocks"
        private = 0
        for request in running:
            if request.phys < request.claim.blocks:
                return f"request {request.request_id}: {request.phys} blocks for {request.claim.blocks} held"
            private += request.phys - request.claim.blocks
        claims = [request.claim for request in running] + list(self._pins.values())
        if self.hicache is not None:
            claims += self.hicache.lock_claims()
        problem = self.block_pool.audit(claims, private, every_block)
        if problem is None and self.host is not None:
            problem = self.host.audit()
        if problem is None and self.hicache is not None:
            problem = self.hicache.audit()
        return problem

    # --- folded runs of steps ----------------------------------------------------------------

    def plan_boundaries(
        self,
        decoders: list[tuple[_Request, int]],
        prefill: tuple[_Request, int] | None,
        last: int,
        head_blocks: Sequence[BlockHash],
    ) -> tuple[int, list[BlockBoundary]] | None:
        """The steps 2..``last`` of a run that touch the pool, with ``last`` lowered where the run
        must stop early; None when no step can be folded. Step k of the run computes token
        ``computed + k`` of each of ``decoders`` (in running order; each scheduled for one token,
        the pair as the step lists it), counting ``computed`` before the first step, and after
        them ``chunk`` more tokens of ``prefill`` (request, chunk), which reserves every step.
        The run stops before a step whose blocks cannot be had (it would preempt), and after one
        that completes a block of ``head_blocks``, a chain prefix the queue's head waits for
        (chained hashes: a block is in it only at its own depth). With SGLang's tier it also
        stops before a step that evicts a cached block of ``head_blocks``."""
        bs = self.block_size
        head_depth = len(head_blocks)
        # (step, running position, 0 = take a block | 1 = complete one | 2 = a prefill chunk,
        # request, the tokens its slots reach in that step)
        touches: list[tuple[int, int, int, _Request, int]] = []
        prefill_phys = 0  # the prefilling request's blocks, as `allocate_slots` will find them step by step
        if prefill is not None:
            req, chunk = prefill
            computed = req.computed
            touches += [(k, len(decoders), 2, req, computed + k * chunk) for k in range(2, last + 1)]
            prefill_phys = req.phys
        for order, (req, _) in enumerate(decoders):
            c = req.computed
            # The first step reserved through token c + 1; later steps need a block when their
            # token passes the blocks held, and complete one when it fills the next block. Runs
            # are mostly shorter than a block, so most requests have no touch at all.
            k = req.phys * bs - c + 1
            while k <= last:
                touches.append((k, order, 0, req, c + k))
                k += bs
            if self.enable_caching:
                k = (req.full_done + 1) * bs - c
                while k <= last:
                    touches.append((k, order, 1, req, c + k))
                    k += bs
        touches.sort(key=_TOUCH_ORDER)
        available = self.block_pool.available
        if self.hicache is not None and head_depth:
            # SGLang's lookup of the blocked head, redone each step, stamps the host-only run
            # after its GPU prefix: the run must stop before a step that evicts a cached block
            # of the head's chain, which could change that run (a folded run looks it up once).
            wanted = sum(1 for touch in touches if touch[2] == 0)  # blocks the run takes (no prefill: none waits otherwise)
            free = self.block_pool.free
            spare = free + self.block_pool.evictable_sparing(head_blocks, head_depth, max(0, wanted - free))
            available = min(available, spare)
        boundaries: list[BlockBoundary] = []
        for k, _, kind, req, upto in touches:
            if k > last:
                break
            if not boundaries or boundaries[-1].index != k:
                boundaries.append(BlockBoundary(k))
            reserves = boundaries[-1].reserves
            if kind == 1:
                depth = upto // bs - 1  # the block it completes
                if depth < head_depth and head_blocks[depth] == req.block_hashes[depth]:
                    last = k  # the queue's head may fit after this step
            else:  # takes blocks: one, or the chunk's
                need = 1 if kind == 0 else max(0, _blocks_for(upto, bs) - prefill_phys)
                available -= need
                if available < 0:  # step k would preempt (or evict a block of the head's): it is scheduled on its own
                    boundaries.pop()
                    last = k - 1
                    break
                if kind == 2:
                    prefill_phys += need
            if not reserves or reserves[-1][0] is not req:  # a block taken and one completed: one reservation
                reserves.append((req, upto))
        return (last, boundaries) if last >= 2 else None
