"""What the simulator and the live router do alike around one policy.

A policy is hosted twice: by `tasim.sim.runner.Simulation`, in simulated time, and by
`tasim.live.router.live_host.PolicyHost`, behind Dynamo. Both must give the policy the same notifications in
the same order, apply its decisions the same way and log the same events, or a policy judged
in simulation would not be the object that routes real traffic. `HostCore` is that common part:
building the policy from the scenario, the run header, program starts and ends, arrivals and the
policy's answer to each, routing, program decisions (pause, resume, pin), first tokens, turn
ends, KV events, ticks, and the counters that status and summaries read. A host subclass keeps
only its own waiting mechanism (the simulator's processes, asyncio futures) and I/O, and says
through two hooks what a decision means there: `_resume_held` routes a resumed program's held
calls, `_pin` keeps blocks referenced where the engine can (the simulator's can, Dynamo's
workers cannot: an unhonoured pin is counted in ``ignored_pins`` and warned about once, in
either host).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from mypy_extensions import mypyc_attr

from tasim.config.scenario import Scenario
from tasim.core import events as ev
from tasim.core.cluster_view import ClusterView
from tasim.core.determinism import policy_rng
from tasim.core.kv_tier import KvTier
from tasim.core.model import BlockHash, RequestSpec
from tasim.policies import Hold, Pause, Pin, Policy, Release, Resume, Route, TurnEnd, make_policy
from tasim.policies.interface import ProgramDecision, RequestDecision

logger = logging.getLogger(__name__)

Emit = Callable[[ev.Event], None]


def build_policy(scenario: Scenario, view: ClusterView) -> Policy:
    """The scenario's policy with its parameters and its seeded stream of tie-breaks."""
    return make_policy(scenario.policy.name, scenario.policy.effective_params, view, policy_rng(scenario.seed))


def run_header(scenario: Scenario, view: ClusterView) -> ev.RunStarted:
    """The first event of every log."""
    return ev.RunStarted(
        0.0,
        scenario.name,
        scenario.policy.name,
        scenario.seed,
        scenario.duration_s,
        view.worker_ids,
        view.workers[0].block_size,
        view.workers[0].kv_blocks,
        scenario.metrics.warmup_s,
        scenario.cluster.host_blocks_per_worker(),
    )


