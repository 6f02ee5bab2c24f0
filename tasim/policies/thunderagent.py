"""ThunderAgent's program scheduler (arXiv 2602.13692), in two variants.

``variant: upstream`` follows ThunderAgent-org/ThunderAgent's router as shipped: a backend's use
is ``Σ tokens(REASONING) + w·Σ tokens(ACTING) + 100·programs``; a new program is placed only when
the global queue is empty, on the backend with the fewest active tokens that has room; programs
are sticky after that. Every Δt = 5 s the scheduler first resumes, then pauses: a backend over
capacity pauses its ACTING programs smallest first until it fits, then *marks* every REASONING
program (smallest first) to pause when its turn ends. Resume takes the paused queue in groups
G1 (a request is waiting) → G2 (new programs) → G3 (paused while in a tool), each smallest first
by the size a program had when paused, selects greedily by its current size (a waiting request's
prompt) against the total free room, then places largest first on the backend with the most
room. An optional 2^(−t/τ) decay discounts ACTING tokens on the resume side only. A request
held 1,800 s is force-resumed (new programs to the backend with fewest programs, others to their
origin) without a capacity check.

``variant: dynamo`` follows Dynamo 1.6.1's ``dynamo.thunderagent_router``: exact token counts,
pause above 0.95 of capacity and drain to 0.80, resume only while below 0.95 − 0.10, a soft
demotion band [0.80, 0.95), the decay (τ = 1 s) used to rank backends for forced resumes, and
resume ordering by current tokens. Like upstream, 1.6.1's program table drops a program only when
it is released; ``idle_ttl_s`` (tasim's addition, off in both variants) releases ACTING programs
idle that long, for clients that never release.

Known upstream defects are switchable fixes, all off in ``upstream``: a turn that ends without
usage (a failed request) still moves the program to ACTING; FIFO or aged admission of new
programs instead of smallest first (ThunderAgent issues #45/#46); best-fit placement; resuming on
the origin backend while enough of the program's blocks survive there; counting context blocks
that several programs on a backend share once (``shared_prefix``: upstream's ``shared_tokens``,
which it never updates, ThunderAgent #36 and Dynamo #15105).

A backend's capacity (Dynamo's retention budget) is its GPU pool in tokens plus, by
``host_credit``, the host KV capacity its worker publishes (`tasim.core.cluster_view.WorkerInfo`:
``native_offload_tokens``, from the scenario's host tier): ``full`` adds all of it, as Dynamo
1.6.1 does since PR #11185 (dynamo/thunderagent_router/capacity.py: ``kv_cache_block_size x
total_kv_blocks + native_offloading_capacity_tokens``, the default of ``variant: dynamo``);
``capped`` adds at most the GPU pool again, the "cap HiCache admission credit at the GPU pool
size" of closed Dynamo PR #14389, which found that programs spilled to the host never leave the
count, so a large host tier stops pauses altogether; ``none`` counts the GPU pool alone, as
upstream ThunderAgent does (the default of ``variant: upstream``). A worker publishes host
capacity only with SGLang's tier semantics, so a vLLM-style tier adds nothing in any mode, as in
Dynamo 1.6.1 (`tasim.config.workers.native_offload_tokens`).

Both variants re-place the programs of a worker that was lost (live mode), as Dynamo's port does
since its PR #12783: a program whose backend is gone is placed at its next request on a backend
with room, ahead of the queue of new programs, or queued (paused) when none has room; upstream
would keep sending it to the dead backend.

At a turn's end both variants count the program as prompt + completion from the engine's usage.
Before the reply Dynamo's port counts the tokenized prompt (``len(token_ids)``), and so does
``upstream`` by default. Upstream itself estimates it as characters / a learned ratio (5.0 until
the first reply; see ``chars_per_token``): ``payload_chars_per_token`` models that, taking a
request's payload to have that many characters per prompt token, since tasim has no text. That
estimate is what every decision made before the reply reads: the admission of a new program, the
size a queued new program is ordered by, a held request's size in the resume selection and
placement, and a REASONING program's share of its backend on the pause side. Neither variant
adds upstream's streamed +20 tokens per 20 events during a turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasim.core.cluster_view import ClusterView
from tasim.core.kv_tier import KvTier
from tasim.core.model import BlockHash, RequestSpec
from tasim.core.rollout_ids import rollout_group_of
from tasim.policies.chars_per_token import LearnedCharsPerToken
from tasim.policies.interface import Hold, Pause, Policy, ProgramDecision, Release, Resume, Route, TurnEnd

Variant = Literal["upstream", "dynamo"]
HostCredit = Literal["full", "capped", "none"]

# Every integer below 2^53 is a float exactly, and so is every sum of such floats that stays below it.
_EXACT_FLOAT_INTS = 2**53

# Defaults that differ between the variants; everything else is shared.
_VARIANT_DEFAULTS: dict[str, dict[str, Any]] = {
    "upstream": {
        "pause_threshold": 1.0,
        "pause_target": 1.0,
        "resume_hysteresis": 0.0,
        "soft_demote_threshold": None,
        "acting_decay_tau_s": None,
        "fix_failed_turn": False,
        "host_credit": "none",
    },
    "dynamo": {
        "pause_threshold": 0.95,
        "pause_target": 0.80,
        "resume_hysteresis": 0.10,
        "soft_demote_threshold": 0.80,
        "acting_decay_tau_s": 1.0,
        "fix_failed_turn": True,
        "host_credit": "full",
    },
}


class ThunderAgentParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf passes gt/ge and breaks a run

    variant: Variant = Field("upstream", description="upstream ThunderAgent or Dynamo 1.6.1's port")
    # 1 ms at least, like metrics.sample_interval_s: a shorter period would stop the clock
    scheduler_interval_s: float = Field(5.0, ge=0.001, description="Δt between resume/pause passes")
    acting_token_weight: float = Field(1.0, ge=0, description="w on ACTING tokens in a backend's use")
    buffer_per_program: int = Field(100, ge=0, description="tokens added per program")
    pause_threshold: float = Field(1.0, gt=0, description="pause when use > threshold x capacity (dynamo 0.95)")
    pause_target: float = Field(1.0, gt=0, description="pausing drains use down to target x capacity (dynamo 0.80)")
    resume_hysteresis: float = Field(0.0, ge=0, description="resume only below (threshold - hysteresis) x capacity")
    soft_demote_threshold: float | None = Field(None, gt=0, description="dynamo: demote programs on backends in [this, threshold)")
    acting_decay_tau_s: float | None = Field(
        None, gt=0, description="ACTING tokens count x 2^(-idle/tau); upstream: resume side, dynamo: forced-resume ranking"
    )
    resume_timeout_s: float = Field(1800.0, gt=0, description="a request held this long is force-resumed")
    weight_sync_timeout_s: float = Field(300.0, gt=0, description="a weight sync whose end never comes ends after this (upstream's watchdog)")
    idle_ttl_s: float | None = Field(None, gt=0, description="release ACTING programs idle this long (tasim's addition: neither source has one)")
    host_credit: HostCredit = Field(
        "none",
        description="host KV capacity a worker publishes, added to its capacity: full (Dynamo 1.6.1; the default with "
        "variant dynamo), capped at the GPU pool (closed Dynamo PR #14389) or none (upstream)",
    )
    fix_failed_turn: bool = Field(False, description="fix: a turn ending without usage still moves to ACTING")
    admission_order: Literal["smallest_first", "fifo", "aged"] = Field(
        "smallest_first", description="order of new programs in the resume queue (fix for #45/#46: fifo or aged)"
    )
    aging_tokens_per_s: float = Field(1000.0, gt=0, description="aged order: a waiting program's size shrinks by this per second")
    group_order: bool = Field(
        False,
        description="tasim's addition for GRPO: resume the programs of the oldest prompt group (by arrival) first and pause the youngest "
        "group's first, so a group's last samples are not the ones kept waiting (groups from rl_rollout trajectory ids)",
    )
    placement: Literal["most_room", "best_fit"] = Field("most_room", description="backend for a resumed program")
    resume_on_origin: bool = Field(False, description="fix: resume on the origin backend if its cached blocks survive")
    origin_min_cached_fraction: float = Field(0.5, gt=0, le=1, description="resume_on_origin: share of blocks that must survive")
    pause_order: Literal["smallest", "longest_idle", "longest_tool"] = Field(
        "smallest",
        description="which ACTING programs a full backend pauses first: the smallest (both sources), the longest in its "
        "tool so far, or the one whose tools have run longest on average (its own history; unknown: last)",
    )
    shared_prefix: bool = Field(False, description="fix: a context block shared by programs on a backend counts once there (#36, Dynamo #15105)")
    # At most 100: text runs at 1-10 characters per token, and a huge value overflows the counts.
    payload_chars_per_token: float | None = Field(
        None,
        gt=0,
        le=100,
        description=(
            "upstream: size a request as its payload's characters (this x its prompt tokens) / a learned ratio until its reply; None: exact counts"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _variant_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            variant = data.get("variant", "upstream")
            if isinstance(variant, str) and variant in _VARIANT_DEFAULTS:  # anything else: the field's own error
                return {**_VARIANT_DEFAULTS[variant], **data}
        return data

    @model_validator(mode="after")
    def _bands(self) -> ThunderAgentParams:
        if self.pause_target > self.pause_threshold:
            raise ValueError(f"pause_target ({self.pause_target}) must be <= pause_threshold ({self.pause_threshold})")
        if self.resume_hysteresis >= self.pause_threshold:
            raise ValueError("resume_hysteresis must be < pause_threshold")
        if self.group_order and (self.pause_order != "smallest" or self.admission_order != "smallest_first"):
            raise ValueError("group_order sets the pause and admission orders: leave pause_order and admission_order at their defaults")
        if self.variant == "dynamo" and self.payload_chars_per_token is not None:
            raise ValueError(
                "payload_chars_per_token is for variant upstream only (Dynamo's port counts the tokenized "
                "prompt, len(token_ids)): set it to null with variant dynamo"
            )
        return self


class Phase(Enum):
    REASONING = "reasoning"
    ACTING = "acting"


@dataclass(slots=True, eq=False)
class ProgramState:
    id: str
    tokens: int = 0
    phase: Phase = Phase.REASONING
    paused: bool = False
    backend: str | None = None
    origin: str | None = None
    steps: int = 0
    acting_since: float = 0.0
    marked: bool = False
    paused_tokens: int = 0  # upstream's PausedInfo.total_tokens: the size when it was paused
    queued_at: float = 0.0
    held_since: float | None = None  # a request of this program waits at the router
    displaced: bool = False  # its backend was lost: re-place it without waiting behind new programs
    blocks: tuple[BlockHash, ...] = ()  # the last prompt's blocks (for resume_on_origin)
    context: tuple[BlockHash, ...] = ()  # the last call's prompt and output blocks (for shared_prefix)
    tool_s: float = 0.0  # its tool calls' total time (the gaps between a turn's end and its next call)
    tools: int = 0
    payload_chars: int = 0  # upstream's context_len: the last request's payload length
    group: str = ""  # its GRPO prompt group (itself outside RL rollouts)
    group_rank: int = 0  # its group's place in the order groups first arrived (older: lower)


@dataclass(slots=True)
class BackendLoad:
    """The programs placed on a backend, summed for ``ThunderAgent.used``: kept up to date as a
    program's contribution changes (its size, its phase, its backend) instead of being recounted
    from every program at each read, which costs O(programs) inside per-request loops. Integers
    only, so the order the changes come in cannot change the totals."""

    programs: int = 0
    reasoning_tokens: int = 0
    acting_programs: int = 0
    acting_tokens: int = 0

    def count(self, q: ProgramState, sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) ``q``'s contribution."""
        self.programs += sign
        if q.phase is Phase.ACTING:
            self.acting_programs += sign
            self.acting_tokens += sign * q.tokens
        else:
            self.reasoning_tokens += sign * q.tokens


