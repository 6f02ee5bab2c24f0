"""ThunderAgent scheduler: pause order, marking, resume groups and placement, decay, forced
resume, Dynamo's hysteresis bands and idle TTL, the switchable upstream fixes, and upstream's
characters-per-token estimate."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from conftest import TINY
from pydantic import ValidationError

from tasim.config.scenario import load_scenario
from tasim.config.workers import cluster_view
from tasim.core import events as ev
from tasim.core.cluster_view import ClusterView, WorkerInfo
from tasim.core.model import RequestSpec
from tasim.policies import Hold, Pause, Resume, Route, TurnEnd, make_policy
from tasim.policies.chars_per_token import LearnedCharsPerToken
from tasim.policies.interface import ProgramDecision
from tasim.policies.thunderagent import Phase, ProgramState, ThunderAgent, ThunderAgentParams
from tasim.sim.runner import Simulation

CAPACITY = 1600  # 100 blocks of 16 tokens


def _ta(workers: int = 1, kv_blocks: int = 100, **params) -> ThunderAgent:
    view = ClusterView(tuple(WorkerInfo(f"w{i}", 16, kv_blocks, 256, 8192) for i in range(workers)))
    policy = make_policy("thunderagent", params, view, np.random.default_rng(0))
    assert isinstance(policy, ThunderAgent)
    return policy


_turns: dict[str, int] = {}


def req(ta: ThunderAgent, program: str, prompt: int, now: float):
    turn = _turns[program] = _turns.get(program, -1) + 1
    spec = RequestSpec(f"{program}.{turn}", program, turn, prompt, 10, 0, tuple(range(prompt // 16)))
    return ta.on_request(spec, now)


def end(ta: ThunderAgent, program: str, prompt: int, output: int, now: float, ok: bool = True):
    return list(ta.on_turn_end(TurnEnd(program, f"{program}.x", "w0", prompt, output, 0, ok), now))


@pytest.fixture(autouse=True)
def _fresh_turns() -> None:
    _turns.clear()


def test_variant_defaults_and_validation() -> None:
    up = ThunderAgentParams()
    dyn = ThunderAgentParams(variant="dynamo")
    assert (up.pause_threshold, up.pause_target, up.resume_hysteresis, up.idle_ttl_s) == (1.0, 1.0, 0.0, None)
    assert (dyn.pause_threshold, dyn.pause_target, dyn.resume_hysteresis, dyn.idle_ttl_s) == (0.95, 0.80, 0.10, None)
    assert dyn.acting_decay_tau_s == 1.0 and dyn.soft_demote_threshold == 0.80
    assert ThunderAgentParams(variant="dynamo", pause_target=0.7).pause_target == 0.7  # explicit wins
    with pytest.raises(ValidationError):
        ThunderAgentParams(pause_threshold=0.8, pause_target=0.9)


def test_new_programs_go_to_fewest_tokens_then_stick() -> None:
    ta = _ta(workers=2)
    assert req(ta, "a", 500, 0.0) == Route("w0")
    assert req(ta, "b", 200, 0.0) == Route("w1")
    assert req(ta, "c", 200, 0.0) == Route("w1")  # w1 has 200 tokens < w0's 500
    end(ta, "a", 500, 10, 1.0)
    assert req(ta, "a", 900, 2.0) == Route("w0")  # sticky, no capacity check


def test_pause_smallest_acting_first_until_it_fits() -> None:
    ta = _ta()
    for program, prompt in (("A", 100), ("B", 100), ("C", 100), ("D", 150), ("E", 250)):
        assert req(ta, program, prompt, 0.0) == Route("w0")
    end(ta, "A", 100, 300, 1.0)  # ACTING 400
    end(ta, "B", 100, 200, 1.0)  # ACTING 300
    end(ta, "C", 100, 500, 1.0)  # ACTING 600
    # use = 400 + 300 + 600 + 150 + 250 + 5 x 100 = 2200 > 1600: pause B (-400 -> 1800), then A (-500 -> 1300)
    assert ta.used("w0") == 2200
    assert list(ta.on_tick(5.0)) == [Pause("B"), Pause("A")]
    assert ta.used("w0") == 1300
    assert not any(q.marked for q in ta.programs.values())
    assert req(ta, "B", 350, 6.0) == Hold()  # a paused program's next request waits


def test_pause_order_longest_idle_and_longest_tool() -> None:
    """The same backend as above (2,200 of 1,600 used): longest_idle pauses the program whose
    tool has run longest so far; longest_tool the one whose past tools averaged longest."""
    for order, expected in (("longest_idle", [Pause("C")]), ("longest_tool", [Pause("A"), Pause("B")])):
        _turns.clear()
        ta = _ta(pause_order=order)
        for program, prompt in (("A", 100), ("B", 100), ("C", 100), ("D", 150), ("E", 250)):
            assert req(ta, program, prompt, 0.0) == Route("w0")
        end(ta, "A", 100, 100, 0.5)
        end(ta, "B", 100, 100, 0.5)
        req(ta, "A", 200, 4.5)  # A's tool took 4 s
        req(ta, "B", 200, 1.5)  # B's 1 s
        end(ta, "A", 200, 200, 4.6)  # ACTING 400, idle since 4.6
        end(ta, "B", 200, 100, 1.6)  # ACTING 300, idle since 1.6
        end(ta, "C", 100, 500, 1.0)  # ACTING 600, idle since 1.0, no tool history yet
        assert ta.used("w0") == 2200
        # longest_idle: C (idle 4 s) frees 700 -> 1500; longest_tool: A (4 s), then B (1 s)
        assert list(ta.on_tick(5.0)) == expected


def test_marking_every_reasoning_program_and_pause_at_turn_end() -> None:
    ta = _ta()
    for program in ("A", "B", "C"):
        req(ta, program, 100, 0.0)
    end(ta, "A", 100, 100, 1.0)
    end(ta, "B", 100, 100, 1.0)
    end(ta, "C", 100, 50, 1.0)  # ACTING 150
    req(ta, "A", 900, 2.0)  # REASONING 900 (sticky)
    req(ta, "B", 800, 2.0)  # REASONING 800
    # use = 900 + 800 + 150 + 300 = 2150: pause C (-250 -> 1900), still over: mark B and A
    assert list(ta.on_tick(5.0)) == [Pause("C")]
    assert ta.programs["A"].marked and ta.programs["B"].marked
    assert end(ta, "A", 900, 100, 6.0) == [Pause("A")]  # paused as its turn ends
    assert ta.programs["A"].paused and ta.programs["A"].paused_tokens == 1000
    assert ta.programs["B"].marked and not ta.programs["B"].paused


def _two_paused_and_a_new_one(**params) -> ThunderAgent:
    ta = _ta(workers=2, **params)
    for program in ("P1", "P2", "P3", "P4"):
        req(ta, program, 200, 0.0)  # P1, P3 -> w0; P2, P4 -> w1
    assert {p: q.backend for p, q in ta.programs.items()} == {"P1": "w0", "P2": "w1", "P3": "w0", "P4": "w1"}
    end(ta, "P1", 200, 1300, 1.0)  # ACTING 1500: w0 use 1900
    end(ta, "P2", 200, 1200, 1.0)  # ACTING 1400: w1 use 1800
    assert list(ta.on_tick(5.0)) == [Pause("P1"), Pause("P2")]
    assert req(ta, "N1", 500, 6.0) == Hold(pause=True)  # queue not empty: new programs wait (G2)
    assert req(ta, "P1", 1500, 7.0) == Hold()  # P1's next request waits: G1, size 1500
    return ta


def test_resume_groups_selection_and_skip() -> None:
    ta = _two_paused_and_a_new_one()
    # rooms: 1600 - 400 = 1200 on each backend, total 2400. Order G1 P1 (1500), G2 N1 (500),
    # G3 P2 (1400). Select P1 (1600), N1 (cum 2200); P2 (1500) no longer fits the total.
    # Place largest first: P1 needs 1600 > largest room 1200 -> skipped; N1 -> most room (w0).
    assert list(ta.on_tick(10.0)) == [Resume("N1", "w0")]
    # P3 and P4 end: rooms 1600 - 600 = 1000 (w0: N1) and 1600 (w1), total 2600.
    ta.on_program_end("P3", 11.0)
    ta.on_program_end("P4", 11.0)
    assert list(ta.on_tick(15.0)) == [Resume("P1", "w1")]  # P1 (1600) fits only on w1
    assert ta.programs["P2"].paused


def _paused(ta: ThunderAgent, program: str, tokens: int, steps: int = 2, phase: Phase = Phase.ACTING) -> None:
    q = ProgramState(program, tokens=tokens, phase=phase, steps=steps)
    ta.programs[program] = q
    ta._enqueue(q, 0.0, origin=None)


def _resident(ta: ThunderAgent, program: str, backend: str, tokens: int, since: float = 0.0) -> None:
    q = ta.programs[program] = ProgramState(program, tokens=tokens, phase=Phase.ACTING, steps=2, acting_since=since)
    ta._settle(q, backend)  # through the policy, which keeps each backend's totals


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        # rooms w0 4000 - 1100 = 2900, w1 4000; selected Y (900), X (1300), Z (2600), placed largest first
        ("most_room", [Resume("Z", "w1"), Resume("X", "w0"), Resume("Y", "w0")]),
        ("best_fit", [Resume("Z", "w0"), Resume("X", "w1"), Resume("Y", "w1")]),
    ],
)
def test_resume_places_largest_first(placement: str, expected: list[Resume]) -> None:
    ta = _ta(workers=2, kv_blocks=250, placement=placement)  # 4000 tokens per backend
    _resident(ta, "R", "w0", 1000)
    for program, tokens in (("X", 1200), ("Y", 800), ("Z", 2500)):
        _paused(ta, program, tokens)
    assert list(ta.on_tick(5.0)) == expected


def test_upstream_orders_by_paused_size_but_fits_the_current_size() -> None:
    # Upstream sorts the queue by PausedInfo.total_tokens (the size at the pause) but selects
    # and places by Program.total_tokens, which a held request has already raised to its new
    # prompt. Sizing by the paused figure would over-fill the backend the same tick.
    ta = _ta()
    _resident(ta, "R", "w0", 500)  # use 600: room 1000
    _paused(ta, "A", 300)
    _paused(ta, "B", 500)
    assert req(ta, "A", 900, 1.0) == Hold()  # G1: paused at 300, now 900
    assert req(ta, "B", 500, 1.0) == Hold()  # G1: 500 then and now
    # Order A (300) before B (500). Select A (900 + 100 = 1000, cum 1000); B (600) no longer
    # fits the room. Sized by the paused figures (400 + 600 = 1000) both would resume, use would
    # reach 2200 and the same tick's pause pass would have to pause R.
    assert list(ta.on_tick(5.0)) == [Resume("A", "w0")]
    assert ta.used("w0") == 1600 and ta.programs["B"].paused


def test_decay_makes_resume_optimistic_then_pause_evicts() -> None:
    plain = _ta()
    _resident(plain, "R", "w0", 1000, since=1.0)
    _paused(plain, "Q", 1000)
    assert list(plain.on_tick(5.0)) == []  # room 1600 - 1100 = 500 < 1100
    decayed = _ta(acting_decay_tau_s=1.0)
    _resident(decayed, "R", "w0", 1000, since=1.0)
    _paused(decayed, "Q", 1000)
    # resume side: R counts 1000 * 2^-4 = 62.5, room 1437.5 >= 1100 -> Q resumes; the pause side
    # (undecayed, 2200 > 1600) then pauses the smallest ACTING program, R (tie, first placed).
    assert decayed.used("w0", now=5.0) == 162.5
    assert list(decayed.on_tick(5.0)) == [Resume("Q", "w0"), Pause("R")]


def test_forced_resume_after_timeout_upstream() -> None:
    ta = _ta(workers=2)
    assert req(ta, "A", 1300, 0.0) == Route("w0")
    assert req(ta, "B", 1400, 0.0) == Route("w1")
    assert req(ta, "C", 100, 0.0) == Route("w0")  # 1300 tokens < 1400, room 200 >= 200
    assert req(ta, "N", 500, 0.0) == Hold(pause=True)  # no room anywhere
    for t in range(5, 1800, 5):
        assert list(ta.on_tick(float(t))) == []
    # 1,800 s after the request was held: new programs go to the backend with fewest programs
    assert list(ta.on_tick(1800.0)) == [Resume("N", "w1", forced=True)]


def test_forced_resume_of_a_placed_program_returns_to_origin() -> None:
    ta = _ta(workers=2)
    req(ta, "A", 200, 0.0)  # w0
    req(ta, "B", 1400, 0.0)  # w1
    end(ta, "A", 200, 1400, 1.0)  # 1600 ACTING: w0 use 1700
    assert list(ta.on_tick(5.0)) == [Pause("A")]
    assert req(ta, "A", 1700, 10.0) == Hold()
    req(ta, "C", 1450, 11.0)  # queue not empty: C waits too (G2)
    assert list(ta.on_tick(15.0)) == [Resume("C", "w0")]  # A (1700) fits nowhere, C does
    assert list(ta.on_tick(1810.0)) == [Resume("A", "w0", forced=True)]  # origin, no capacity check


def _never_released_pair_and_held(*held: str) -> ThunderAgent:
    """A and B (600 tokens each) fill the backend to 1,400 and finish without a release (ACTING
    610, use 1,420); the programs ``held`` arrive with 600 tokens and queue at t = 0."""
    ta = _ta()
    assert req(ta, "A", 600, 0.0) == Route("w0")
    assert req(ta, "B", 600, 0.0) == Route("w0")
    for program in held:
        assert req(ta, program, 600, 0.0) == Hold(pause=True)  # room 200 < 700, then a queue
    assert end(ta, "A", 600, 10, 1.0) == []
    assert end(ta, "B", 600, 10, 1.0) == []
    for t in range(5, 1800, 5):
        assert list(ta.on_tick(float(t))) == []  # room 180: nothing fits
    return ta


def test_forced_programs_that_do_not_fit_wait_out_a_second_timeout() -> None:
    """Upstream's double wait: the forced set does not fit even once every never-released program
    is paused, so each forced program is marked and paused at its turn end, and the one whose
    next request finds no room waits a fresh 1,800 s (router.py _wait_for_resume, timer per held
    request) and is forced again."""
    ta = _never_released_pair_and_held("C", "D", "E")
    # use 1,420 + 3 x 700 = 3,520: pausing A and B (smallest ACTING first) leaves 2,100 > 1,600,
    # so C, D and E are marked
    assert list(ta.on_tick(1800.0)) == [
        Resume("C", "w0", forced=True),
        Resume("D", "w0", forced=True),
        Resume("E", "w0", forced=True),
        Pause("A"),
        Pause("B"),
    ]
    assert [q.marked for q in (ta.programs["C"], ta.programs["D"], ta.programs["E"])] == [True] * 3
    assert end(ta, "C", 600, 20, 1801.0) == [Pause("C")]
    assert req(ta, "C", 645, 1801.3) == Hold()
    assert end(ta, "D", 600, 30, 1802.0) == [Pause("D")]
    assert req(ta, "D", 655, 1802.3) == Hold()
    assert end(ta, "E", 600, 40, 1803.0) == [Pause("E")]
    assert req(ta, "E", 665, 1803.3) == Hold()
    assert ta.programs["E"].held_since == 1803.3  # the second wait starts at the held request
    # G1 by paused size (C 620, D 630, E 640): 745 + 755 = 1,500 fit, E (765) and the paused A
    # and B (G2 by step count, 710 each) do not; placed largest first
    assert list(ta.on_tick(1805.0)) == [Resume("D", "w0"), Resume("C", "w0")]
    assert end(ta, "C", 645, 5, 1806.0) == []
    assert end(ta, "D", 655, 5, 1806.0) == []
    assert ta.used("w0") == 1510  # room 90: nothing is resumed until E's second timeout
    for t in range(1810, 3605, 5):
        assert list(ta.on_tick(float(t))) == []
    # 3,605 is the first tick at or after 1,803.3 + 1,800: E forced again, to its origin; use
    # 2,275, and pausing C (the smallest ACTING) brings it to 1,525
    assert list(ta.on_tick(3605.0)) == [Resume("E", "w0", forced=True), Pause("C")]
    assert not ta.programs["E"].marked


def test_forced_programs_that_fit_wait_once() -> None:
    """The boundary: once the never-released programs are paused the forced set fits, nothing is
    marked, and a forced program's next turn goes through unchecked."""
    ta = _never_released_pair_and_held("C", "D")
    # use 1,420 + 2 x 700 = 2,820: pausing A and B leaves 1,400 <= 1,600
    assert list(ta.on_tick(1800.0)) == [
        Resume("C", "w0", forced=True),
        Resume("D", "w0", forced=True),
        Pause("A"),
        Pause("B"),
    ]
    assert not ta.programs["C"].marked and not ta.programs["D"].marked
    assert end(ta, "C", 600, 20, 1801.0) == []
    assert req(ta, "C", 645, 1801.3) == Route("w0")
    assert ta.programs["C"].held_since is None


