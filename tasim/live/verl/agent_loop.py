"""``tasim_agent``: a verl agent loop whose tools are simulated from the scenario.

verl's machinery stays in the path: `AgentLoopManager` splits the batch over its Ray workers,
each worker instantiates this loop per sample and awaits ``run``, and every LLM call goes through
the worker's server client (`DynamoProgramClient`). What the loop does per turn comes from the
row's ``extra_info["tasim"]["samples"]`` (built by `tasim.live.verl.rollout_driver` from the same program plans the
simulator draws): call the model for the turn's output tokens, wait the tool's latency (divided
by the time scale), append the observation's token ids (masked 0, as tool output is for verl's
trainer), and go on. On every exit path the trajectory's program is released with one
session-final as the row's ``release_after_s`` (``workload.release``) says: once its last turn
is back (the recipe's client does this), that many scenario seconds later without holding up
the trajectory, or never (a what-if: verl's clients always release).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

if TYPE_CHECKING:
    from tasim.live.verl.client import DynamoProgramClient

AGENT_NAME = "tasim_agent"

# Releases still to come for trajectories that have returned; verl's agent-loop workers keep
# their event loop for the whole run, so these run on after ``run`` (held here until done).
_later_releases: set[asyncio.Task[None]] = set()


async def _release_later(server_manager: DynamoProgramClient, program: str, wait_s: float) -> None:
    await asyncio.sleep(wait_s)
    await server_manager.end_program(program)


class TasimAgentLoop(AgentLoopBase):
    # verl hands every loop the client the manager was created with: `tasim.live.verl.rollout_driver`
    # creates it with a DynamoProgramClient, whose end_program the loop calls.
    server_manager: DynamoProgramClient

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        # A row is a prompt group; verl runs its samples as sessions 0..n-1 (the V1 trainers
        # pass ``session_id``; a V0 batch has one sample per row).
        plan = kwargs["extra_info"]["tasim"]["samples"][kwargs.get("session_id", 0)]
        program: str = plan["program"]
        prompt_ids: list[int] = list(plan["prompt_ids"])
        time_scale: float = plan["time_scale"]
        context = list(prompt_ids)
        response_ids: list[int] = []
        response_mask: list[int] = []
        generating = tools = 0.0
        turns = 0
        versions: dict[str, Any] = {}
        try:
            for turn, (output_tokens, _tool_latency_s, observation) in enumerate(plan["turns"]):
                if turn:
                    started = time.perf_counter()
                    await asyncio.sleep(plan["turns"][turn - 1][1] / time_scale)
                    tools += time.perf_counter() - started
                started = time.perf_counter()
                params = {**sampling_params, "max_tokens": output_tokens, "min_tokens": output_tokens, "ignore_eos": True}
                # The call verl's own loops make, extra keyword arguments included.
                result = await self.server_manager.generate(
                    request_id=program, prompt_ids=context, sampling_params=params, mm_processor_output=None, priority=0
                )
                generating += time.perf_counter() - started
                turns += 1
                # the weight versions the trajectory ran under, as verl's tool agent loop keeps
                # them: the first call's start, the last call's end
                versions.setdefault("min_global_steps", result.extra_fields.get("min_global_steps"))
                versions["max_global_steps"] = result.extra_fields.get("max_global_steps")
                response_ids += result.token_ids
                response_mask += [1] * len(result.token_ids)
                if turn + 1 < len(plan["turns"]):  # no tool after the last call
                    response_ids += observation
                    response_mask += [0] * len(observation)
                context = prompt_ids + response_ids
        finally:
            after_s: float | None = plan["release_after_s"]
            if turns and after_s == 0.0:  # a program that never called has nothing at the router to release
                await asyncio.shield(self.server_manager.end_program(program))
            elif turns and after_s is not None:
                task = asyncio.create_task(_release_later(self.server_manager, program, after_s / time_scale))
                _later_releases.add(task)
                task.add_done_callback(_later_releases.discard)
        budget = self.rollout_config.response_length
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[:budget],
            response_mask=response_mask[:budget],
            num_turns=2 * turns,  # user + assistant messages, as verl counts them
            metrics=AgentLoopMetrics(generate_sequences=generating, tool_calls=tools),
            extra_fields={"tasim_program": program, "tasim_calls": turns, **versions},
        )
