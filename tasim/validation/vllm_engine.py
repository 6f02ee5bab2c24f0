"""vLLM v1's own scheduler behind tasim's engine interface: the oracle of ``tasim validate vllm``.

vLLM's real `Scheduler` and `KVCacheManager` (prefix cache, chunked prefill, recompute
preemption) decide every step; no model runs. Each step the scheduler's output is answered
with a fabricated model-runner output: one sampled token for every request whose known tokens
are all computed, nothing for a partial prefill chunk. tasim's simulation supplies arrivals,
tool gaps, routing and time exactly as it does for its own engine, so the two event logs differ
only where the schedulers do.

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
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tasim.core.model import BlockHash, RequestSpec
from tasim.sim.engine.scheduler import EngineListener, EngineRequest, EngineSetup, Step, step_shape
from tasim.sim.perf.perf_model import PerfModel
from tasim.validation import ValidationUnavailable

VLLM_VERSION = "0.31.0"  # the version Dynamo 1.6.1's [vllm] extra pins, so the one its GPU workers run

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model folder is local; never reach for the hub
try:
    import torch
    import vllm
    from vllm.config import CacheConfig, DeviceConfig, KVEventsConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ValidationUnavailable(
        f"validate vllm needs vLLM {VLLM_VERSION} (make install, or pip install -e '.[oracle]' as the Makefile does): {exc}"
    ) from None

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


def vllm_unsupported(config: EngineSetup) -> str | None:
    """Why vLLM cannot run with these engine settings, or None."""
    if config.host_tier is not None:
        return "cluster.engine.host_tier: the oracle runs vLLM's scheduler without its OffloadingConnector (leave it unset)"
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
    with _model_folder() as folder:
        model = ModelConfig(model=folder, skip_tokenizer_init=True, max_model_len=longest, dtype="float16")
        vllm_config = VllmConfig(
            model_config=model,
            scheduler_config=scheduler,
            cache_config=cache,
            device_config=DeviceConfig(device="cpu"),
            kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"),
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


class VllmEngine:
    """One worker whose steps vLLM's scheduler plans (see the module docstring). Requests are
    mirrored as `EngineRequest` records (computed, generated) so the perf model sees the same
    step shapes tasim's engine gives it."""

    def __init__(self, worker: str, config: EngineSetup, perf: PerfModel, listener: EngineListener) -> None:
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

    # --- what the simulation reads ---------------------------------------------------------

    @property
    def running(self) -> list[Request]:
        return self.scheduler.running

    @property
    def waiting(self) -> list[Request]:
        return list(self.scheduler.waiting)

    @property
    def has_work(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting)

    @property
    def foldable(self) -> None:
        return None  # vLLM's scheduler decides every step: none can be planned ahead

    @property
    def next_transfer_done(self) -> float:
        return float("inf")  # no host tier here

    def host_totals(self) -> tuple[int, float, float]:
        return 0, 0.0, 0.0

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
                self.listener.on_admitted(self.worker, record.spec, record.computed, recompute, first, now)
        step.stored, step.removed = self._kv_events()
        self._output = output
        if step.scheduled:
            self.iterations += 1
            step.shape = step_shape(step.scheduled, self.config.num_blocks * self.config.block_size)
            step.duration = self.perf.step_time(step.shape)
        else:
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
        runner = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled)
        results = self.scheduler.update_from_output(output, runner)
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

    def publish_kv(self, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None:
        if stored or removed:
            self.listener.on_kv(self.worker, stored, removed, now)

    def clear_prefix_cache(self, now: float) -> None:
        if not self.scheduler.reset_prefix_cache():
            raise ValidationUnavailable(f"{self.worker}: vLLM resets its prefix cache only with no request running")
        self.publish_kv(*self._kv_events(), now)

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