def test_dynamo_hysteresis_bands() -> None:
    for variant, first_tick in (("upstream", [Pause("C")]), ("dynamo", [Pause("C"), Pause("B")])):
        _turns.clear()
        ta = _ta(variant=variant)
        for program in ("A", "B", "C"):
            req(ta, program, 100, 0.0)
        end(ta, "A", 100, 500, 1.0)  # 600
        end(ta, "B", 100, 400, 1.0)  # 500
        end(ta, "C", 100, 200, 1.0)  # 300: use 1700
        # upstream pauses while use > 1600: C (-400 -> 1300). Dynamo pauses above 0.95 x 1600 =
        # 1520 and drains to 0.80 x 1600 = 1280: C (-> 1300), then B (-> 700).
        assert list(ta.on_tick(5.0)) == first_tick, variant
    # Dynamo resumes only below 0.85: room = 1360 - 700 = 660 takes C (400), not B (600) too.
    assert list(ta.on_tick(10.0)) == [Resume("C", "w0")]
    assert list(ta.on_tick(15.0)) == []  # room 1360 - 1100 = 260 < 600


def test_dynamo_soft_demotion_band() -> None:
    ta = _ta(variant="dynamo")
    req(ta, "A", 1200, 0.0)  # use 1300 = 0.8125 of capacity: inside [0.80, 0.95)
    ta.on_tick(5.0)
    assert ta.is_soft_demoted("A", 12.0) and not ta.is_soft_demoted("A", 12.5)  # until 5 + 1.5 x 5
    upstream = _ta()
    req(upstream, "A", 1200, 0.0)
    upstream.on_tick(5.0)
    assert not upstream.is_soft_demoted("A", 6.0)


