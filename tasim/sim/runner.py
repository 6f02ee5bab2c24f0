"""The simulation: processes (`tasim.sim.clock`) for programs, engine workers and the policy host.

Programs issue requests; the policy host asks the policy where each goes (or holds it); worker
processes run their engine one iteration at a time; every state change is reported as an event
to ``emit``. The run stops at ``duration_s``, or earlier when a finite workload (a trace, a
number of RL steps) has completed; requests still in flight then are counted as unfinished.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from operator import itemgetter

from tasim.config.scenario import RolloutWorkload, Scenario
from tasim.config.workers import cluster_view
from tasim.core import events as ev
from tasim.core.determinism import PRIVATE_OUTPUTS, arrival_rng
from tasim.core.gc_pacing import fewer_collections
from tasim.core.model import BlockHash, RequestSpec, with_private_tail
from tasim.hosting.policy_host import Emit, HostCore, build_policy, run_header
from tasim.policies import Pin, Policy, Route
from tasim.sim.checks import EventChecks, InvariantViolation
from tasim.sim.clock import STEP_END_PRIORITY, STEP_START_PRIORITY, Alarm, Clock, Event, Interrupt, Process
from tasim.sim.drivers import start_workload
from tasim.sim.engine.fast_forward import StepRun
from tasim.sim.engine.kv_manager import HostTierSetup
from tasim.sim.engine.scheduler import Engine, EngineFactory, EngineSetup, StepEngine
from tasim.sim.perf import make_perf_model
from tasim.workloads import Script


@dataclass(frozen=True, slots=True)
class Aborted:
    """How a call a weight sync aborted ends for its program: the output it had generated, and
    when its client sends it again."""

    output_tokens: int
    retry_after_s: float


def partial_retry(turn: RequestSpec, aborted: RequestSpec, generated: int, calls: int) -> RequestSpec:
    """The ``calls``-th call of ``turn`` after ``aborted`` ended having generated ``generated``
    tokens: its prompt holds them, its output is what is still to come (ids as the live router
    gives a turn's later calls)."""
    return replace(
        aborted,
        id=f"{turn.id}r{calls}",
        prompt_tokens=aborted.prompt_tokens + generated,
        output_tokens=aborted.output_tokens - generated,
    )


Progress = Callable[[float], None]


def engine_setup(scenario: Scenario) -> EngineSetup:
    """What each worker's engine is given by the scenario."""
    engine = scenario.cluster.engine
    blocks = scenario.cluster.cache_blocks_per_worker()
    return EngineSetup(
        block_size=engine.block_size,
        num_blocks=blocks,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        enable_prefix_caching=engine.enable_prefix_caching,
        enable_chunked_prefill=engine.enable_chunked_prefill,
        preemption=engine.preemption,
        scheduling_policy=engine.scheduling_policy,
        eviction=engine.eviction,
        max_model_len=served_len(scenario),
        cache_duplicates=engine.flavour == "vllm",
        host_tier=host_tier_setup(scenario),
    )


def host_tier_setup(scenario: Scenario) -> HostTierSetup | None:
    """The scenario's host tier for each worker's engine; a copy moves each rank's share of a
    block's KV (vLLM shards it over the TP ranks, which copy in parallel)."""
    cluster = scenario.cluster
    tier = cluster.engine.host_tier
    if tier is None:
        return None
    block_bytes = cluster.engine.block_size * cluster.kv_bytes_per_token() // cluster.tp
    if tier.semantics == "sglang":
        return HostTierSetup(
            cluster.host_blocks_per_worker(),
            block_bytes,
            tier.d2h_gbps,
            tier.h2d_gbps,
            semantics="sglang",
            write_policy=tier.sglang_write_policy(),
            load_back_threshold=tier.sglang_load_back_threshold(),
        )
    return HostTierSetup(cluster.host_blocks_per_worker(), block_bytes, tier.d2h_gbps, tier.h2d_gbps, tier.store_threshold, tier.semantics)


def ends_in_flight(scenario: Scenario) -> bool:
    """Whether the workload completes with work still running: an asynchronous RL trainer's
    last step leaves the rollouts submitted ahead of it unfinished."""
    workload = scenario.workload
    return isinstance(workload, RolloutWorkload) and workload.mode != "sync"


def served_len(scenario: Scenario) -> int:
    """The longest request (prompt + output) the engine serves. vLLM's is the model's context cut
    to what the pool holds: it refuses to start with a longer one, so a deployment lowers it, and
    its front end then refuses longer requests. The mocker takes any request and drops, when it
    reaches the queue's head, one that can never fit."""
    if scenario.cluster.engine.flavour == "vllm":
        return min(scenario.max_context_tokens, scenario.cluster.cache_blocks_per_worker() * scenario.cluster.engine.block_size)
    return scenario.max_context_tokens


class Simulation(HostCore):
    """``policy`` overrides the scenario's policy with a ready object (e.g. one not in the
    registry); it must have been built for this simulation's `view`. ``fast_forward=False``
    simulates every decode step on its own (same outcome, much slower; for checking).
    ``check=True`` checks the invariants of `tasim.sim.checks` as it runs and raises
    `InvariantViolation` at the first broken one. ``engine_factory`` builds each worker's engine
    (default: tasim's `Engine`; only an engine with a `StepEngine.foldable` folds decode
    steps)."""

    def __init__(
        self,
        scenario: Scenario,
        emit: Emit,
        policy: Policy | None = None,
        fast_forward: bool = True,
        check: bool = False,
        engine_factory: EngineFactory = Engine,
    ) -> None:
        self.scenario = scenario
        self._check = check
        self.env = Clock(self._catch_up)
        self._fast_forward = fast_forward
        cluster = scenario.cluster
        engine_cfg = cluster.engine
        self.block_size = engine_cfg.block_size
        self.view = cluster_view(scenario)
        policy = policy or build_policy(scenario, self.view)
        super().__init__(policy, EventChecks(emit, ends_in_flight(scenario)) if check else emit, scenario.metrics.log_kv_events)
        self.arrival_rng = arrival_rng(scenario.seed)
        perf = make_perf_model(cluster)
        config = engine_setup(scenario)
        self.engines = {w.id: engine_factory(w.id, config, perf, self) for w in self.view.workers}
        self._wake: dict[str, Event | None] = {w: None for w in self.engines}
        self._runs: dict[str, StepRun | None] = {w: None for w in self.engines}  # what each worker sleeps through
        # folded runs may complete host stores (vLLM's tier): a step start comes after theirs
        self._folds_copies = fast_forward and config.host_tier is not None
        self._workers: dict[str, Process] = {}
        self._waiters: dict[str, Event] = {}
        self._held: dict[str, RequestSpec] = {}
        self._last_request: dict[str, RequestSpec] = {}  # per program, for pins
        self._pin_serial: dict[str, int] = {}  # per program: which pin a TTL timer belongs to
        # vLLM's front end refuses a prompt as long as it serves, and cuts the output of a
        # shorter one to fit (see `served_len`); the mocker takes any request
        self._served_len = config.max_model_len if engine_cfg.flavour == "vllm" else None
        self._reuse_output = engine_cfg.reuse_output_blocks
        self._private_outputs = 0
        # How much fast-forwarding saved: engine steps folded into runs, and those of them that
        # carried a prefill chunk besides the decodes
        self.folded_steps = 0
        self.folded_prefill_steps = 0
        self.folded_copy_steps = 0  # folded steps that completed host stores
        # Weight syncs (asynchronous RL): the engines' weight version; while a sync runs, calls
        # routed wait at their worker (verl's closed gate), in order; the versions each program's
        # calls generated under (lowest, highest)
        self.weight_version = 0
        self._syncing = False
        self._gated: list[tuple[RequestSpec, str, int]] = []
        self._retry_after_s = 0.0
        self._sync_reason = ""
        self._aborting: set[str] = set()  # workers to abort when their step ends
        self._aborted = self.env.event()
        self._versions: dict[str, tuple[int, int]] = {}

    # --- running -------------------------------------------------------------------------------

    def run(self, progress: Progress | None = None) -> None:
        s = self.scenario
        env = self.env
        self.emit(run_header(s, self.view))
        for index, engine in enumerate(self.engines.values()):
            self._workers[engine.worker] = env.process(self._worker(engine, index))
        workload_done = start_workload(self)
        if self.policy.tick_interval_s:
            env.process(self._ticks(self.policy.tick_interval_s))
        env.process(self._samples(s.metrics.sample_interval_s))
        if progress is not None:
            env.process(self._progress(progress))
        deadline = env.timeout(s.duration_s)
        with fewer_collections():
            env.run(until=deadline if workload_done is None else env.any_of([workload_done, deadline]))
        iterations = sum(e.iterations for e in self.engines.values())
        iterations += sum(run.started(env.now) - 1 for run in self._runs.values() if run is not None)
        if self._check:
            for engine in self.engines.values():
                self._audit(engine, every_block=True)
        self.emit(ev.RunEnded(env.now, iterations, len(self._waiters), *self._host_totals()))

    def _host_totals(self) -> tuple[int, float, float]:
        """Over every worker's host tier: tokens stored, and seconds each copy lane was busy."""
        stored = 0
        d2h = h2d = 0.0
        for engine in self.engines.values():
            engine_stored, engine_d2h, engine_h2d = engine.host_totals()
            stored += engine_stored
            d2h += engine_d2h
            h2d += engine_h2d
        return stored, d2h, h2d

    def _audit(self, engine: StepEngine, every_block: bool = False) -> None:
        problem = engine.audit(every_block)
        if problem is not None:
            raise InvariantViolation(f"t={self.env.now:.6f} {engine.worker}: {problem}")

    # --- processes ---------------------------------------------------------------------------

    def _worker(self, engine: StepEngine, index: int) -> Generator[Event, object, None]:
        """Run the engine one `StepRun` at a time (see `tasim.sim.clock` for the order of
        simultaneous events)."""
        env = self.env
        worker = engine.worker
        while True:
            if not engine.has_work:
                yield self._sleep(engine, index)
            yield Alarm(env, env.now, STEP_START_PRIORITY + index)
            if self._folds_copies:
                self._start_copies_before(index)
            step = engine.begin_step(env.now)
            if not step.scheduled:
                if step.preempted:
                    continue  # everything runnable was preempted; the next step re-admits
                # The queue head cannot be admitted until something frees blocks (a pin expires,
                # a new request arrives, a KV copy completes): sleep until woken rather than spin
                # at this instant.
                yield self._sleep(engine, index)
                continue
            run = self._runs[worker] = StepRun(engine, step)
            if self._fast_forward:
                run.extend()
            while True:
                try:
                    yield Alarm(env, run.end, STEP_END_PRIORITY + index)
                    break
                except Interrupt:
                    if self._runs[worker] is not run:
                        break  # a weight sync ended it at the instant it was cut to
                    # cut short: sleep until its new end
            if self._runs[worker] is run:
                self._end_run(engine, run)
                if worker in self._aborting:
                    self._abort_all(engine)
                if self._check:
                    self._audit(engine)

    def _end_run(self, engine: StepEngine, run: StepRun) -> None:
        self._runs[engine.worker] = None
        run.complete(self.env.now)
        self.folded_steps += run.steps - 1
        if run.folds_prefill:
            self.folded_prefill_steps += run.steps - 1
        self.folded_copy_steps += run.copied

    def _sleep(self, engine: StepEngine, index: int) -> Event:
        """What an engine with nothing to schedule waits for: being woken, or its next KV copy's
        completion (an engine with copies in flight steps without a forward to see them done)."""
        wake = self._wake[engine.worker] = self.env.event()
        done = engine.next_transfer_done
        if done == float("inf"):
            return wake
        return self.env.any_of([wake, Alarm(self.env, max(done, self.env.now), STEP_START_PRIORITY + index)])

    def _catch_up(self, t: float) -> None:
        """Before anything happens at ``t``: bring folded steps up to ``t`` and publish the KV
        events of every step that has ended, in time order, then the host tier's of the steps
        that started (after everything at their instant: steps start last), then worker order."""
        due = []
        for index, run in enumerate(self._runs.values()):
            if run is not None and run.next_due <= t:
                due += [(at, host, index, run, stored, removed) for at, host, stored, removed in run.catch_up(t)]
        if len(due) > 1:
            due.sort(key=itemgetter(0, 1, 2))
        for at, host, _, run, stored, removed in due:
            if host:
                run.publish_host(stored, removed, at)
            else:
                run.engine.publish_kv(stored, removed, at)

    def _start_copies_before(self, index: int) -> None:
        """A worker's step starts now: first the folded steps of the workers before it that
        start now too, with the host copies they complete (see `StepRun.start_copies`)."""
        now = self.env.now
        for before, run in enumerate(self._runs.values()):
            if before == index:
                break
            if run is not None:
                for at, _, stored, removed in run.start_copies(now):
                    run.publish_host(stored, removed, at)

    def _changing(self, worker: str) -> None:
        """Something outside is about to change the engine: its run keeps only the steps already
        started (the next step must see the change)."""
        run = self._runs[worker]
        if run is not None and run.cut(self.env.now):
            self._workers[worker].interrupt()

    def run_program(self, script: Script) -> Generator[Event, object, None]:
        """Run one program: each call waits its gap (set-up, tool or think time), is routed by
        the policy, and completes before the next gap starts. The program ends with its last
        call; its client releases it then, later (on a process of its own, so a closed loop's
        next program does not wait) or never, as ``script.release_after_s`` says."""
        env = self.env
        self.program_started(script.id, script.turns, env.now)
        context = 0
        for wait, spec in script.calls:
            if wait > 0:
                tool = spec.turn > 0  # before the first call the wait is environment set-up
                if tool:
                    self.emit(ev.ToolStarted(env.now, script.id, wait))
                yield env.timeout(wait)
                if tool:
                    self.emit(ev.ToolFinished(env.now, script.id))
            ok = yield from self._call(spec)
            if not ok:
                completed = False
                break
            context = spec.prompt_tokens + spec.output_tokens
        else:
            completed = script.turns > 0
        release = script.release_after_s
        self.program_finished(script.id, context, completed, release == 0.0, env.now)
        self._last_request.pop(script.id, None)  # no turn of it ends after this, so no pin comes
        if release == 0.0:
            self._release(script.id)
        elif release is not None:
            env.process(self._release_later(script.id, release))

    def _call(self, spec: RequestSpec) -> Generator[Event, object, bool]:
        """Send one call and wait for its end; whether it completed. A call a weight sync
        aborts goes again after the client's retry delay, as a new request of the turn whose
        prompt holds the output generated so far (verl's partial-rollout client)."""
        env = self.env
        call = spec
        calls = 1
        while True:
            done = self._waiters[call.id] = env.event()
            self._last_request[call.program] = call
            decision = self.arrive(call, env.now)
            if isinstance(decision, Route):
                self._submit(call, decision.worker, decision.priority)
            else:
                self._held[call.program] = call
            outcome = yield done  # the policy has already heard the turn end (see `on_finished`)
            if not isinstance(outcome, Aborted):
                return outcome is True
            yield env.timeout(outcome.retry_after_s)
            calls += 1
            call = partial_retry(spec, call, outcome.output_tokens, calls)

    def _release(self, program: str) -> None:
        """The client's release (session-final): the policy forgets the program and its pin
        goes (an unreleased program's pin lasts until its TTL)."""
        self.program_released(program, self.env.now)
        if self._pin_serial.pop(program, None) is not None:
            self._unpin_everywhere(program)

    def _release_later(self, program: str, delay_s: float) -> Generator[Event, object, None]:
        yield self.env.timeout(delay_s)
        self.emit(ev.ProgramReleased(self.env.now, program))
        self._release(program)

    def begin_weight_sync(self, version: int, retry_after_s: float) -> Event:
        """The trainer starts pushing ``version``: the policy is told and every worker's gate
        closes. Each engine then aborts every call it runs, at the end of the step it is in
        (vLLM's ``pause_generation``; each call's client retries it ``retry_after_s`` later),
        drops its pins and empties its prefix cache. The event fires when every engine has."""
        now = self.env.now
        self.weight_sync_began(version, now)
        self._syncing = True
        self._retry_after_s = retry_after_s
        self._sync_reason = f"weight sync to version {version}"
        self._aborted = self.env.event()
        for worker, engine in self.engines.items():
            run = self._runs[worker]
            if run is not None:
                self._changing(worker)
                if run.end == now:
                    # Cut to this instant: its last step ends now, as a stepped engine's step
                    # ending now has already, so it aborts now, in worker order, as that one does.
                    self._end_run(engine, run)
            if self._runs[worker] is None:
                self._abort_all(engine)
            else:
                self._aborting.add(worker)
        if not self._aborting and not self._aborted.triggered:  # every engine stopped at once (none: no abort said so)
            self._aborted.succeed()
        return self._aborted

    def _abort_all(self, engine: StepEngine) -> None:
        now = self.env.now
        worker = engine.worker
        self._aborting.discard(worker)
        for spec, generated in engine.abort_all():
            if generated:
                self._generated_under(spec.program)
            self.turn_retried(spec, worker, self._sync_reason, now, generated)
            self._waiters.pop(spec.id).succeed(Aborted(generated, self._retry_after_s))
        for program in list(self._pin_serial):  # a pin keeps KV of the old weights: it goes too
            self._unpin(engine, program)
        engine.clear_prefix_cache(now)
        if not self._aborting and not self._aborted.triggered:
            self._aborted.succeed()

    def end_weight_sync(self, version: int) -> None:
        """The workers serve ``version``: the calls that waited at their gates go in, in the
        order they were routed; then the policy may release what it held. Only after the event
        `begin_weight_sync` returned."""
        if self._aborting:
            raise RuntimeError(f"weight sync to version {version} ended before the engines stopped")
        self._syncing = False
        self.weight_version = version
        gated, self._gated = self._gated, []
        for spec, worker, priority in gated:
            self._submit(spec, worker, priority)
        self.weight_sync_ended(version, self.env.now)

    def pop_versions(self, program: str) -> tuple[int, int]:
        """The lowest and highest weight versions ``program``'s calls generated under
        (forgotten then); the current version for one that generated nothing."""
        return self._versions.pop(program, (self.weight_version, self.weight_version))

    def _generated_under(self, program: str) -> None:
        version = self.weight_version
        seen = self._versions.get(program)
        self._versions[program] = (version, version) if seen is None else (min(seen[0], version), max(seen[1], version))

    def clear_prefix_caches(self) -> None:
        """Drop every worker's cached KV (after a weight update); policies see the removals."""
        for engine in self.engines.values():
            self._changing(engine.worker)
            engine.clear_prefix_cache(self.env.now)

    def _ticks(self, interval: float) -> Generator[Event, object, None]:
        while True:
            yield self.env.timeout(interval)
            self.tick(self.env.now)

    def _samples(self, interval: float) -> Generator[Event, object, None]:
        while True:
            now = self.env.now
            for engine in self.engines.values():
                kv_cache = engine.kv_cache
                self.emit(ev.WorkerSample(now, engine.worker, kv_cache.active, kv_cache.cached_blocks, len(engine.running), len(engine.waiting)))
            yield self.env.timeout(interval)

    def _progress(self, report: Progress) -> Generator[Event, object, None]:
        step = self.scenario.duration_s / 200
        while True:
            report(self.env.now)
            yield self.env.timeout(step)

    # --- what a decision does here -----------------------------------------------------------

    def _submit(self, spec: RequestSpec, worker: str, priority: int = 0) -> None:
        """Hand a routed request to its worker's engine (during a weight sync: once it ends)."""
        if self._syncing:
            self._gated.append((spec, worker, priority))
            return
        served = self._served_len
        if served is not None and spec.prompt_tokens + spec.output_tokens > served:
            if spec.prompt_tokens >= served:
                reason = f"prompt of {spec.prompt_tokens} tokens reaches max_model_len {served}"
                self.on_dropped(worker, spec, reason, self.env.now)
                return
            spec = replace(spec, output_tokens=served - spec.prompt_tokens, block_hashes=spec.block_hashes[: served // self.block_size])
        self._changing(worker)
        self.engines[worker].submit(spec if self._reuse_output else self._private_output(spec), priority)
        self._wake_worker(worker)

    def _resume_held(self, program: str, worker: str, now: float) -> None:
        held = self._held.pop(program, None)
        if held is not None:
            self.route(held, worker, now)
            self._submit(held, worker)

    def _private_output(self, spec: RequestSpec) -> RequestSpec:
        """The request as an engine that cannot reuse generated blocks caches it: every block
        from the prompt's partial tail on gets a hash no prompt has."""
        self._private_outputs += 1
        owner = PRIVATE_OUTPUTS.key(self._private_outputs)
        hashes = with_private_tail(spec.prompt_block_hashes(self.block_size), spec.prompt_tokens + spec.output_tokens, owner, self.block_size)
        return spec.with_block_hashes(hashes)

    def _wake_worker(self, worker: str) -> None:
        wake = self._wake[worker]
        if wake is not None and not wake.triggered:
            wake.succeed()

    def _pin(self, pin: Pin, now: float) -> bool:
        spec = self._last_request.get(pin.program)
        engine = self.engines.get(pin.worker)
        if spec is None or engine is None:
            raise ValueError(f"policy {self.policy.name} pinned {pin.program!r} on {pin.worker!r}, which has no request there")
        self._unpin_everywhere(pin.program)  # a program holds at most one pin
        self._changing(pin.worker)
        blocks = engine.pin(pin.program, spec.block_hashes)
        serial = self._pin_serial[pin.program] = self._pin_serial.get(pin.program, 0) + 1
        self.emit(ev.ProgramPinned(now, pin.program, pin.worker, blocks, pin.ttl_s))
        self.env.process(self._expire_pin(engine, pin.program, pin.ttl_s, serial))
        return True

    def _expire_pin(self, engine: StepEngine, program: str, ttl_s: float, serial: int) -> Generator[Event, object, None]:
        yield self.env.timeout(ttl_s)
        if self._pin_serial.get(program) == serial:  # not replaced by a later pin meanwhile
            self._unpin(engine, program)

    def _unpin_everywhere(self, program: str) -> None:
        for engine in self.engines.values():
            self._unpin(engine, program)

    def _unpin(self, engine: StepEngine, program: str) -> None:
        if engine.has_pin(program):
            self._changing(engine.worker)
            engine.unpin(program)
            self._wake_worker(engine.worker)  # freed blocks may let its queue head in

    # --- engine listener ---------------------------------------------------------------------

    def on_admitted(
        self, worker: str, request: RequestSpec, cached_tokens: int, recompute_tokens: int, first: bool, now: float, host_tokens: int = 0
    ) -> None:
        if first:
            self.emit(ev.PrefillStarted(now, request.id, worker, cached_tokens, host_tokens))
        else:
            self.emit(ev.RequestReadmitted(now, request.id, worker, recompute_tokens, cached_tokens, host_tokens))

    def on_preempted(self, worker: str, request: RequestSpec, lost_tokens: int, now: float) -> None:
        self.emit(ev.RequestPreempted(now, request.id, worker, lost_tokens))

    def on_kv(self, worker: str, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None:
        self.kv_stored(worker, stored, now)
        self.kv_removed(worker, removed, now)

    def on_host_kv(self, worker: str, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None:
        """The host tier's events: logged, and told to a policy that wants KV events, as Dynamo's
        router hears a worker's ``host_pinned`` events (a store when its copy completes, a
        removal at eviction)."""
        self.kv_stored(worker, stored, now, "host")
        self.kv_removed(worker, removed, now, "host")

    def on_first_token(self, worker: str, request: RequestSpec, now: float) -> None:
        self.first_token(request.id, worker, now)

    # The policy hears a turn end at once, while the engine still holds the request's blocks (a
    # pin must take them before the next step can evict them); then the program wakes.

    def on_finished(self, worker: str, request: RequestSpec, cached_tokens: int, now: float) -> None:
        self._generated_under(request.program)
        self.turn_finished(request, worker, request.prompt_tokens, request.output_tokens, cached_tokens, now, tool=request.tool_call)
        self._waiters.pop(request.id).succeed(True)

    def on_dropped(self, worker: str, request: RequestSpec, reason: str, now: float) -> None:
        self.turn_failed(request, worker, reason, now)
        self._waiters.pop(request.id).succeed(False)
