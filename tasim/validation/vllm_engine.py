"""vLLM v1's own scheduler behind tasim's engine interface: the oracle of ``tasim validate vllm``.

vLLM's real `Scheduler` and `KVCacheManager` (prefix cache, chunked prefill, recompute
preemption) decide every step; no model runs. Each step the scheduler's output is answered
with a fabricated model-runner output: one sampled token for every request whose known tokens
are all computed, nothing for a partial prefill chunk. tasim's simulation supplies arrivals,
tool gaps, routing and time exactly as it does for its own engine, so the two event logs differ
only where the schedulers do.

With a host tier (``cluster.engine.host_tier``) vLLM's own OffloadingConnector (CPU offloading, one
GPU block per chunk) runs behind the scheduler, scheduler side only. Its worker side, which would
copy KV between GPU and host, is fabricated like the model runner: each load and store job the
connector plans is timed by tasim's own copy lanes (`TransferLane`, one FIFO per direction, at the
scenario's bandwidths) from the end of the step that planned it, and reported done in the output
of the last step that ends by then, so the first step that starts at or after it sees it done, as
tasim's engine does; a store the connector asks to flush (its source blocks are reused) is waited
for before the step runs, as vLLM's worker does. The host pool holds exactly the tier's blocks:
each of this stand-in model's pages (``4 * block_size`` bytes) rounds up to one 4 KiB page.

Token ids stand for tasim's block identity: every token of block ``i`` of a request is the
request's tasim hash of that block (tokens after its last full block are 0, never hashed), so
two requests share vLLM's chained block hashes exactly where they share tasim's. The same
scheme names the output tokens the fabricated runner samples, and a stored block's tasim hash
is its first token id, which is how vLLM's own KV events are turned back into tasim's.

vLLM is an optional dependency (``pip install -e '.[oracle]'``); importing this module without
it raises `ValidationUnavailable`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tasim.core.model import BlockHash, RequestSpec
from tasim.sim.engine.host_tier import TransferLane
from tasim.sim.engine.scheduler import EngineListener, EngineRequest, EngineSetup, Step, step_shape
from tasim.sim.perf.perf_model import PerfModel
from tasim.validation import TransferObserver, ValidationUnavailable

VLLM_VERSION = "0.31.0"  # the version Dynamo 1.6.1's [vllm] extra pins, so the one its GPU workers run

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model folder is local; never reach for the hub
try:
    import torch
    import vllm
    from vllm.config import CacheConfig, DeviceConfig, KVEventsConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingConnectorMetadata, OffloadingWorkerMetadata
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash, maybe_convert_block_hash
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.kv_offload.base import GPULoadStoreSpec, OffloadKey, get_offload_block_hash
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ValidationUnavailable(
        f"validate vllm needs vLLM {VLLM_VERSION} (make install, or pip install -e '.[oracle]' as the Makefile does): {exc}"
    ) from None

# A store the host cannot take yet is offered again next step, as tasim's engine does; vLLM warns of each
logging.getLogger("vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler").setLevel(logging.ERROR)

if vllm.__version__ != VLLM_VERSION:  # pragma: no cover - depends on the install
    raise ValidationUnavailable(f"validate vllm is pinned to vLLM {VLLM_VERSION}; found {vllm.__version__}")


# A llama-type config.json and nothing else: all vLLM's ModelConfig reads without a tokenizer or weights.
_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "vocab_size": 1024,
    "max_position_embeddings": 1 << 24,
    "torch_dtype": "float16",
}


@contextmanager
def _model_folder() -> Iterator[str]:
    """A folder holding `_MODEL_CONFIG` as ``config.json``, removed on leaving the block: vLLM
    reads it while its configs and scheduler are built, never after."""
    with tempfile.TemporaryDirectory(prefix="tasim-vllm-model-") as directory:
        (Path(directory) / "config.json").write_text(json.dumps(_MODEL_CONFIG))
        yield directory


# The stand-in model's KV page: one fp16 head of size 1 per token (`build_scheduler`), and the host
# page vLLM's CPU pool rounds each chunk up to (mmap.PAGESIZE, vllm/v1/kv_offload/cpu/spec.py:104-120).
_PAGE_BYTES = 4
_HOST_PAGE = 4096


def vllm_unsupported(config: EngineSetup) -> str | None:
    """Why vLLM cannot run with these engine settings, or None."""
    if config.host_tier is not None and _PAGE_BYTES * config.block_size > _HOST_PAGE:
        return (
            f"cluster.engine.block_size ({config.block_size}) with a host tier: the oracle's host pool counts one "
            f"{_HOST_PAGE}-byte page per block, which holds blocks of at most {_HOST_PAGE // _PAGE_BYTES} tokens"
        )
    if config.preemption != "newest_first":
        return "cluster.engine.preemption: vLLM's FCFS scheduler preempts the newest running request (newest_first)"
    if config.eviction != "lru":
        return "cluster.engine.eviction: vLLM evicts least recently used blocks (lru)"
    if config.max_num_batched_tokens < config.max_num_seqs:
        return (
            f"cluster.engine.max_num_batched_tokens ({config.max_num_batched_tokens}) must be at least "
            f"max_num_seqs ({config.max_num_seqs}): vLLM refuses that configuration"
        )
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_model_len(config):
        return (
            f"cluster.engine.max_num_batched_tokens ({config.max_num_batched_tokens}) must be at least the "
            f"longest request ({max_model_len(config)} tokens) without chunked prefill: vLLM refuses that configuration"
        )
    return None


def max_model_len(config: EngineSetup) -> int:
    """The longest request vLLM serves: the model's context, cut to what the pool can hold
    (vLLM refuses to start with a max_model_len whose KV does not fit; its null block holds nothing)."""
    return min(config.max_model_len, config.num_blocks * config.block_size)


def build_scheduler(config: EngineSetup) -> Scheduler:
    """vLLM's scheduler with these settings and ``config.num_blocks`` blocks that hold KV (plus
    the null block vLLM keeps)."""
    problem = vllm_unsupported(config)
    if problem:
        raise ValidationUnavailable(problem)
    bs = config.block_size
    longest = max_model_len(config)
    scheduler = SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=longest,
        enable_chunked_prefill=config.enable_chunked_prefill,
        async_scheduling=False,
        is_encoder_decoder=False,
        policy=config.scheduling_policy,
    )
    cache = CacheConfig(block_size=bs, enable_prefix_caching=config.enable_prefix_caching)
    cache.num_gpu_blocks = config.num_blocks + 1  # tasim counts the blocks that hold KV; vLLM adds its null block
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float16)  # shapes unused without a runner
    kv_cache = KVCacheConfig(num_blocks=config.num_blocks + 1, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    offloading = None
    tier = config.host_tier
    if tier is not None:  # vLLM's --kv-offloading-size, one GPU block per chunk, sized to exactly the tier's blocks
        extra = {"cpu_bytes_to_use": tier.blocks * _HOST_PAGE, "store_threshold": tier.store_threshold}
        offloading = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both", kv_connector_extra_config=extra)
    with _model_folder() as folder:
        model = ModelConfig(model=folder, skip_tokenizer_init=True, max_model_len=longest, dtype="float16")
        vllm_config = VllmConfig(
            model_config=model,
            scheduler_config=scheduler,
            cache_config=cache,
            device_config=DeviceConfig(device="cpu"),
            kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"),
            kv_transfer_config=offloading,
        )
        return Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=bs,
            hash_block_size=bs,
            log_stats=True,
        )


class _PoolCounts:
    """A worker sample's view of vLLM's KV cache."""

    def __init__(self, engine: VllmEngine) -> None:
        self._engine = engine

    @property
    def active(self) -> int:
        pool = self._engine.scheduler.kv_cache_manager.block_pool
        return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()  # the null block is never free

    @property
    def cached_blocks(self) -> int:
        return sum(self._engine._copies.values())  # physical blocks, duplicates included, as tasim counts


class _Job:
    """A copy job the connector planned: when tasim's copy lanes have it done, and for a load the
    request it loads."""

    __slots__ = ("done", "load_for")

    def __init__(self, done: float, load_for: str | None) -> None:
        self.done = done
        self.load_for = load_for


class _InOrder(set[str]):
    """A set of request ids that iterates in the order given."""

    def __init__(self, ordered: list[str]) -> None:
        super().__init__(ordered)
        self._order = ordered

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)


class _EventCapture:
    """Stands in for vLLM's KV event publisher (the "null" one drops them): keeps what
    ``update_from_output`` publishes, the connector's host events among them."""

    def __init__(self) -> None:
        self.events: list[KVCacheEvent] = []

    def publish(self, batch: Any) -> None:
        self.events.extend(batch.events)

    def shutdown(self) -> None:
        pass