def test_idle_ttl_releases_acting_programs() -> None:
    ta = _ta(variant="dynamo", idle_ttl_s=600)  # tasim's opt-in: Dynamo 1.6.1 has no idle expiry
    req(ta, "A", 100, 0.0)
    end(ta, "A", 100, 100, 1.0)
    ta.on_tick(600.0)
    assert "A" in ta.programs  # idle 599 s
    ta.on_tick(605.0)
    assert "A" not in ta.programs and ta.used("w0") == 0
    assert req(ta, "A", 400, 606.0) == Route("w0")  # comes back as a new program


def test_failed_turn_fix() -> None:
    for fix, phase in ((False, Phase.REASONING), (True, Phase.ACTING)):
        ta = _ta(fix_failed_turn=fix)
        req(ta, "A", 100, 0.0)
        end(ta, "A", 100, 0, 1.0, ok=False)
        assert ta.programs["A"].phase is phase


@pytest.mark.parametrize(
    ("order", "aging", "expected"),
    [("smallest_first", 1000.0, "N2"), ("fifo", 1000.0, "N1"), ("aged", 1000.0, "N1"), ("aged", 10.0, "N2")],
)
def test_admission_order_of_new_programs(order: str, aging: float, expected: str) -> None:
    ta = _ta(admission_order=order, aging_tokens_per_s=aging)
    assert req(ta, "A", 500, 0.0) == Route("w0")
    assert req(ta, "N0", 1100, 0.0) == Hold(pause=True)  # needs 1200 > 1000
    assert req(ta, "N1", 800, 1.0) == Hold(pause=True)  # queued behind N0
    assert req(ta, "N2", 300, 2.0) == Hold(pause=True)
    # room 1000: smallest first takes N2 (400) and then N1 (900) no longer fits; FIFO takes N1
    # (900) after skipping N0 (1200). Aging by 1000 tokens/s makes the oldest the "smallest".
    assert list(ta.on_tick(5.0)) == [Resume(expected, "w0")]


