"""Clients that never release (``workload.release``): the schema, what the simulator logs, what
each policy then does with a finished but unreleased program, and the live clients' finals.

The simulated cases run two programs one after the other (closed loop, concurrency 1) on one
worker of 80 blocks x 16 tokens = 1,280 tokens. Each program prompts 600 tokens, then 650, with
20 output tokens per turn, so a finished program's context is 670 tokens; ThunderAgent books it
as 670 + 100 (buffer) and the second program's first call needs 600 + 100 of the 1,280 - 770 =
510 left: it is held until something frees the first program's tokens. Scheduler ticks fall on
whole seconds (interval 1 s), so each expected time is the first tick at or after a deadline.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest
from conftest import TINY, assert_usage_error, tasim

from tasim.config.scenario import Scenario, ScenarioError, parse_scenario
from tasim.core import events as ev
from tasim.sim.checks import EventChecks, InvariantViolation
from tasim.sim.runner import Simulation

FINISHED_CONTEXT = 670
ROOM_NEEDED_BY_P1 = 600 + 100
POOL = 80 * 16


def _scenario(release: Any, policy: str = "thunderagent", programs: int = 2, **params: Any) -> Scenario:
    base = {"scheduler_interval_s": 1.0, "resume_timeout_s": 20.0} if policy == "thunderagent" else {}
    return Scenario.model_validate(
        {
            "duration_s": 200,
            "cluster": {"backends": 1, "engine": {"kv_blocks": 80}, "perf": {"model": "dynamo_polynomial"}},
            "workload": {
                "concurrency": 1,
                "programs": programs,
                "turns": 2,
                "task_prompt_tokens": 600,
                "output_tokens": 20,
                "observation_tokens": 30,
                "tool_latency_s": 0.5,
                "release": release,
            },
            "policy": {"name": policy, "params": {**base, **params}},
        }
    )


def _run(scenario: Scenario) -> list[ev.Event]:
    log: list[ev.Event] = []
    Simulation(scenario, log.append, check=True).run()
    return log


def _one(log: list[ev.Event], kind: type[ev.Event], **fields: Any) -> Any:
    found = [e for e in log if isinstance(e, kind) and all(getattr(e, k) == v for k, v in fields.items())]
    assert len(found) == 1, found
    return found[0]


def _first_finish(log: list[ev.Event]) -> float:
    """When p0's last call ended (its ProgramFinished), checking it is the 670-token program."""
    finished = _one(log, ev.ProgramFinished, program="p0")
    assert finished.context_tokens == FINISHED_CONTEXT and finished.completed
    return finished.t


# --- the switch --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "message"),
    [
        ("sometimes", "workload.release.kind: Input should be 'at_end', 'never' or 'after' (got 'sometimes')"),
        ("after", "workload.release: delay_s is required when kind is 'after'"),
        ({"kind": "never", "delay_s": 5}, "workload.release: delay_s is only for kind 'after' (kind is 'never')"),
        ({"kind": "after", "delay_s": 0}, "workload.release.delay_s: Input should be greater than 0 (got 0)"),
        ({"kind": "after", "delay": 5}, "workload.release.delay: unknown key (allowed: kind, delay_s)"),
        (5, "workload.release: expected at_end, never or a mapping such as {kind: after, delay_s: 30} (got 5)"),
    ],
)
def test_bad_release_values_are_one_line_errors(release: Any, message: str) -> None:
    with pytest.raises(ScenarioError) as error:
        parse_scenario({"workload": {"release": release}}, "s.yaml")
    assert str(error.value) == f"s.yaml: {message}"


def test_release_is_read_by_agent_and_rollout_workloads_only() -> None:
    def after_last_call(workload: dict[str, Any]) -> float | None:
        return parse_scenario({"workload": workload}, "s.yaml").workload.release.after_last_call_s

    assert after_last_call({}) == 0.0
    assert after_last_call({"release": "never"}) is None
    assert after_last_call({"release": {"kind": "after", "delay_s": 30}}) == 30.0
    assert after_last_call({"kind": "rl_rollout", "release": "never"}) is None
    with pytest.raises(ScenarioError, match="workload.release: unknown key"):
        parse_scenario({"workload": {"kind": "mooncake_trace", "path": "t.jsonl", "release": "never"}}, "s.yaml")


