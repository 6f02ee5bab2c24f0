"""`TasimLoadBalancer` inside plain verl: loaded through verl's own router plug point
(``get_router_handle`` with a router YAML) and driven by verl's ``LLMServerClient.generate``, as
agent loops call it, against fake server actors that record what reaches them."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")
ray = pytest.importorskip("ray")
yaml = pytest.importorskip("yaml")

from omegaconf import OmegaConf  # noqa: E402
from verl.workers.rollout.llm_server import LLMServerClient  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402
from verl.workers.rollout.router import get_router_handle  # noqa: E402

from tasim.core.local_ray import init_local_ray  # noqa: E402

pytestmark = pytest.mark.processes  # starts real processes (make test-fast leaves it out)

ROUTER_CLASS = "tasim.live.verl.balancer.TasimLoadBalancer"
# Insertion order differs from sorted order: the policy's w0, w1, w2 are the sorted addresses.
ADDRESSES = ["10.0.0.3:8000", "10.0.0.1:8000", "10.0.0.2:8000"]
S0, S1, S2 = sorted(ADDRESSES)
CONFIG = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "full_determinism": False}}})


# Ray would pickle FakeServer by reference, and every actor given a handle to one (the
# balancer) would then import this module and so verl (~6 s each); by value it costs nothing.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote
class FakeServer:
    """A rollout server that records each prompt; a closed gate keeps calls in flight."""

    def __init__(self) -> None:
        from verl.workers.rollout.replica import TokenOutput  # only the server process pays for it

        self.output_type = TokenOutput
        self.prompts: list[list[int]] = []
        self.gate: asyncio.Event | None = None

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        self.prompts.append(list(prompt_ids))
        if self.gate is not None:
            await self.gate.wait()
        return self.output_type(token_ids=[5, 6, 7, 8], extra_fields={"global_steps": 0})

    async def recorded(self) -> list[list[int]]:
        return self.prompts

    async def reset(self) -> None:
        self.prompts = []

    async def close_gate(self) -> None:
        self.gate = asyncio.Event()

    async def open_gate(self) -> None:
        if self.gate is not None:
            self.gate.set()
        self.gate = None


@pytest.fixture(scope="module")
def fleet() -> Any:
    init_local_ray(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    servers = {address: FakeServer.remote() for address in ADDRESSES}
    ray.get([server.recorded.remote() for server in servers.values()])  # started (verl imported)
    yield servers
    ray.shutdown()


@pytest.fixture
def servers(fleet: dict[str, Any]) -> dict[str, Any]:
    ray.get([server.reset.remote() for server in fleet.values()])
    return fleet


@pytest.fixture
def balancers(tmp_path: Path) -> Any:
    """Makes balancers through verl's loader; kills them after the test."""
    made: list[Any] = []

    def make(servers: dict[str, Any], **keys: Any) -> tuple[Any, LLMServerClient]:
        path = tmp_path / f"router{len(made)}.yaml"
        path.write_text(yaml.safe_dump({"router_class": ROUTER_CLASS, **keys}))
        handle = get_router_handle(servers=servers, router_config_path=str(path))
        made.append(handle)
        return handle, LLMServerClient(CONFIG, handle)

    yield make
    for handle in made:
        ray.kill(handle)


async def generate(client: LLMServerClient, request_id: str, prompt: list[int]) -> TokenOutput:
    """One turn, called exactly as verl's agent loops call it."""
    return await client.generate(request_id, prompt_ids=prompt, sampling_params={"max_tokens": 4}, mm_processor_output=None, priority=0)


async def recorded(servers: dict[str, Any]) -> dict[str, list[list[int]]]:
    return {address: await server.recorded.remote() for address, server in servers.items()}


async def drained(handle: Any) -> None:
    """verl's releases are fire-and-forget; wait until they all landed, as verl's rebalance does."""
    for _ in range(500):
        if await handle.get_total_inflight.remote() == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("in-flight calls never drained")


async def first_server_with(servers: dict[str, Any], prompt: list[int]) -> str:
    for _ in range(500):
        for address, prompts in (await recorded(servers)).items():
            if prompt in prompts:
                return address
        await asyncio.sleep(0.01)
    raise AssertionError("the call never reached a server")


def test_round_robin_alternates_servers_in_sorted_order(servers: dict[str, Any], balancers: Any) -> None:
    handle, client = balancers(servers, policy="round_robin", kv_blocks=64)

    async def scenario() -> None:
        for i in range(6):
            output = await generate(client, f"traj{i}", [i])
            assert output.token_ids == [5, 6, 7, 8]
        await drained(handle)
        seen = await recorded(servers)
        assert seen == {S0: [[0], [3]], S1: [[1], [4]], S2: [[2], [5]]}
        status = await handle.get_status.remote()
        assert status["total_inflight"] == 0
        assert status["workers"] == {S0: "w0", S1: "w1", S2: "w2"}
        assert status["routed"] == {S0: 2, S1: 2, S2: 2}
        assert status["finished"] == 6 and status["programs"] == 6 and status["held"] == 0
        assert await handle.get_all_servers.remote() == [S0, S1, S2]
        assert await handle.require_acquire_fields.remote() == ["prompt_ids", "sampling_params"]
        assert await handle.require_release_fields.remote() == ["request_id"]
        cleared = await handle.clear_sticky_cache.remote()
        assert cleared == {"cleared_entries": 6, "server_loads": {S0: 0, S1: 0, S2: 0}}
        status = await handle.get_status.remote()
        assert status["programs"] == 6 and "ProgramFinished" not in status["events"]  # the trajectories go on

    asyncio.run(scenario())