def test_resume_on_origin_when_blocks_survive() -> None:
    blocks = tuple(range(100, 120))
    rooms = {"w0": 800.0, "w1": 1500.0}
    q = ProgramState("P", tokens=320, origin="w0", blocks=blocks)
    assert _ta(workers=2)._placement(q, ["w0", "w1"], rooms) == "w1"  # upstream: most room
    ta = _ta(workers=2, resume_on_origin=True)
    assert ta.wants_kv_events
    ta.on_kv_stored("w0", blocks[:12], 0.0)
    assert ta._placement(q, ["w0", "w1"], rooms) == "w0"  # 12 of 20 blocks >= 50 % survive
    ta.on_kv_removed("w0", blocks[:4], 1.0)
    assert ta._placement(q, ["w0", "w1"], rooms) == "w1"  # 8 of 20 < 50 %


def _ta_offloading(offload_tokens: int, **params) -> ThunderAgent:
    view = ClusterView((WorkerInfo("w0", 16, 100, 256, 8192, offload_tokens),))
    policy = make_policy("thunderagent", params, view, np.random.default_rng(0))
    assert isinstance(policy, ThunderAgent)
    return policy


def test_published_host_capacity_adds_to_capacity_by_host_credit() -> None:
    """GPU pool 1600 tokens. full: + everything published (Dynamo 1.6.1); capped: + at most the GPU
    pool (closed Dynamo PR #14389); none: the GPU alone (upstream ThunderAgent)."""
    assert _ta_offloading(400, variant="dynamo").capacity == {"w0": 2000}
    assert _ta_offloading(4000, variant="dynamo").capacity == {"w0": 5600}
    assert _ta_offloading(4000, variant="dynamo", host_credit="capped").capacity == {"w0": 3200}
    assert _ta_offloading(400, variant="dynamo", host_credit="capped").capacity == {"w0": 2000}
    assert _ta_offloading(4000, variant="dynamo", host_credit="none").capacity == {"w0": 1600}
    assert _ta_offloading(4000).capacity == {"w0": 1600}  # upstream has no host credit
    assert _ta_offloading(4000, host_credit="full").capacity == {"w0": 5600}
    assert _ta(variant="dynamo").capacity == {"w0": CAPACITY}  # nothing published: the GPU pool
    with pytest.raises(ValidationError):
        ThunderAgentParams.model_validate({"host_kv_tokens": 400})  # a worker's capacity is not a parameter