def test_a_bad_release_on_the_command_line_exits_2_with_one_line() -> None:
    assert_usage_error(tasim("simulate", TINY, "--set", "workload.release={kind: after}"), "workload.release: delay_s is required")


# --- the event log -----------------------------------------------------------------------------


def test_program_finished_writes_released_only_when_false() -> None:
    default = ev.ProgramFinished(1.0, "p", 5, True)
    unreleased = ev.ProgramFinished(1.0, "p", 5, True, released=False)
    assert ev.to_record(default) == {"type": "program_finished", "t": 1.0, "program": "p", "context_tokens": 5, "completed": True}
    assert ev.to_record(unreleased)["released"] is False
    for event in (default, unreleased, ev.ProgramReleased(2.0, "p")):
        assert ev.from_record(ev.to_record(event)) == event


def test_the_checks_refuse_a_release_of_a_released_or_unknown_program() -> None:
    for events in (
        [ev.ProgramStarted(0.0, "p", 1), ev.ProgramFinished(1.0, "p", 5, True), ev.ProgramReleased(2.0, "p")],
        [ev.ProgramStarted(0.0, "p", 1), ev.ProgramFinished(1.0, "p", 5, True, False), ev.ProgramReleased(2.0, "p"), ev.ProgramReleased(3.0, "p")],
        [ev.ProgramReleased(0.0, "q")],
    ):
        checks = EventChecks(lambda e: None)
        with pytest.raises(InvariantViolation, match="program_released: program .* released but"):
            for event in events:
                checks(event)


def test_never_released_programs_still_count_as_completed() -> None:
    at_end, never = _run(_scenario("at_end", "round_robin")), _run(_scenario("never", "round_robin"))
    finished = [e for e in never if isinstance(e, ev.ProgramFinished)]
    assert [(e.program, e.completed, e.released) for e in finished] == [("p0", True, False), ("p1", True, False)]
    assert not any(isinstance(e, ev.ProgramReleased) for e in never)
    # A program-blind router does not hear program ends: only the released flags differ.
    assert [ev.ProgramFinished(e.t, e.program, e.context_tokens, e.completed) if isinstance(e, ev.ProgramFinished) else e for e in never] == at_end
    from tasim.results.metrics import MetricsFold

    summary = MetricsFold().apply_all(never).summary()
    assert (summary["programs_completed"], summary["requests_completed"], summary["requests_unfinished"]) == (2, 4, 0)


# --- ThunderAgent, upstream and Dynamo's port --------------------------------------------------


def test_at_end_frees_the_booking_at_once() -> None:
    log = _run(_scenario("at_end"))
    assert _one(log, ev.RequestRouted, request="p1.0").t == _first_finish(log)
    assert not any(isinstance(e, ev.RequestHeld) for e in log)


def test_upstream_without_decay_holds_the_next_program_until_the_forced_resume() -> None:
    log = _run(_scenario("never"))
    t0 = _first_finish(log)
    assert _one(log, ev.RequestHeld, request="p1.0").t == t0
    resumed = _one(log, ev.ProgramResumed, program="p1")
    assert (resumed.t, resumed.forced) == (math.ceil(t0 + 20.0), True)
    assert _one(log, ev.RequestRouted, request="p1.0").t == resumed.t
    # Then p0 (ACTING, never released) is the smallest ACTING program of an over-full backend.
    assert _one(log, ev.ProgramPaused, program="p0").t == resumed.t


def test_upstream_with_decay_admits_at_the_first_tick_after_the_weight_falls() -> None:
    tau = 10.0
    log = _run(_scenario("never", acting_decay_tau_s=tau))
    t0 = _first_finish(log)
    # Room on the resume side: 1,280 - (670 x 2^(-idle/tau) + 100) >= 700 once idle >= tau x log2(670/480).
    due = t0 + tau * math.log2(FINISHED_CONTEXT / (POOL - 100 - ROOM_NEEDED_BY_P1))
    resumed = _one(log, ev.ProgramResumed, program="p1")
    assert (resumed.t, resumed.forced) == (math.ceil(due), False)
    assert _one(log, ev.ProgramPaused, program="p0").t == resumed.t  # the pause side counts p0 in full


