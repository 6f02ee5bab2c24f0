"""Workloads as data: what programs will ask for, independent of timing and policy.

Every workload kind becomes a stream of `Script`s: a program id and its calls, each an LLM
request preceded by a wait (environment set-up before the first call, the tool call or think
time before later ones): synthetic agent programs and RL rollouts (`programs`), recorded traces
(`trace_programs`, read by `trace_formats`). The simulator runs scripts; live drivers run the
same plans.

May import: `tasim.core`, `tasim.config`."""

from tasim.workloads.programs import ProgramPlan, Script, TurnPlan, agent_script, group_plans, plan_program, rollout_step_plans
from tasim.workloads.trace_programs import dynamo_trace_scripts, mooncake_scripts

__all__ = [
    "ProgramPlan",
    "Script",
    "TurnPlan",
    "agent_script",
    "dynamo_trace_scripts",
    "group_plans",
    "mooncake_scripts",
    "plan_program",
    "rollout_step_plans",
]