def test_program_end_releases_everything() -> None:
    ta = _ta()
    req(ta, "A", 1400, 0.0)
    assert req(ta, "B", 500, 0.0) == Hold(pause=True)
    ta.on_program_end("B", 1.0)
    ta.on_program_end("A", 1.0)
    assert ta.programs == {} and ta.queue == {} and ta.used("w0") == 0


def test_payload_estimate_admits_what_exact_counts_queue() -> None:
    ta = _ta(payload_chars_per_token=4.23)
    assert req(ta, "A", 500, 0.0) == Route("w0")  # 2,115 characters: int(2115 / 5.0) = 423 booked
    assert ta.programs["A"].tokens == 423 and ta.used("w0") == 523
    # B: 1,000 tokens = 4,230 characters, 846 booked; it needs 946 of the 1,077 left.
    assert req(ta, "B", 1000, 0.0) == Route("w0")
    assert ta.programs["B"].tokens == 846
    exact = _ta()
    assert req(exact, "A", 500, 0.0) == Route("w0")
    assert req(exact, "B", 1000, 0.0) == Hold(pause=True)  # needs 1,100 of the 1,000 left


def test_payload_estimate_learns_the_ratio_from_each_reply() -> None:
    ta = _ta(payload_chars_per_token=4.23)
    req(ta, "A", 500, 0.0)  # 423
    req(ta, "B", 1000, 0.0)  # 846: 1,469 used
    assert req(ta, "C", 1000, 0.0) == Hold(pause=True)  # 846 + 100 > 131 left
    end(ta, "A", 500, 20, 1.0)
    assert ta._chars_per_token.ratio == 2115 / 500  # the first sample replaces 5.0
    assert ta.programs["A"].tokens == 520  # prompt + output from usage
    assert ta.programs["C"].tokens == 846  # a queued request keeps the size it was booked at
    end(ta, "B", 900, 10, 2.0)  # the engine reports 900 prompt tokens for 4,230 characters: 4.7
    assert ta._chars_per_token.ratio == pytest.approx(0.2 * 4.7 + 0.8 * 4.23, abs=1e-12)  # 4.324
    assert ta.programs["B"].tokens == 910
    req(ta, "A", 600, 3.0)  # 2,538 characters: int(2538 / 4.324) = 586
    assert ta.programs["A"].tokens == 586