def test_an_idle_ttl_releases_the_finished_program() -> None:
    ttl = 12.0
    log = _run(_scenario("never", variant="dynamo", idle_ttl_s=ttl))
    t0 = _first_finish(log)
    resumed = _one(log, ev.ProgramResumed, program="p1")
    # The first tick at which p0 has been idle longer than the TTL expires it, then resumes p1.
    assert (resumed.t, resumed.forced) == (math.floor(t0 + ttl) + 1, False)
    assert not any(isinstance(e, ev.ProgramPaused) and e.program == "p0" for e in log)


def test_a_release_after_a_delay_is_sent_then_and_frees_the_booking() -> None:
    log = _run(_scenario({"kind": "after", "delay_s": 7.5}))
    t0 = _first_finish(log)
    assert _one(log, ev.ProgramFinished, program="p0").released is False
    released = _one(log, ev.ProgramReleased, program="p0")
    assert released.t == t0 + 7.5
    assert _one(log, ev.ProgramResumed, program="p1").t == math.ceil(released.t)  # the next tick's resume
    # p1 finishes before its own release is due, and the run ends with the workload.
    assert not any(isinstance(e, ev.ProgramReleased) and e.program == "p1" for e in log)


# --- Continuum: an unreleased program's pin lasts until its TTL --------------------------------


def test_continuum_pin_of_an_unreleased_program_lasts_its_ttl() -> None:
    def used_blocks_between_programs(release: str) -> tuple[ev.ProgramPinned, float, list[tuple[float, int]]]:
        scenario = Scenario.model_validate(
            {
                "duration_s": 60,
                "cluster": {"backends": 1, "engine": {"kv_blocks": 80}, "perf": {"model": "dynamo_polynomial"}},
                "workload": {
                    "concurrency": 1,
                    "programs": 2,
                    "turns": 1,
                    "task_prompt_tokens": 600,
                    "output_tokens": 20,
                    "setup_s": 5.0,
                    "release": release,
                },
                "policy": {"name": "continuum", "params": {"ttl_s": 3.0}},
                "metrics": {"sample_interval_s": 0.5},
            }
        )
        log = _run(scenario)
        pin = _one(log, ev.ProgramPinned, program="p0")
        next_call = _one(log, ev.RequestRouted, request="p1.0").t
        samples = [(e.t, e.used_blocks) for e in log if isinstance(e, ev.WorkerSample) and pin.t < e.t < next_call]
        return pin, next_call, samples

    pin, next_call, samples = used_blocks_between_programs("at_end")
    assert next_call == pin.t + 5.0 and samples and all(used == 0 for _, used in samples)
    pin, _, samples = used_blocks_between_programs("never")
    assert pin.blocks == 38 and pin.ttl_s == 3.0
    assert [used for t, used in samples] == [38 if t < pin.t + 3.0 else 0 for t, _ in samples]
    assert {used for _, used in samples} == {38, 0}


# --- live clients ------------------------------------------------------------------------------


def _live_scenario(release: Any) -> Scenario:
    return Scenario.model_validate(
        {
            "workload": {
                "concurrency": 1,
                "programs": 2,
                "turns": 2,
                "task_prompt_tokens": 20,
                "output_tokens": 4,
                "observation_tokens": 3,
                "tool_latency_s": 1.0,
                "setup_s": 50.0,
                "release": release,
            },
        }
    )


async def _drive(release: Any, time_scale: float = 100.0) -> tuple[Any, Any, list[tuple[float, str, bool]]]:
    """The http driver against a fake frontend whose calls go through the live router's policy
    host (round robin): returns the driver's result, the host, and (wall time, session, final)
    per request, a call's time taken when its reply is sent."""
    pytest.importorskip("xxhash")
    from aiohttp import web
    from conftest import live_host, serve_completions

    from tasim.live.clients.http_driver import HttpAgentDriver

    host, _, _ = live_host()
    seen: list[tuple[float, str, bool]] = []

    async def completions(request: web.Request) -> web.Response:
        session = request.headers["x-dynamo-session-id"]
        body = await request.json()
        if request.headers.get("x-dynamo-session-final") == "true":
            host.session_final(session)
            seen.append((time.monotonic(), session, True))
            return web.json_response({"choices": []})
        call = await host.admit(session, body["prompt"], body["max_tokens"])
        host.finish(call, len(body["prompt"]), body["max_tokens"], 0)
        seen.append((time.monotonic(), session, False))
        tasim_data = {"request": call.spec.id, "worker": call.worker, "output_token_ids": [7] * body["max_tokens"]}
        return web.json_response({"choices": [{"text": ""}], "nvext": {"engine_data": {"tasim": tasim_data}}})

    runner, url = await serve_completions(completions)
    try:
        driver = HttpAgentDriver(url, "m", _live_scenario(release), vocab_size=1000, time_scale=time_scale)
        result = await driver.run()
    finally:
        await runner.cleanup()
    return result, host, seen