def retention_tokens(gpu_tokens: int, offload_tokens: int, host_credit: HostCredit) -> int:
    """A backend's capacity: its GPU pool plus the host capacity its worker publishes, all of it
    (``full``), at most the GPU pool again (``capped``) or none."""
    if host_credit == "full":
        return gpu_tokens + offload_tokens
    if host_credit == "capped":
        return gpu_tokens + min(offload_tokens, gpu_tokens)
    return gpu_tokens


class ThunderAgent(Policy[ThunderAgentParams]):
    name: ClassVar[str] = "thunderagent"
    holds_requests: ClassVar[bool] = True
    summary: ClassVar[str] = "ThunderAgent program scheduler: sticky programs, pause at tool boundaries, resume by groups"
    params_model: ClassVar[type[BaseModel]] = ThunderAgentParams

    def __init__(self, view: ClusterView, params: ThunderAgentParams, rng: np.random.Generator) -> None:
        super().__init__(view, params, rng)
        p = params
        self.tick_interval_s = p.scheduler_interval_s
        self._full_capacity = {w.id: retention_tokens(w.kv_capacity_tokens, w.native_offload_tokens, p.host_credit) for w in view.workers}
        self.capacity = dict(self._full_capacity)  # the serving backends, in cluster order
        self.programs: dict[str, ProgramState] = {}
        self.queue: dict[str, ProgramState] = {}  # paused programs in pause order
        self.soft_demoted_until: dict[str, float] = {}
        self.wants_kv_events = p.resume_on_origin
        self._cached: dict[str, set[BlockHash]] = {w: set() for w in self.capacity}
        # shared_prefix: per backend, how many of its programs' contexts hold each block, and the
        # tokens counted more than once because of that (what `used` gives back)
        self._holders: dict[str, dict[BlockHash, int]] = {w: {} for w in self.capacity}
        self.shared_tokens: dict[str, int] = dict.fromkeys(self.capacity, 0)
        self._loads = {w: BackendLoad() for w in self.capacity}
        # w as an exact fraction (its denominator a power of two): see _active_tokens
        self._weight_num, self._weight_den = p.acting_token_weight.as_integer_ratio()
        self._chars_per_token = LearnedCharsPerToken()  # read only with payload_chars_per_token
        self._block_size = view.workers[0].block_size
        # a weight sync in progress: since when, and the calls that arrived meanwhile, by id, in order
        self.weight_sync_since: float | None = None
        self._sync_held: dict[str, RequestSpec] = {}
        # group_order: per GRPO group, its place in arrival order and how many of its programs
        # are known; groups that arrive together (a GRPO batch) keep the order they came in
        self._groups: dict[str, tuple[int, int]] = {}
        self._groups_seen = 0

    # --- accounting ------------------------------------------------------------------------

    def _on(self, backend: str) -> list[ProgramState]:
        return [q for q in self.programs.values() if q.backend == backend and not q.paused]

    def _weighted(self, q: ProgramState) -> float:
        return q.tokens * self.params.acting_token_weight if q.phase is Phase.ACTING else q.tokens

    def _decayed(self, q: ProgramState, now: float) -> float:
        if q.phase is not Phase.ACTING or self.params.acting_decay_tau_s is None:
            return self._weighted(q)
        # Both upstream (remaining_capacity_with_decay) and Dynamo (_program_tokens(decayed))
        # apply the decay to the raw token count, without acting_token_weight.
        decay: float = 2.0 ** (-max(0.0, now - q.acting_since) / self.params.acting_decay_tau_s)  # float ** float may be complex
        return q.tokens * decay

    def used(self, backend: str, now: float | None = None) -> float:
        """Tokens counted against ``backend``; decayed (upstream's resume side) when ``now``
        is given and a decay is configured. The same value, bit for bit, as ``used_by_scan``."""
        if now is not None and self.params.acting_decay_tau_s is not None:
            # Each ACTING program's share depends on the time: no running total gives the
            # scan's float sum exactly, so this one configuration keeps the scan.
            return self.used_by_scan(backend, now)
        return self._active_tokens(backend) + self.params.buffer_per_program * self._loads[backend].programs - self.shared_tokens[backend]

    def used_by_scan(self, backend: str, now: float | None = None) -> float:
        """``used`` counted afresh from every program on ``backend``, in program order: the
        definition the running totals reproduce (tests compare the two)."""
        programs = self._on(backend)
        return self._scanned_tokens(programs, now) + self.params.buffer_per_program * len(programs) - self.shared_tokens[backend]

    def _scanned_tokens(self, programs: list[ProgramState], now: float | None) -> float:
        return sum(self._weighted(q) if now is None else self._decayed(q, now) for q in programs)

    def _active_tokens(self, backend: str) -> float:
        """Σ tokens(REASONING) + w·Σ tokens(ACTING) on ``backend``, as the scan's float sum
        gives it. The scan adds ints only while no program is ACTING (an int, the REASONING
        total). Otherwise each term and partial sum is a multiple of 1/den (w = num/den, den a
        power of two); while the whole, scaled by den, stays below 2^53 every one of them is a
        float exactly, so the scan's sum is the exact value in any order and equals the
        correctly rounded quotient below. Beyond that (a weight like 0.3, whose num is about
        2^52): the scan itself."""
        load = self._loads[backend]
        if not load.acting_programs:
            return load.reasoning_tokens
        scaled = load.reasoning_tokens * self._weight_den + load.acting_tokens * self._weight_num
        if scaled < _EXACT_FLOAT_INTS:
            return scaled / self._weight_den
        return self._scanned_tokens(self._on(backend), None)

    def _need(self, q: ProgramState, backend: str) -> int:
        """The room ``q`` takes on ``backend``: its tokens and buffer, less (``shared_prefix``)
        the blocks of its context that programs there already hold."""
        need = q.tokens + self.params.buffer_per_program
        if self.params.shared_prefix:
            holders = self._holders[backend]
            need -= self._block_size * sum(1 for block in q.context if block in holders)
        return need

    def _settle(self, q: ProgramState, backend: str | None) -> None:
        """Move ``q`` to ``backend`` (None: off every backend), its size and context blocks
        with it. A paused program has no backend, so only the placed ones count."""
        if q.backend is not None:
            self._loads[q.backend].count(q, -1)
            if self.params.shared_prefix:
                self._hold(q.backend, q.context, -1)
        q.backend = backend
        if backend is not None:
            self._loads[backend].count(q, 1)
            if self.params.shared_prefix:
                self._hold(backend, q.context, 1)

    def _resize(self, q: ProgramState, tokens: int, phase: Phase) -> None:
        """Set ``q``'s size and phase, and its backend's totals with them."""
        load = None if q.backend is None else self._loads[q.backend]
        if load is not None:
            load.count(q, -1)
        q.tokens, q.phase = tokens, phase
        if load is not None:
            load.count(q, 1)

    def _hold(self, backend: str, blocks: Sequence[BlockHash], change: int) -> None:
        """Count ``blocks`` in (1) or out (-1) of ``backend``'s programs' contexts; a block held
        by n programs was counted n times in their tokens, n - 1 too many."""
        holders = self._holders[backend]
        shared = 0
        for block in blocks:
            before = holders.get(block, 0)
            after = before + change
            if after:
                holders[block] = after
            else:
                del holders[block]
            shared += self._block_size * (max(after - 1, 0) - max(before - 1, 0))
        self.shared_tokens[backend] += shared

    # --- requests --------------------------------------------------------------------------

    def on_request(self, request: RequestSpec, now: float) -> Route | Hold:
        if self.weight_sync_since is not None:
            # upstream holds every new call before any accounting until the sync ends
            self._sync_held[request.id] = request
            return Hold()
        q = self.programs.get(request.program)
        if q is None:
            q = self.programs[request.program] = ProgramState(request.program)
            if self.params.group_order:
                self._join_group(q)
        q.steps += 1
        if q.phase is Phase.ACTING:
            q.tool_s += now - q.acting_since
            q.tools += 1
        payload_chars_per_token = self.params.payload_chars_per_token
        if payload_chars_per_token is None:
            tokens = request.prompt_tokens
        else:  # tasim has no text: a payload's length is taken as proportional to its tokens
            q.payload_chars = round(request.prompt_tokens * payload_chars_per_token)
            tokens = self._chars_per_token.tokens(q.payload_chars)
        self._resize(q, tokens, Phase.REASONING)
        if self.params.resume_on_origin:  # the only reader of q.blocks
            q.blocks = request.prompt_block_hashes(self._block_size)
        if self.params.shared_prefix:
            backend = q.backend
            self._settle(q, None)
            q.context = request.block_hashes
            self._settle(q, backend)
        if q.paused:
            q.held_since = now
            return Hold()
        if q.backend is not None:
            return Route(q.backend)
        # Only a new or a displaced program reaches this point: a placed one returned above, a
        # paused one waits. New programs never jump the queue; displaced ones were admitted once.
        backend = None if self.queue and not q.displaced else self._admission_backend(q)
        q.displaced = False
        if backend is not None:
            self._settle(q, backend)
            return Route(backend)
        self._enqueue(q, now, origin=None)
        q.held_since = now
        return Hold(pause=True)

    def _join_group(self, q: ProgramState) -> None:
        q.group = rollout_group_of(q.id) or q.id
        known = self._groups.get(q.group)
        if known is None:
            known = (self._groups_seen, 0)
            self._groups_seen += 1
        rank, members = known
        self._groups[q.group] = (rank, members + 1)
        q.group_rank = rank

    def _leave_group(self, q: ProgramState) -> None:
        rank, members = self._groups[q.group]
        if members > 1:
            self._groups[q.group] = (rank, members - 1)
        else:
            del self._groups[q.group]

    def _admission_backend(self, q: ProgramState) -> str | None:
        fits = [b for b in self.capacity if self.capacity[b] - self.used(b) >= self._need(q, b)]
        if not fits:
            return None
        if self.params.variant == "upstream":  # fewest active program tokens, buffers excluded
            return min(fits, key=lambda b: self._active_tokens(b) - self.shared_tokens[b])
        return min(fits, key=lambda b: self.used(b))

    def on_turn_end(self, turn: TurnEnd, now: float) -> Sequence[ProgramDecision]:
        if self._sync_held.pop(turn.request, None) is not None:
            return ()  # a call given up while the sync held it: upstream never accounted it
        q = self.programs.get(turn.program)
        if q is None:
            return ()
        if not turn.ok and not self.params.fix_failed_turn:
            return ()  # upstream: no usage, so the program stays REASONING
        if turn.ok and self.params.payload_chars_per_token is not None:
            self._chars_per_token.learn(q.payload_chars, turn.prompt_tokens)
        self._resize(q, turn.prompt_tokens + turn.output_tokens if turn.ok else q.tokens, Phase.ACTING)
        q.acting_since = now
        if q.marked and not q.paused:
            q.marked = False
            return [self._pause(q, now)]
        return ()

    def on_program_end(self, program: str, now: float) -> Sequence[ProgramDecision]:
        q = self.programs.pop(program, None)
        if q is not None:
            self._settle(q, None)
            if self.params.group_order:
                self._leave_group(q)
        self.queue.pop(program, None)
        self.soft_demoted_until.pop(program, None)
        if self._sync_held:
            self._sync_held = {rid: r for rid, r in self._sync_held.items() if r.program != program}
        return ()

    def on_worker_lost(self, worker: str, now: float) -> Sequence[ProgramDecision]:
        super().on_worker_lost(worker, now)
        del self.capacity[worker]
        self._cached[worker].clear()
        for q in self.programs.values():
            if q.backend == worker:
                self._settle(q, None)
                q.displaced, q.marked = True, False
            if q.origin == worker:
                q.origin = None  # nothing of it survives there
        return ()

    def on_worker_joined(self, worker: str, now: float) -> Sequence[ProgramDecision]:
        super().on_worker_joined(worker, now)
        self.capacity = {b: c for b, c in self._full_capacity.items() if b in self.serving}
        return ()

    # resume_on_origin asks whether the program's blocks survive on the GPU of its origin
    def on_kv_stored(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        if tier == "device":
            self._cached[worker].update(blocks)

    def on_kv_removed(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        if tier == "device":
            self._cached[worker].difference_update(blocks)

    # --- weight syncs (upstream's begin_weight_sync / end_weight_sync) ------------------------

    def on_weight_sync_begin(self, now: float) -> None:
        if self.weight_sync_since is None:  # a second begin does not restart the watchdog
            self.weight_sync_since = now

    def on_weight_sync_end(self, now: float) -> Sequence[ProgramDecision]:
        """Every call held through the sync goes through admission now, in arrival order: a
        placed program's call is released to its backend; a new one that finds no room queues
        (its program paused); a paused one waits for its resume as before."""
        if self.weight_sync_since is None:
            return ()
        self.weight_sync_since = None
        held, self._sync_held = self._sync_held, {}
        decisions: list[ProgramDecision] = []
        for request in held.values():
            decision = self.on_request(request, now)
            if isinstance(decision, Route):
                decisions.append(Release(request.program, decision.worker))
            elif decision.pause:
                decisions.append(Pause(request.program))
        return decisions

    # --- the periodic pass -----------------------------------------------------------------

    def on_tick(self, now: float) -> Sequence[ProgramDecision]:
        if self.weight_sync_since is not None:
            # upstream skips its passes during a sync; its watchdog (checked here, at the tick's
            # resolution) ends a sync whose end never came
            if now - self.weight_sync_since < self.params.weight_sync_timeout_s:
                return ()
            return self.on_weight_sync_end(now)
        decisions: list[ProgramDecision] = []
        self._expire_idle(now)
        decisions += self._forced_resumes(now)
        self._soft_demote(now)
        decisions += self._greedy_resume(now)
        decisions += self._pause_until_safe(now)
        return decisions

    def _expire_idle(self, now: float) -> None:
        ttl = self.params.idle_ttl_s
        if ttl is None:
            return
        for q in list(self.programs.values()):
            if q.phase is Phase.ACTING and q.held_since is None and now - q.acting_since > ttl:
                self.on_program_end(q.id, now)

    def _forced_resumes(self, now: float) -> list[ProgramDecision]:
        decisions: list[ProgramDecision] = []
        if not self.capacity:  # every backend lost: nowhere to resume
            return decisions
        for q in list(self.queue.values()):
            if q.held_since is None or now - q.held_since < self.params.resume_timeout_s:
                continue
            if self.params.variant == "dynamo":
                target = max(self.capacity, key=lambda b: self.capacity[b] - self.used(b, now))
            elif q.origin is None:
                target = min(self.capacity, key=lambda b: self._loads[b].programs)
            else:
                target = q.origin
            decisions.append(self._resume(q, target, now, forced=True))
        return decisions

    def _soft_demote(self, now: float) -> None:
        low = self.params.soft_demote_threshold
        if low is None:
            return
        until = now + 1.5 * self.params.scheduler_interval_s
        for backend, capacity in self.capacity.items():
            if low <= self.used(backend) / capacity < self.params.pause_threshold:
                for q in self._on(backend):
                    if not q.marked:
                        self.soft_demoted_until[q.id] = max(self.soft_demoted_until.get(q.id, 0.0), until)

    def is_soft_demoted(self, program: str, now: float) -> bool:
        """Dynamo lowers such a program's requests' priority by 2 s in its router queue (which
        only exists with a queue threshold); tasim records the state but has no such queue."""
        return self.soft_demoted_until.get(program, 0.0) > now

    def _order_size(self, q: ProgramState) -> int:
        """The size the resume queue is sorted by: upstream sorts by ``PausedInfo.total_tokens``
        (the size when paused), Dynamo by the current size. Both then select and place by the
        current size, for a held program its waiting prompt: what it occupies once resumed."""
        return q.paused_tokens if self.params.variant == "upstream" else q.tokens

    def _resume_order(self, now: float) -> list[ProgramState]:
        def group(q: ProgramState) -> int:
            # "New" is by step count, as in both sources: a program paused after its first turn
            # also counts as new (G2), not as G3.
            if q.steps <= 1:
                return 1
            return 0 if q.phase is Phase.REASONING else 2

        def key(q: ProgramState) -> tuple[int, float] | tuple[int, float, float]:
            g = group(q)
            if self.params.group_order:
                return g, q.group_rank, self._order_size(q)
            if g == 1 and self.params.admission_order == "fifo":
                return g, q.queued_at
            if g == 1 and self.params.admission_order == "aged":
                return g, self._order_size(q) - self.params.aging_tokens_per_s * (now - q.queued_at)
            return g, self._order_size(q)

        return sorted(self.queue.values(), key=key)  # stable: ties keep pause order

    def _greedy_resume(self, now: float) -> list[ProgramDecision]:
        if not self.queue:
            return []
        buffer = self.params.buffer_per_program
        ceiling = self.params.pause_threshold - self.params.resume_hysteresis
        decay_now = now if self.params.variant == "upstream" else None
        rooms = {b: int(c * ceiling) - self.used(b, decay_now) for b, c in self.capacity.items()}
        rooms = {b: r for b, r in rooms.items() if r > buffer}
        if not rooms:
            return []
        total = sum(rooms.values())
        selected: list[ProgramState] = []
        cumulative = 0
        for q in self._resume_order(now):
            need = min(self._need(q, b) for b in rooms)  # q.tokens + buffer unless shared_prefix
            if cumulative + need <= total:
                selected.append(q)
                cumulative += need
        if not selected:
            return []
        selected.sort(key=lambda q: -q.tokens)
        smallest = min(q.tokens for q in selected) + buffer
        decisions: list[ProgramDecision] = []
        for q in selected:
            if not rooms:
                break
            needs = {b: self._need(q, b) for b in rooms}  # the same everywhere unless shared_prefix
            largest = max(rooms.values())
            if smallest > largest and not self.params.shared_prefix:
                break
            fits = [b for b, r in rooms.items() if r >= needs[b]]
            if not fits:
                continue
            backend = self._placement(q, fits, rooms)
            decisions.append(self._resume(q, backend, now))
            rooms[backend] -= needs[backend]
            if rooms[backend] <= buffer:
                del rooms[backend]
        return decisions

    def _placement(self, q: ProgramState, fits: list[str], rooms: dict[str, float]) -> str:
        if self.params.resume_on_origin and q.origin in fits and self._survives_on(q, q.origin):
            return q.origin
        if self.params.placement == "best_fit":
            return min(fits, key=lambda b: rooms[b])
        # Upstream's "BFD" places on the backend with the most room (worst fit); ties go to
        # the first backend in cluster order, as a stable sort would leave them.
        return max(fits, key=lambda b: rooms[b])

    def _survives_on(self, q: ProgramState, backend: str) -> bool:
        if not q.blocks:
            return False
        cached = self._cached[backend]
        surviving = sum(1 for block in q.blocks if block in cached)
        return surviving >= self.params.origin_min_cached_fraction * len(q.blocks)

    def _pause_until_safe(self, now: float) -> list[ProgramDecision]:
        decisions: list[ProgramDecision] = []
        for backend, capacity in self.capacity.items():
            used = self.used(backend)
            if used <= capacity * self.params.pause_threshold:
                continue
            target = capacity * min(self.params.pause_target, self.params.pause_threshold)
            programs = self._on(backend)
            for q in sorted((q for q in programs if q.phase is Phase.ACTING), key=self._pause_key(now)):
                if used <= target:
                    break
                if q.marked:
                    continue
                decisions.append(self._pause(q, now))
                # what the pause frees: the program's tokens, but not blocks others still hold
                used = self.used(backend) if self.params.shared_prefix else used - self._weighted(q) - self.params.buffer_per_program
            if used > target:
                # Marking frees nothing now, so this marks every REASONING program on the
                # backend, smallest first, as upstream does.
                for q in sorted((q for q in programs if q.phase is Phase.REASONING), key=lambda q: q.tokens):
                    q.marked = True
        return decisions

    def _pause_key(self, now: float) -> Callable[[ProgramState], tuple[float, int]]:
        """The order ACTING programs are paused in: smallest first, or by the idle time the
        pause is expected to save (then smallest first among equals)."""
        order = self.params.pause_order
        if self.params.group_order:
            return lambda q: (-q.group_rank, q.tokens)
        if order == "longest_idle":
            return lambda q: (-(now - q.acting_since), q.tokens)
        if order == "longest_tool":
            return lambda q: (-(q.tool_s / q.tools) if q.tools else 0.0, q.tokens)
        return lambda q: (0.0, q.tokens)

    # --- transitions -----------------------------------------------------------------------

    def _enqueue(self, q: ProgramState, now: float, origin: str | None) -> None:
        q.paused = True
        q.origin = origin
        self._settle(q, None)
        q.paused_tokens = q.tokens
        q.queued_at = now
        self.queue[q.id] = q

    def _pause(self, q: ProgramState, now: float) -> Pause:
        self._enqueue(q, now, origin=q.backend)
        return Pause(q.id)

    def _resume(self, q: ProgramState, backend: str, now: float, forced: bool = False) -> Resume:
        del self.queue[q.id]
        q.paused = False
        self._settle(q, backend)
        q.origin = None
        q.held_since = None
        return Resume(q.id, backend, forced=forced)