def test_payload_estimate_learns_nothing_from_a_failed_turn() -> None:
    ta = _ta(payload_chars_per_token=4.23, fix_failed_turn=True)
    req(ta, "A", 500, 0.0)
    end(ta, "A", 0, 0, 1.0, ok=False)  # no usage
    assert ta._chars_per_token.ratio == 5.0
    assert ta.programs["A"].tokens == 423 and ta.programs["A"].phase is Phase.ACTING
    req(ta, "B", 1000, 2.0)
    assert ta.programs["B"].tokens == 846


def test_learned_chars_per_token_ignores_empty_samples() -> None:
    ratio = LearnedCharsPerToken()
    ratio.learn(0, 100)
    ratio.learn(400, 0)
    assert ratio.ratio == 5.0 and ratio.tokens(4999) == 999
    ratio.learn(400, 100)
    ratio.learn(300, 100)
    assert ratio.ratio == pytest.approx(0.2 * 3.0 + 0.8 * 4.0, abs=1e-12)  # 3.8


def test_payload_estimate_is_upstream_only() -> None:
    assert ThunderAgentParams(payload_chars_per_token=4.23).payload_chars_per_token == 4.23
    assert ThunderAgentParams(variant="dynamo").payload_chars_per_token is None
    with pytest.raises(ValidationError, match="payload_chars_per_token is for variant upstream only"):
        ThunderAgentParams(variant="dynamo", payload_chars_per_token=4.23)
    for bad in (0, 101):
        with pytest.raises(ValidationError):
            ThunderAgentParams(payload_chars_per_token=bad)