# Compiled with the simulator's core (`tasim.native`), and subclassed by the live router's host,
# which is not.
@mypyc_attr(allow_interpreted_subclasses=True)
class HostCore:
    """The policy, the log and the counters; ``lost`` holds workers out of service (live mode)."""

    def __init__(self, policy: Policy, emit: Emit, log_kv_events: bool) -> None:
        self.policy = policy
        self.emit = emit
        self.log_kv_events = log_kv_events
        workers = policy.view.worker_ids
        self.routed: dict[str, int] = dict.fromkeys(workers, 0)
        self.in_flight_on: dict[str, int] = dict.fromkeys(workers, 0)
        self.in_flight = 0
        self.finished = 0
        self.failed = 0
        self.pauses = 0
        self.resumes = 0
        self.ignored_pins = 0
        self.lost: set[str] = set()

    # --- what a host does with a decision ------------------------------------------------------

    def _resume_held(self, program: str, worker: str, now: float) -> None:
        """Route the program's held calls to ``worker`` now, each through `route`."""
        raise NotImplementedError

    def _pin(self, pin: Pin, now: float) -> bool:
        """Keep the program's blocks referenced as ``pin`` says; False where the engines cannot."""
        return False

    # --- programs ------------------------------------------------------------------------------

    def program_started(self, program: str, planned_turns: int, now: float) -> None:
        self.emit(ev.ProgramStarted(now, program, planned_turns))
        self.policy.on_program_start(program, now)

    def program_finished(self, program: str, context_tokens: int, completed: bool, released: bool, now: float) -> None:
        self.emit(ev.ProgramFinished(now, program, context_tokens, completed, released))

    def program_released(self, program: str, now: float) -> None:
        """The client released the program (its session-final): the policy forgets it."""
        self.apply(self.policy.on_program_end(program, now), now)

    # --- calls ---------------------------------------------------------------------------------

    def arrive(self, spec: RequestSpec, now: float) -> RequestDecision:
        """A call reaches the router: the policy routes it (logged and counted in flight) or
        holds it (the host keeps it until `_resume_held`)."""
        self.emit(ev.RequestArrived(now, spec.id, spec.program, spec.turn, spec.prompt_tokens, spec.history_tokens, spec.output_tokens))
        decision = self.policy.on_request(spec, now)
        if isinstance(decision, Route):
            self.route(spec, decision.worker, now)
        elif isinstance(decision, Hold):
            self.emit(ev.RequestHeld(now, spec.id, spec.program))
            if decision.pause:
                self.pauses += 1
                self.emit(ev.ProgramPaused(now, spec.program))
        else:
            raise TypeError(f"policy {self.policy.name} returned {decision!r} for a request; expected Route or Hold")
        return decision

    def route(self, spec: RequestSpec, worker: str, now: float) -> None:
        """``spec`` goes to ``worker`` now: logged, and in flight there until its turn ends."""
        if worker not in self.routed or worker in self.lost:
            state = "lost" if worker in self.lost else "unknown"
            raise ValueError(f"policy {self.policy.name} routed {spec.id} to {state} worker {worker!r}")
        self.routed[worker] += 1
        self.in_flight_on[worker] += 1
        self.in_flight += 1
        self.emit(ev.RequestRouted(now, spec.id, worker))

    def first_token(self, request: str, worker: str, now: float) -> None:
        self.emit(ev.FirstToken(now, request))
        self.policy.on_first_token(request, worker, now)

    def turn_finished(
        self, spec: RequestSpec, worker: str, prompt_tokens: int, output_tokens: int, cached_tokens: int, now: float, tool: str | None = None
    ) -> None:
        """The call completed with this usage (the engine's own, in live mode)."""
        self._landed(worker)
        self.finished += 1
        self.emit(ev.RequestFinished(now, spec.id, spec.program, worker, prompt_tokens, output_tokens, cached_tokens))
        self.apply(self.policy.on_turn_end(TurnEnd(spec.program, spec.id, worker, prompt_tokens, output_tokens, cached_tokens, tool=tool), now), now)

    def turn_failed(self, spec: RequestSpec, worker: str, reason: str, now: float) -> None:
        """The call failed or was dropped; ``worker`` "" for one that was never routed."""
        if worker:
            self._landed(worker)
        self.failed += 1
        self.emit(ev.RequestDropped(now, spec.id, spec.program, worker, reason))
        self.apply(self.policy.on_turn_end(TurnEnd(spec.program, spec.id, worker, spec.prompt_tokens, 0, 0, ok=False), now), now)

    def turn_retried(self, spec: RequestSpec, worker: str, reason: str, now: float, output_tokens: int = 0) -> None:
        """The call ended short (its worker lost, or aborted by a weight sync) after generating
        ``output_tokens``; the host sends it again as a new call (`arrive`)."""
        self._landed(worker)
        self.emit(ev.RequestRetried(now, spec.id, spec.program, worker, reason, output_tokens))
        self.apply(self.policy.on_turn_end(TurnEnd(spec.program, spec.id, worker, spec.prompt_tokens, output_tokens, 0, ok=False), now), now)

    def _landed(self, worker: str) -> None:
        self.in_flight -= 1
        self.in_flight_on[worker] -= 1

    # --- the policy's own decisions and what the workers report ---------------------------------

    def tick(self, now: float) -> None:
        self.apply(self.policy.on_tick(now), now)

    def weight_sync_began(self, version: int, now: float) -> None:
        """The trainer starts pushing ``version``: logged, and the policy told before the
        engines abort what they run."""
        self.emit(ev.WeightSyncStarted(now, version))
        self.policy.on_weight_sync_begin(now)

    def weight_sync_ended(self, version: int, now: float) -> None:
        self.emit(ev.WeightSyncFinished(now, version))
        self.apply(self.policy.on_weight_sync_end(now), now)

    def apply(self, decisions: Sequence[ProgramDecision], now: float) -> None:
        """Carry out the policy's program decisions, in its order."""
        for decision in decisions:
            if isinstance(decision, Pause):
                self.pauses += 1
                self.emit(ev.ProgramPaused(now, decision.program))
            elif isinstance(decision, Resume):
                self.resumes += 1
                self.emit(ev.ProgramResumed(now, decision.program, decision.worker, decision.forced))
                self._resume_held(decision.program, decision.worker, now)
            elif isinstance(decision, Release):
                self._resume_held(decision.program, decision.worker, now)
            elif isinstance(decision, Pin):
                if not self._pin(decision, now):
                    if not self.ignored_pins:
                        logger.warning("policy %s asks to pin KV blocks; these workers cannot, so pins are ignored", self.policy.name)
                    self.ignored_pins += 1
            else:
                raise TypeError(f"policy {self.policy.name} returned {decision!r}; expected Pause, Resume, Release or Pin")

    def kv_stored(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        """``blocks`` newly held in ``worker``'s ``tier``: logged, and told to a policy that
        wants KV events (every tier: the policy decides what a tier is worth)."""
        if not blocks:
            return
        if self.log_kv_events:
            self.emit(ev.KvStored(now, worker, tuple(blocks), tier))
        if self.policy.wants_kv_events:
            self.policy.on_kv_stored(worker, blocks, now, tier)

    def kv_removed(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        if not blocks:
            return
        if self.log_kv_events:
            self.emit(ev.KvRemoved(now, worker, tuple(blocks), tier))
        if self.policy.wants_kv_events:
            self.policy.on_kv_removed(worker, blocks, now, tier)