def test_kv_router_keeps_a_trajectory_on_its_prefix(servers: dict[str, Any], balancers: Any) -> None:
    two = {S0: servers[S0], S1: servers[S1]}
    handle, client = balancers(two, policy="kv_router", policy_params={"use_kv_events": False}, kv_blocks=64)
    p1 = list(range(64))  # 4 blocks of 16
    p2 = list(range(1000, 1064))

    async def scenario() -> None:
        await asyncio.gather(*(server.close_gate.remote() for server in two.values()))
        t1 = asyncio.ensure_future(generate(client, "t1", p1))
        first = await first_server_with(two, p1)  # equal costs: a seeded tie break
        other = S1 if first == S0 else S0
        # t1 is in flight on `first` (prefill 64 tokens booked, 4 active blocks), so for t2
        # cost(first) = (64 + 64) / 16 + (4 + 4) = 16 and cost(other) = 64 / 16 + (0 + 4) = 8.
        t2 = asyncio.ensure_future(generate(client, "t2", p2))
        assert await first_server_with(two, p2) == other
        await asyncio.gather(*(server.open_gate.remote() for server in two.values()))
        await asyncio.gather(t1, t2)
        await drained(handle)
        # Second turns (6 blocks, the first 4 routed before, nothing in flight): on the
        # trajectory's server cost = max(0, 96 / 16 - 4) + 6 = 8, elsewhere 96 / 16 + 6 = 12.
        await generate(client, "t1", p1 + [7] * 32)
        await generate(client, "t2", p2 + [7] * 32)
        await drained(handle)
        seen = await recorded(two)
        assert seen[first] == [p1, p1 + [7] * 32]
        assert seen[other] == [p2, p2 + [7] * 32]
        status = await handle.get_status.remote()
        assert status["routed"] == {first: 2, other: 2}
        assert status["finished"] == 4 and status["programs"] == 2

    asyncio.run(scenario())


def test_thunderagent_holds_a_program_until_room_is_freed(servers: dict[str, Any], balancers: Any) -> None:
    two = {S1: servers[S1], S0: servers[S0]}
    # 16 blocks x 16 tokens = 256 tokens per server; a 100-token program needs 100 + 100 (buffer).
    params = {"scheduler_interval_s": 0.05}
    handle, client = balancers(two, policy="thunderagent", policy_params=params, kv_blocks=16, block_size=16, program_idle_ttl_s=1.5)
    a, b, c = ([k] * 100 for k in (1, 2, 3))

    async def scenario() -> None:
        await generate(client, "a", a)  # both fit, equal use: the first server
        await generate(client, "b", b)  # 56 tokens left on S0: S1
        await drained(handle)
        held = asyncio.ensure_future(generate(client, "c", c))  # no room anywhere: paused
        await asyncio.sleep(0.5)  # ten scheduler ticks: a and b (ACTING) still occupy both
        assert not held.done()
        assert await recorded(two) == {S1: [b], S0: [a]}
        status = await handle.get_status.remote()
        assert status["held"] == 1 and status["pauses"] == 1 and status["total_inflight"] == 0
        cleared = await handle.clear_sticky_cache.remote()  # forgets where a and b went (c went nowhere); ends nothing
        assert cleared == {"cleared_entries": 2, "server_loads": {S0: 0, S1: 0}}
        await asyncio.sleep(0.2)
        assert not held.done()  # paused, not held by a sync: the clear releases nothing
        status = await handle.get_status.remote()
        assert status["programs"] == 3 and status["events"]["WeightSyncFinished"] == 1 and "ProgramFinished" not in status["events"]
        await asyncio.wait_for(held, timeout=5)  # a and b idle past the TTL end; the next tick resumes c there
        await drained(handle)
        assert await recorded(two) == {S1: [b], S0: [a, c]}
        status = await handle.get_status.remote()
        assert status["resumes"] == 1 and status["held"] == 0 and status["programs"] == 1
        assert status["routed"] == {S0: 2, S1: 1}

    asyncio.run(scenario())