def _shared_req(ta: ThunderAgent, program: str, shared_blocks: int, own_blocks: int, now: float, base: int):
    """A call whose prompt is ``shared_blocks`` blocks every program has (a GRPO group's task
    prompt) and then ``own_blocks`` of its own."""
    turn = _turns[program] = _turns.get(program, -1) + 1
    hashes = tuple(range(shared_blocks)) + tuple(range(base, base + own_blocks))
    return ta.on_request(RequestSpec(f"{program}.{turn}", program, turn, 16 * len(hashes), 10, 0, hashes), now)


def test_shared_prefix_counts_a_block_several_programs_hold_once() -> None:
    """Three programs of one 3,008-token backend share a 640-token prompt and end their turns
    at 1,000 tokens: upstream counts the prompt three times (3 x 1,000 + 300 = 3,300: pause the
    smallest ACTING one), the fix once (3,300 - 2 x 640 = 2,020: no pause)."""
    for fixed, expected_used in ((False, 3300.0), (True, 2020.0)):
        _turns.clear()
        ta = _ta(workers=1, kv_blocks=188, shared_prefix=fixed)
        for i, program in enumerate("abc"):
            assert _shared_req(ta, program, 40, 10, 0.0, 1000 * (i + 1)) == Route("w0")
        for program in "abc":
            end(ta, program, 800, 200, 1.0)
        assert ta.used("w0") == expected_used
        assert ta.shared_tokens["w0"] == (1280 if fixed else 0)
        paused = [d for d in ta.on_tick(5.0) if isinstance(d, Pause)]
        assert paused == ([] if fixed else [Pause("a")])


def test_shared_prefix_admits_a_program_by_what_it_adds() -> None:
    """On a 1,600-token backend holding a (800 tokens + 100 buffer), b with the same 640-token
    prompt needs 900 tokens upstream (held) but only 160 + 100 with the fix (admitted)."""
    for fixed, decision in ((False, Hold(pause=True)), (True, Route("w0"))):
        _turns.clear()
        ta = _ta(workers=1, shared_prefix=fixed)
        assert _shared_req(ta, "a", 40, 10, 0.0, 1000) == Route("w0")
        assert _shared_req(ta, "b", 40, 10, 0.0, 2000) == decision


def test_shared_prefix_follows_programs_through_pause_resume_and_end() -> None:
    ta = _ta(workers=2, kv_blocks=200, shared_prefix=True)  # 3,200 tokens a backend
    for i, program in enumerate("abc"):
        _shared_req(ta, program, 40, 10, 0.0, 1000 * (i + 1))
    # a -> w0, b -> w1 (fewest tokens), c -> w0 (w0 800 - 0 shared vs w1 800: tie, first)
    assert {p: q.backend for p, q in ta.programs.items()} == {"a": "w0", "b": "w1", "c": "w0"}
    assert ta.shared_tokens == {"w0": 640, "w1": 0}
    assert ta.used("w0") == 800 + 800 + 200 - 640
    ta.on_program_end("a", 1.0)
    assert ta.shared_tokens == {"w0": 0, "w1": 0} and ta._holders["w0"] == {b: 1 for b in (*range(40), *range(3000, 3010))}
    _shared_req(ta, "c", 45, 10, 2.0, 3000)  # c's next call: a longer shared part, same backend
    _shared_req(ta, "d", 45, 0, 2.0, 0)
    assert ta.programs["d"].backend == "w1" and ta.shared_tokens == {"w0": 0, "w1": 640}
    ta.on_worker_lost("w1", 3.0)
    assert ta.shared_tokens["w1"] == 0 and ta._holders["w1"] == {}