class VllmEngine:
    """One worker whose steps vLLM's scheduler plans (see the module docstring). Requests are
    mirrored as `EngineRequest` records (computed, generated) so the perf model sees the same
    step shapes tasim's engine gives it. ``on_transfer`` hears of every host copy job planned:
    worker, request, ``load`` or ``store``, its blocks (tasim hashes, in prompt order), the start
    of the step that planned it and when it is done."""

    def __init__(
        self, worker: str, config: EngineSetup, perf: PerfModel, listener: EngineListener, on_transfer: TransferObserver | None = None
    ) -> None:
        self.worker = worker
        self.config = config
        self.perf = perf
        self.listener = listener
        self.scheduler = build_scheduler(config)
        self._longest = max_model_len(config)
        hash_fn = get_hash_fn_by_name(self.scheduler.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self._hasher = get_request_block_hasher(config.block_size, hash_fn)
        self.iterations = 0
        self.kv_cache = _PoolCounts(self)
        self.cached: dict[Any, BlockHash] = {}  # vLLM block hash -> tasim hash, for cached blocks
        self._copies: dict[Any, int] = {}  # vLLM block hash -> physical copies cached
        self._records: dict[str, EngineRequest] = {}
        self._requests: dict[str, Request] = {}
        self._arrivals = 0
        # host tier only
        tier = self._tier = config.host_tier
        self._on_transfer = on_transfer
        self._prompt_blocks: dict[Any, tuple[BlockHash, int]] = {}  # vLLM block hash (as keys and events give it) -> tasim hash, depth
        self._jobs: dict[int, _Job] = {}  # in flight, by vLLM's job id
        self._flushed: set[int] = set()  # of those, the ones vLLM's worker waited for: done by the next output
        self._gpu_prefix: dict[str, int] = {}  # a request being loaded -> the tokens its GPU prefix holds
        self._idle_output: SchedulerOutput | None = None  # a step that scheduled nothing, its outcome due
        self._host_stored = 0
        self._wait_until = 0.0  # the flushes of steps that ran nothing, waited for by the next that runs
        self._finish_order: list[str] = []  # requests finished since the last step, in order
        self._capture = _EventCapture()
        self._d2h = TransferLane(tier.d2h_gbps if tier else 0.0)
        self._h2d = TransferLane(tier.h2d_gbps if tier else 0.0)
        if tier is not None:
            self.scheduler.kv_event_publisher = self._capture  # type: ignore[assignment]  # publish and shutdown are all it calls

    # --- what the simulation reads ---------------------------------------------------------

    @property
    def running(self) -> list[Request]:
        return self.scheduler.running

    @property
    def waiting(self) -> list[Request]:
        return list(self.scheduler.waiting)

    @property
    def has_work(self) -> bool:
        if self._tier is not None:  # requests being loaded are in kv_holding_waiting; copies in flight keep it stepping
            return bool(self.scheduler.has_requests())
        return bool(self.scheduler.running or self.scheduler.waiting)

    @property
    def foldable(self) -> None:
        return None  # vLLM's scheduler decides every step: none can be planned ahead

    @property
    def next_transfer_done(self) -> float:
        return min((job.done for job in self._jobs.values()), default=float("inf"))

    def host_totals(self) -> tuple[int, float, float]:
        return self._host_stored * self.config.block_size, self._d2h.busy_s, self._h2d.busy_s

    def audit(self, every_block: bool = False) -> str | None:
        return None  # vLLM's state is vLLM's; tasim's invariants are about tasim's engine

    # --- requests --------------------------------------------------------------------------

    def submit(self, spec: RequestSpec, priority: int = 0) -> None:
        if spec.prompt_tokens + spec.output_tokens > self._longest:
            raise ValidationUnavailable(
                f"request {spec.id}: {spec.prompt_tokens} + {spec.output_tokens} tokens exceed vLLM's max_model_len "
                f"{self._longest} (a worker's KV pool); vLLM's front end would refuse it"
            )
        request = Request(
            request_id=spec.id,
            prompt_token_ids=_tokens(spec, 0, spec.prompt_tokens, self.config.block_size),
            sampling_params=SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True),
            pooling_params=None,
            block_hasher=self._hasher,
            arrival_time=float(self._arrivals),
            priority=priority,
        )
        self._arrivals += 1  # the engine's arrival order: what priority scheduling breaks ties by
        self._requests[spec.id] = request
        self._records[spec.id] = EngineRequest(spec, priority, self._arrivals)
        if self._tier is not None:  # host copies are of prompt blocks (vLLM's offload_prompt_only)
            for depth, (block, ours) in enumerate(zip(request.block_hashes, spec.block_hashes)):
                self._prompt_blocks[block] = self._prompt_blocks[maybe_convert_block_hash(block)] = (ours, depth)
        self.scheduler.add_request(request)

    def pin(self, program: str, hashes: tuple[BlockHash, ...]) -> int:
        raise ValidationUnavailable("vLLM has no pins: Continuum is not a vLLM scheduler")

    def unpin(self, program: str) -> bool:
        return False

    def has_pin(self, program: str) -> bool:
        return False

    # --- steps -----------------------------------------------------------------------------

    def begin_step(self, now: float) -> Step:
        scheduler = self.scheduler
        if self._idle_output is not None:  # the outcome of a step that scheduled nothing: the copies done since
            scheduler.update_from_output(self._idle_output, self._runner_output([], [], now))
            self._idle_output = None
        if self._finish_order:
            # vLLM walks the requests finished since the last step as a set, in an order Python's
            # string hashing makes differ from run to run; the oracle walks them in the order they
            # finished, as tasim does (their stores then queue in that order)
            scheduler.finished_req_ids = _InOrder([r for r in self._finish_order if r in scheduler.finished_req_ids])
            self._finish_order = []
        before = [(r.request_id, r.num_computed_tokens) for r in scheduler.running]
        output = scheduler.schedule()
        step = Step(start=now, duration=0.0)
        preempted = output.preempted_req_ids or set()
        step.preempted = bool(preempted)
        # vLLM preempts from the end of its running list: newest first
        for request_id, computed in reversed(before):
            if request_id in preempted:
                record = self._records[request_id]
                record.lost = computed
                record.computed = 0
                self.listener.on_preempted(self.worker, record.spec, computed, now)
        scheduled = output.num_scheduled_tokens
        admitted = {r.req_id for r in output.scheduled_new_reqs} | set(output.scheduled_cached_reqs.resumed_req_ids)
        for request in scheduler.running:  # in admission order
            request_id = request.request_id
            n = scheduled.get(request_id)
            if n is None:
                continue
            record = self._records[request_id]
            record.computed = request.num_computed_tokens - n  # schedule() has already advanced it
            step.scheduled.append((record, n))
            if request_id in admitted:
                record.admissions += 1
                first = record.admissions == 1
                if first:
                    record.cached_tokens = record.computed
                recompute = 0 if first else max(0, record.lost - record.computed)
                gpu_prefix = self._gpu_prefix.pop(request_id, None)  # loaded from the host after it
                host_tokens = 0 if gpu_prefix is None else record.computed - gpu_prefix
                self.listener.on_admitted(self.worker, record.spec, record.computed, recompute, first, now, host_tokens)
        step.stored, step.removed = self._kv_events()
        self._output = output
        if step.scheduled:
            self.iterations += 1
            step.shape = step_shape(step.scheduled, self.config.num_blocks * self.config.block_size)
            step.duration = self.perf.step_time(step.shape)
        if self._tier is not None:
            self._plan_copies(output, step, now)
            if not step.scheduled:
                self._idle_output = output
        if not step.scheduled:
            self.publish_kv(step.stored, step.removed, now)
        return step

    def complete_step(self, step: Step, now: float) -> None:
        output = self._output
        ids = list(output.num_scheduled_tokens)
        sampled = []
        for request_id in ids:
            request = self._requests[request_id]
            done = request.num_computed_tokens >= request.num_tokens
            sampled.append([_token(self._records[request_id].spec, request.num_tokens, self.config.block_size)] if done else [])
        results = self.scheduler.update_from_output(output, self._runner_output(ids, sampled, now))
        finished = {o.request_id for outputs in results.values() for o in outputs.outputs if o.finish_reason is not None}
        for record, _ in step.scheduled:
            request = self._requests[record.spec.id]
            generated = request.num_output_tokens
            if generated > record.generated:
                record.generated = generated
                if generated == 1:
                    self.listener.on_first_token(self.worker, record.spec, now)
        for record, _ in step.scheduled:
            request_id = record.spec.id
            if request_id in finished:
                self.listener.on_finished(self.worker, record.spec, record.cached_tokens, now)
                del self._requests[request_id], self._records[request_id]
                if self._tier is not None:
                    self._finish_order.append(request_id)

    def publish_kv(self, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None:
        if stored or removed:
            self.listener.on_kv(self.worker, stored, removed, now)

    def abort_all(self) -> list[tuple[RequestSpec, int]]:
        """End every request as vLLM's ``pause_generation(mode="abort")`` does: its engine core
        calls ``finish_requests(None, FINISHED_ABORTED)`` between two steps (the step in flight
        has emitted its tokens), which frees each request's blocks (they stay cached) and
        returns the requests, running and waiting alike, in the order they were added, as their
        abort outputs go out. Each comes back with the output tokens it had generated."""
        if self._tier is not None:
            raise ValidationUnavailable(f"{self.worker}: aborting requests with a host tier is not modelled (tasim's engine refuses it too)")
        aborted = self.scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)
        for request in aborted:
            del self._requests[request.request_id]
        return [(self._records.pop(request.request_id).spec, request.num_output_tokens) for request in aborted]

    def clear_prefix_cache(self, now: float) -> None:
        # vLLM's own reset (what pause_generation's cache clearing calls): every cached block is
        # dropped, and refused while a request holds blocks
        if not self.scheduler.reset_prefix_cache():
            raise ValidationUnavailable(f"{self.worker}: vLLM resets its prefix cache only with no request running")
        self.publish_kv(*self._kv_events(), now)

    # --- the host tier: the worker side of vLLM's OffloadingConnector, fabricated ------------

    def _runner_output(self, ids: list[str], sampled: list[list[int]], now: float) -> ModelRunnerOutput:
        """The model runner's output of a step that ends at ``now``: the tokens sampled and, with a
        host tier, the copy jobs done by then and those the step waited for (loads also as
        requests whose KV has arrived)."""
        connector = None
        done = [job_id for job_id, job in self._jobs.items() if job.done <= now or job_id in self._flushed]
        if done:
            loaded = {job.load_for for job in map(self._jobs.pop, done) if job.load_for is not None}
            self._flushed.difference_update(done)
            connector = KVConnectorOutput(
                finished_recving=loaded or None, kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=dict.fromkeys(done, 1))
            )
        return ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled, kv_connector_output=connector
        )

    def _plan_copies(self, output: SchedulerOutput, step: Step, now: float) -> None:
        """Time the copy jobs the step's schedule planned on tasim's lanes and report the host's
        KV events. A store vLLM flushes (its source blocks were reused in this step; or its
        request was preempted) is copied before the step runs, which waits for it; every other
        job enters its lane when the step ends."""
        meta = output.kv_connector_metadata
        connector = self.scheduler.connector
        assert isinstance(meta, OffloadingConnectorMetadata) and isinstance(connector, OffloadingConnector)
        keys_of = connector.scheduler._jobs  # vLLM's TransferJobStatus per job in flight: its keys
        bs = self.config.block_size
        for job in meta.load_jobs.values():
            assert isinstance(job.dst_spec, GPULoadStoreSpec)  # the GPU blocks the hit loads into
            self._gpu_prefix[job.req_id] = self._requests[job.req_id].num_computed_tokens - len(job.dst_spec.block_ids) * bs
        flushed = meta.jobs_to_flush or set()
        blocks = {job_id: self._blocks(keys_of[job_id].keys) for job_id in (*meta.load_jobs, *meta.store_jobs)}
        wait_until = now
        for job_id in sorted(flushed):
            if job_id in meta.store_jobs:
                self._jobs[job_id] = _Job(self._d2h.submit(now, self._bytes(blocks[job_id])), None)
            if job_id in self._jobs:
                wait_until = max(wait_until, self._jobs[job_id].done)
        # a step that runs nothing ends at once, as in tasim: the next one that runs waits for
        # what it flushed (and sees it done by its end)
        self._wait_until = max(self._wait_until, wait_until)
        if step.scheduled:
            self._flushed.update(flushed)
            step.duration += self._wait_until - now
            self._wait_until = 0.0
        end = step.end
        for job_id, job in meta.load_jobs.items():
            self._jobs[job_id] = _Job(self._h2d.submit(end, self._bytes(blocks[job_id])), job.req_id)
        for job_id in meta.store_jobs:
            if job_id not in flushed:
                self._jobs[job_id] = _Job(self._d2h.submit(end, self._bytes(blocks[job_id])), None)
        if self._on_transfer is not None:
            for kind, jobs in (("load", meta.load_jobs), ("store", meta.store_jobs)):
                for job_id, job in jobs.items():
                    self._on_transfer(self.worker, job.req_id, kind, blocks[job_id], now, self._jobs[job_id].done)
        # the host events since the last step: stores completed in its outcome, evictions in this schedule
        events = self._capture.events
        self._capture.events = []
        stored, removed = self._host_events([*events, *connector.take_events()])
        if stored or removed:
            self.listener.on_host_kv(self.worker, stored, removed, now)

    def _blocks(self, keys: Iterable[OffloadKey]) -> tuple[int, ...]:
        """Offload keys (one block per chunk) as the blocks' indexes in the prompt, in order (a
        block's chained hash has one depth, whichever request it is in)."""
        return tuple(sorted(self._prompt_blocks[get_offload_block_hash(key)][1] for key in keys))

    def _bytes(self, blocks: tuple[int, ...]) -> int:
        tier = self._tier
        assert tier is not None
        return len(blocks) * tier.block_bytes

    def _host_events(self, events: list[Any]) -> tuple[list[BlockHash], list[BlockHash]]:
        """vLLM's host (CPU) events as tasim reports them: each block by its latest event."""
        latest: dict[BlockHash, bool] = {}
        for event in events:
            if getattr(event, "medium", None) != "CPU":
                continue
            stored = isinstance(event, BlockStored)
            for block in event.block_hashes:
                ours = self._prompt_blocks[block][0]
                latest.pop(ours, None)
                latest[ours] = stored
                self._host_stored += stored
        return [block for block, stored in latest.items() if stored], [block for block, stored in latest.items() if not stored]

    def _kv_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """vLLM's KV events since the last call, as tasim reports them: by hash residency (vLLM
        reports every copy of a duplicated block; a hash is stored with its first copy and
        removed with its last) and net of a hash stored and evicted within one step."""
        stored: dict[BlockHash, None] = {}
        removed: dict[BlockHash, None] = {}
        bs = self.config.block_size
        copies = self._copies
        for event in self.scheduler.kv_cache_manager.take_events():
            if isinstance(event, BlockStored):
                for k, block in enumerate(event.block_hashes):
                    copies[block] = copies.get(block, 0) + 1
                    if copies[block] > 1:
                        continue
                    ours = self.cached[block] = event.token_ids[k * bs]
                    if removed.pop(ours, 0) is None:
                        continue  # evicted and stored again within the step: no net change
                    stored[ours] = None
            elif isinstance(event, BlockRemoved):
                for block in event.block_hashes:
                    copies[block] -= 1
                    if copies[block]:
                        continue
                    del copies[block]
                    ours = self.cached.pop(block)
                    if stored.pop(ours, 0) is None:
                        continue
                    removed[ours] = None
            elif isinstance(event, AllBlocksCleared):
                removed.update(dict.fromkeys(self.cached.values()))
                self.cached.clear()
                copies.clear()
        return list(stored), list(removed)


def _token(spec: RequestSpec, position: int, block_size: int) -> int:
    """The token id at ``position`` of the request's prompt + output (see the module docstring)."""
    block = position // block_size
    hashes = spec.block_hashes
    return hashes[block] if block < len(hashes) else 0


def _tokens(spec: RequestSpec, start: int, stop: int, block_size: int) -> list[int]:
    return [_token(spec, position, block_size) for position in range(start, stop)]