def test_live_driver_sends_no_session_final_when_clients_never_release() -> None:
    result, host, seen = asyncio.run(_drive("never"))
    assert (result.requests, result.failed_requests, result.session_finals) == (4, 0, 0)
    assert [final for _, _, final in seen] == [False] * 4
    assert sorted(host.programs) == ["p0", "p1"]  # the router still holds both (its idle TTL would end them)


def test_live_driver_releases_at_end_or_after_the_scaled_delay() -> None:
    result, host, seen = asyncio.run(_drive("at_end"))
    assert [(session, final) for _, session, final in seen] == [
        ("p0", False),
        ("p0", False),
        ("p0", True),
        ("p1", False),
        ("p1", False),
        ("p1", True),
    ]
    assert result.session_finals == 2 and host.programs == {}

    result, host, seen = asyncio.run(_drive({"kind": "after", "delay_s": 20.0}))  # 0.2 s of wall time
    last_call = max(t for t, session, final in seen if session == "p0" and not final)
    finals = [(t, session) for t, session, final in seen if final]
    assert [session for _, session in finals] == ["p0"]  # p1's is still due when the run ends
    assert 0.2 <= finals[0][0] - last_call < 0.5  # the next program's 0.5 s set-up runs meanwhile
    assert result.session_finals == 1 and sorted(host.programs) == ["p1"]


def test_verl_agent_loop_releases_as_the_row_says() -> None:
    pytest.importorskip("verl")
    from types import SimpleNamespace

    from verl.workers.rollout.replica import TokenOutput

    from tasim.live.verl.agent_loop import TasimAgentLoop

    class Client:
        def __init__(self) -> None:
            self.ended: list[tuple[float, str]] = []
            self.version = 0  # a weight sync between the two calls: the second is served by version 1

        async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kwargs: Any) -> Any:
            versions = {"min_global_steps": self.version, "max_global_steps": self.version}
            self.version += 1
            return TokenOutput(token_ids=[7] * sampling_params["max_tokens"], extra_fields=versions)

        async def end_program(self, program: str) -> None:
            self.ended.append((time.monotonic(), program))

    async def run(release_after_s: float | None) -> tuple[float, list[tuple[float, str]], Any]:
        loop = TasimAgentLoop.__new__(TasimAgentLoop)  # its base wants verl's tokenizer and data set
        loop.server_manager = client = Client()
        loop.rollout_config = SimpleNamespace(response_length=64)
        row = {
            "program": "t",
            "prompt_ids": [1, 2, 3],
            "turns": [(2, 1.0, [5]), (2, 0.0, [])],
            "time_scale": 100.0,
            "release_after_s": release_after_s,
        }
        output = await loop.run({}, extra_info={"tasim": {"samples": [row]}})
        returned = time.monotonic()
        await asyncio.sleep(1.0)
        return returned, client.ended, output

    returned, ended, output = asyncio.run(run(0.0))
    assert [program for _, program in ended] == ["t"] and ended[0][0] <= returned
    assert asyncio.run(run(None))[1] == []
    # the weight versions, as verl's tool agent loop keeps them: the first call's start, the last call's end
    assert (output.extra_fields["min_global_steps"], output.extra_fields["max_global_steps"]) == (0, 1)
    returned, ended, _ = asyncio.run(run(20.0))  # 0.2 s of wall time after the trajectory returned
    assert [program for _, program in ended] == ["t"] and 0.15 <= ended[0][0] - returned < 1.0
