"""``tasim live``: start a stack, drive the scenario's programs through it, stop it, summarise.

The run directory gets the stack's working files and process logs (``stack/``), the router's event log (``events.jsonl``, the same event types the
simulator writes, so ``tasim report`` works on it), ``summary.json`` (the simulator's keys plus
``programs_leaked``: programs the router saw start but never saw end) and ``run.json`` (the
scenario, engine, time scale and the driver's counts). With ``compare_sim`` the same scenario and
programs are simulated into ``DIR/sim``; on the mocker the simulation runs the mocker's engine
flavour and Dynamo's polynomial step times, which is what the mocker runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from tasim import __version__
from tasim.config.scenario import Scenario, with_engine_flavour
from tasim.config.workers import cluster_view
from tasim.core import events as ev
from tasim.hosting.policy_host import run_header
from tasim.live.clients.http_driver import DriverError, HttpAgentDriver, PromptFormat, live_workload
from tasim.live.clients.observed import ObservedCalls
from tasim.live.stack.engines import host_tier_refusal
from tasim.live.stack.launcher import Engine, LiveStack
from tasim.live.stack.tiny_model import vocab_size
from tasim.results.eventlog import EVENTS_PLAIN, EventLogError, EventWriter, read_events
from tasim.results.metrics import MetricsFold
from tasim.results.run_folder import RUN_FILE, SUMMARY_FILE, write_json

SIM_DIR = "sim"
STACK_DIR = "stack"  # discovery store, generated model, router config and process logs


def finite_scenario(scenario: Scenario, programs: int | None) -> Scenario:
    """The scenario with ``workload.programs`` set, so simulation runs the same programs."""
    workload, count = live_workload(scenario, programs)
    data = scenario.model_dump(mode="json")
    data["workload"]["programs"] = count
    return Scenario.model_validate(data)


def live_summary(events_path: Path, wall_time_s: float | None) -> dict[str, Any]:
    fold = MetricsFold()
    started: set[str] = set()
    for event in read_events(events_path):
        fold.apply(event)
        if isinstance(event, ev.ProgramStarted):
            started.add(event.program)
        elif isinstance(event, ev.ProgramFinished):
            started.discard(event.program)
    try:
        summary = fold.summary(wall_time_s=wall_time_s)
    except ValueError as exc:
        raise EventLogError(f"{events_path}: {exc} (did the router stop before writing its end?)") from None
    summary["programs_leaked"] = len(started)
    if summary["host_tier"] is not None:
        # Workers report cached tokens without their tier and keep their copy lanes to
        # themselves: live, only the tier's size is known.
        summary["host_tier"] = {key: value if key == "host_blocks_per_worker" else None for key, value in summary["host_tier"].items()}
    return summary


Driver = Literal["http", "verl"]
DRIVERS: tuple[str, ...] = ("http", "verl")


def prepare_scenario(scenario: Scenario, driver: Driver, programs: int | None, engine: Engine) -> Scenario:
    """The scenario as the driver will run it: the http driver runs a finite agent workload
    (``workload.programs``), the verl driver an ``rl_rollout`` one. Checks that the engines
    can schedule it and that Dynamo's plug-in can run it (``live.routing: dynamo-*``) before
    anything starts."""
    if scenario.cluster.engine.scheduling_policy == "priority" and engine != "vllm":
        raise DriverError(
            f"cluster.engine.scheduling_policy priority (policy {scenario.policy.name}) runs live on --engine vllm only, "
            f"not {engine}: tasim's priority scheduling is vLLM's, and Dynamo 1.6.1's mocker has none; simulate it instead"
        )
    refusal = host_tier_refusal(engine, scenario)
    if refusal:
        raise DriverError(refusal)
    if scenario.live.routed_by_dynamo:
        from tasim.live.stack.dynamo_policies import plugin_config

        if driver == "verl":
            raise DriverError(f"the verl driver runs through tasim's router (live.routing proxy or pin), not {scenario.live.routing}")
        plugin_config(scenario, 1.0)
    if driver == "verl":
        from tasim.live.verl.rollout_driver import rollout_workload

        rollout_workload(scenario)
        if programs is not None:
            raise DriverError("--programs is for the http driver; an rl_rollout workload sets its own batch")
        return scenario
    return finite_scenario(scenario, programs)


def run_live(
    scenario: Scenario,
    out: Path,
    engine: Engine = "mocker",
    time_scale: float = 1.0,
    programs: int | None = None,
    prompt_format: PromptFormat = "tokens",
    model_path: Path | None = None,
    driver: Driver = "http",
) -> dict[str, Any]:
    scenario = prepare_scenario(scenario, driver, programs, engine)
    if engine == "mocker":  # the router sizes its workers as the mocker does: no null block
        scenario = with_engine_flavour(scenario, "mocker")
    out.mkdir(parents=True, exist_ok=True)
    partial = out / (EVENTS_PLAIN + ".partial")
    started = time.perf_counter()
    dynamo_routes = scenario.live.routed_by_dynamo
    # With Dynamo's plug-in deciding, the run's log is the client's; the router only watches.
    router_log = out / STACK_DIR / "router-events.jsonl" if dynamo_routes else partial
    with LiveStack(scenario, engine=engine, model_path=model_path, time_scale=time_scale, workdir=out / STACK_DIR, events_path=router_log) as stack:
        assert stack.model_path is not None and stack.workdir is not None
        if driver == "verl":  # it starts the run's clock itself, once verl is up
            from tasim.live.verl.rollout_driver import run_verl_rollout

            record: dict[str, Any] = asdict(run_verl_rollout(scenario, stack, time_scale, stack.workdir))
        else:
            observed = ObservedCalls(EventWriter(partial), observed_header(scenario), time_scale) if dynamo_routes else None
            http = HttpAgentDriver(
                stack.base_url,
                stack.model_name,
                scenario,
                vocab_size(stack.model_path),
                time_scale,
                prompt_format=prompt_format,
                model_path=stack.model_path,
                decisions_url=stack.status_url if stack.pinned else None,
                observed=observed,
                worker_names=WorkerNames(stack) if observed is not None else None,
            )
            stack.begin_run()
            try:
                result = asyncio.run(http.run())
            finally:
                if observed is not None:
                    observed.close()
            record = asdict(result) | {"errors": result.errors[:20], "calls": len(result.calls)}
            if dynamo_routes:
                from tasim.live.stack.dynamo_policies import plugin_summary

                record["dynamo_plugin"] = plugin_summary(stack.frontend_log)
        stack.end_run()
    wall = time.perf_counter() - started
    final = out / EVENTS_PLAIN
    partial.replace(final)
    summary = live_summary(final, wall)
    write_json(out / SUMMARY_FILE, summary)
    write_json(
        out / RUN_FILE,
        {
            "tasim_version": __version__,
            "mode": "live",
            "engine": engine,
            "time_scale": time_scale,
            "events": EVENTS_PLAIN,
            "wall_time_s": wall,
            "driver": {"kind": driver, **record},
            "scenario": scenario.model_dump(mode="json"),
        },
    )
    return summary


def observed_header(scenario: Scenario) -> ev.RunStarted:
    """The client's log's first event: the run as the router's log would head it, with the
    Dynamo plug-in as its policy."""
    return dataclasses.replace(run_header(scenario, cluster_view(scenario)), policy=scenario.live.routing)


class WorkerNames:
    """A Dynamo instance id → the worker's name (``w0`` ...), as the stack's router mapped them
    (asked again for an instance it does not know yet: a restarted worker)."""

    def __init__(self, stack: LiveStack) -> None:
        self.stack = stack
        self._names: dict[int, str] = {}

    def __call__(self, instance: int) -> str:
        if instance not in self._names:
            workers = self.stack.status()["workers"]
            self._names.update({info["instance_id"]: worker for worker, info in workers.items() if info["instance_id"] is not None})
        return self._names.get(instance, f"instance-{instance}")


def simulated_twin(scenario: Scenario, engine: Engine) -> Scenario:
    """What to simulate next to a live run: on the mocker, its engine flavour (leaves-first
    eviction, no reuse of generated blocks: it caches them under random token ids of its own,
    not the ids it returns), its polynomial step times, and no cache reset between RL steps (it
    has no call for one)."""
    if engine != "mocker":
        return scenario
    data = with_engine_flavour(scenario, "mocker").model_dump(mode="json")
    data["cluster"]["perf"]["model"] = "dynamo_polynomial"
    if data["workload"].get("kind") == "rl_rollout":
        data["workload"]["reset_prefix_cache"] = False  # the mocker cannot empty its cache
    return Scenario.model_validate(data)