def test_a_variant_of_the_wrong_type_is_a_validation_error() -> None:
    """Not a TypeError from looking an unhashable value up among the variants' defaults."""
    with pytest.raises(ValidationError, match="variant"):
        ThunderAgentParams.model_validate({"variant": []})


def _bit_for_bit(value: float) -> tuple[type, str]:
    """A number as the scan's must match it: its type (an int where the scan adds ints only)
    and its shortest round-tripping text (which tells every float apart, -0.0 from 0.0)."""
    return type(value), repr(value)


class _ScanChecked(ThunderAgent):
    """ThunderAgent comparing its running per-backend totals with a scan of every program at
    each read of them and after each event it hears."""

    reads = 0
    max_shared = 0

    def used(self, backend: str, now: float | None = None) -> float:
        value = super().used(backend, now)
        assert _bit_for_bit(value) == _bit_for_bit(self.used_by_scan(backend, now)), (backend, now)
        self.reads += 1
        return value

    def _active_tokens(self, backend: str) -> float:
        value = super()._active_tokens(backend)
        assert _bit_for_bit(value) == _bit_for_bit(self._scanned_tokens(self._on(backend), None)), backend
        return value

    def _check_every_backend(self) -> None:
        self.max_shared = max(self.max_shared, *self.shared_tokens.values())
        for backend, load in self._loads.items():
            self.used(backend)
            self._active_tokens(backend)
            assert load.programs == len(self._on(backend)), backend

    def on_request(self, request: RequestSpec, now: float) -> Route | Hold:
        decision = super().on_request(request, now)
        self._check_every_backend()
        return decision

    def on_turn_end(self, turn: TurnEnd, now: float) -> Sequence[ProgramDecision]:
        decisions = super().on_turn_end(turn, now)
        self._check_every_backend()
        return decisions

    def on_program_end(self, program: str, now: float) -> Sequence[ProgramDecision]:
        decisions = super().on_program_end(program, now)
        self._check_every_backend()
        return decisions

    def on_tick(self, now: float) -> Sequence[ProgramDecision]:
        decisions = super().on_tick(now)
        self._check_every_backend()
        return decisions


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"shared_prefix": True, "resume_timeout_s": 10.0},  # forced resumes to the fewest programs
        {"acting_token_weight": 0.5, "shared_prefix": True},  # a weight every sum holds exactly
        {"acting_token_weight": 0.3},  # one that rounds: the scan
        {"acting_decay_tau_s": 2.0},  # upstream's decayed resume side: the scan
        {"payload_chars_per_token": 4.0},
        {"variant": "dynamo", "shared_prefix": True, "resume_timeout_s": 10.0},  # soft demotion, decayed forced resumes
    ],
    ids=repr,
)
def test_running_totals_match_a_scan_of_every_program(params: dict[str, object]) -> None:
    """Twelve programs at a time on two 4,800-token backends: pauses, held requests, resumes
    (forced ones too), ends and shared blocks all happen, and at every read of a backend's use
    the running totals give what summing its programs afresh gives, to the bit."""
    scenario = load_scenario(TINY, ["cluster.engine.kv_blocks=300", "workload.concurrency=12", "duration_s=120"])
    policy = _ScanChecked(cluster_view(scenario), ThunderAgentParams.model_validate(params), np.random.default_rng(0))
    events: list[ev.Event] = []
    Simulation(scenario, events.append, policy=policy).run()
    paused = sum(isinstance(e, ev.ProgramPaused) for e in events)
    resumed = [e.forced for e in events if isinstance(e, ev.ProgramResumed)]
    finished = sum(isinstance(e, ev.ProgramFinished) for e in events)
    assert paused >= 40 and len(resumed) >= 30 and finished >= 20 and policy.reads >= 600, (paused, resumed, finished, policy.reads)
    assert any(resumed) == ("resume_timeout_s" in params)  # forced resumes
    assert (policy.max_shared > 0) == ("shared_prefix" in params)  # blocks counted once