def test_clearing_the_sticky_cache_rebinds_sessions_and_keeps_their_programs(servers: dict[str, Any], balancers: Any) -> None:
    """Round robin behind session affinity: a trajectory stays on its first server until an
    affinity clear; its next turn then binds afresh (the rotation's next server), as the same
    program."""
    handle, client = balancers(servers, policy="round_robin", policy_params={"session_affinity_ttl_s": 600}, kv_blocks=64)

    async def scenario() -> None:
        await generate(client, "t0", [0])  # w0
        await generate(client, "t1", [1])  # w1
        await generate(client, "t0", [0, 5, 6, 7, 8, 9])  # bound: w0, the rotation stays
        await drained(handle)
        assert await handle.clear_sticky_cache.remote() == {"cleared_entries": 2, "server_loads": {S0: 0, S1: 0, S2: 0}}
        await generate(client, "t0", [0, 5, 6, 7, 8, 9, 5, 6, 7, 8, 10])  # bound afresh: w2
        await generate(client, "t1", [1, 5, 6, 7, 8, 11])  # w0
        await drained(handle)
        seen = await recorded(servers)
        assert seen == {S0: [[0], [0, 5, 6, 7, 8, 9], [1, 5, 6, 7, 8, 11]], S1: [[1]], S2: [[0, 5, 6, 7, 8, 9, 5, 6, 7, 8, 10]]}
        status = await handle.get_status.remote()
        assert status["programs"] == 2 and status["finished"] == 5
        assert status["events"]["ProgramStarted"] == 2 and "ProgramFinished" not in status["events"]
        assert (status["events"]["WeightSyncStarted"], status["events"]["WeightSyncFinished"]) == (1, 1)

    asyncio.run(scenario())


def test_idle_programs_expire(servers: dict[str, Any], balancers: Any) -> None:
    handle, client = balancers({S0: servers[S0]}, policy="round_robin", kv_blocks=64, program_idle_ttl_s=0.2)

    async def scenario() -> None:
        await generate(client, "old", [1])
        await drained(handle)
        await asyncio.sleep(0.3)
        await generate(client, "new", [2])  # the acquire sweeps "old" out
        await drained(handle)
        status = await handle.get_status.remote()
        assert status["programs"] == 1
        assert status["events"]["ProgramFinished"] == 1

    asyncio.run(scenario())


def test_removed_servers_get_nothing_and_new_ones_rebuild_when_idle(servers: dict[str, Any], balancers: Any) -> None:
    handle, client = balancers({S0: servers[S0], S1: servers[S1]}, policy="round_robin", kv_blocks=64)

    async def scenario() -> None:
        await handle.remove_servers.remote([S1])
        assert await handle.get_all_servers.remote() == [S0]
        for i in range(4):  # the policy still alternates w0, w1; w1's calls are redirected
            await generate(client, f"r{i}", [i])
        await drained(handle)
        assert await recorded(servers) == {S0: [[0], [1], [2], [3]], S1: [], S2: []}
        assert (await handle.get_status.remote())["redirected"] == 2
        await handle.add_servers.remote({S1: servers[S1]})  # known: back in service
        await generate(client, "r4", [4])  # round robin goes on with w0, then w1
        await generate(client, "r5", [5])
        await drained(handle)
        assert (await recorded(servers))[S1] == [[5]]
        await handle.add_servers.remote({S2: servers[S2]})  # new, pool idle: a fresh policy
        for i in range(6, 9):
            await generate(client, f"r{i}", [i])
        await drained(handle)
        seen = await recorded(servers)
        assert (seen[S0][-1], seen[S1][-1], seen[S2]) == ([6], [7], [[8]])
        status = await handle.get_status.remote()
        assert status["workers"] == {S0: "w0", S1: "w1", S2: "w2"}
        assert status["programs"] == 3  # the rebuild forgot r0 … r5

    asyncio.run(scenario())


def test_adding_a_new_server_while_busy_is_refused(servers: dict[str, Any], balancers: Any) -> None:
    handle, client = balancers({S0: servers[S0]}, policy="round_robin", kv_blocks=64)

    async def scenario() -> None:
        await servers[S0].close_gate.remote()
        busy = asyncio.ensure_future(generate(client, "t", [1]))
        await first_server_with({S0: servers[S0]}, [1])
        with pytest.raises(NotImplementedError, match="while 1 calls are in flight or held"):
            await handle.add_servers.remote({S1: servers[S1]})
        await servers[S0].open_gate.remote()
        await busy
        await drained(handle)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"polcy": "kv_router", "kv_blocks": 8}, "unknown key 'polcy'"),
        ({"kv_blocks": 0}, "'kv_blocks': Input should be greater than 0"),
        ({"policy": "round_robin"}, "'kv_blocks' is required"),
        ({"policy": "nope", "kv_blocks": 8}, "unknown policy 'nope' (allowed: "),
        ({"policy": "thunderagent", "policy_params": {"tick": 1}, "kv_blocks": 8}, "unknown key 'policy_params.tick'"),
        ({"policy_params": {"use_kv_events": True}, "kv_blocks": 8}, "use_kv_events: false"),
    ],
)
def test_bad_router_yaml_surfaces_one_line(servers: dict[str, Any], balancers: Any, keys: dict[str, Any], message: str) -> None:
    handle, client = balancers({S0: servers[S0]}, **keys)

    async def scenario() -> None:
        with pytest.raises(ray.exceptions.RayActorError) as failure:
            await generate(client, "t", [1])
        line = next(line for line in str(failure.value).splitlines() if line.startswith("ValueError: "))
        assert message in line

    asyncio.run(scenario())
