"""tasim against Dynamo's own offline replay (Rust) on the Mooncake conversation trace: 12,031
requests on 4 workers, both sides in the same run, same engine settings (the speed yardstick).
Fidelity is asserted for both routers. Speed for ``kv_router``: the target is at most half
of Dynamo's wall time, judged on the median ratio of `SPEED_PAIRS` alternating pairs, since this
machine's speed drifts (by up to 2x between minutes) and one pair can land on either side of a
drift. ``round_robin``'s ratio is reported."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from conftest import RESULTS

from tasim.config.scenario import load_scenario
from tasim.validation.against_dynamo import validate, with_engine_flavour, with_mocker_host_tier
from tasim.validation.dynamo_replay import Router, run_dynamo
from tasim.validation.measures import all_within
from tasim.validation.tasim_replay import run_tasim

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "mooncake-conversation.yaml"
SPEED_PAIRS = 3  # the validation run's pair and two more
TARGET_RATIO = 0.5


def _replay_against_dynamo(benchmark, router: Router, tmp_path: Path, overrides: list[str], label: str) -> None:  # type: ignore[no-untyped-def]
    """Validate one replay (fidelity asserted), then for ``kv_router`` time `SPEED_PAIRS` - 1
    more alternating pairs and judge the median ratio."""
    pytest.importorskip("dynamo.replay.api")
    scenario = load_scenario(SCENARIO, ["cluster.backends=4", *overrides])
    runs: list = []
    benchmark.pedantic(lambda: runs.append(validate(scenario, tmp_path, [router], repeats=1)), rounds=1, iterations=1)
    trace, (result,) = runs[0]
    assert all_within(result.differences), [d for d in result.differences if d.within is False]
    pairs = [(result.tasim["wall_s"], result.dynamo["wall_s"])]
    if router == "kv_router":
        replayed = with_mocker_host_tier(with_engine_flavour(scenario, "mocker"))  # as `validate` runs it
        for _ in range(SPEED_PAIRS - 1):
            dynamo_s = run_dynamo(trace, replayed.cluster, router)[2]
            pairs.append((run_tasim(replayed, trace, router)[2], dynamo_s))
    ratios = [tasim_s / dynamo_s for tasim_s, dynamo_s in pairs]
    info = {
        "dynamo_wall_s": [round(d, 2) for _, d in pairs],
        "tasim_wall_s": [round(t, 2) for t, _ in pairs],
        "tasim_over_dynamo": [round(r, 3) for r in ratios],
        "median_tasim_over_dynamo": statistics.median(ratios),
    }
    benchmark.extra_info.update(info)
    RESULTS.append((f"Mooncake conversation, 4 workers{label}, {router}: tasim vs Dynamo replay", info))
    if router == "kv_router":
        assert statistics.median(ratios) <= TARGET_RATIO, f"tasim/Dynamo wall-time ratios {ratios}{label}: median above {TARGET_RATIO}"


@pytest.mark.parametrize("router", ["kv_router", "round_robin"])
def test_mooncake_conversation_against_dynamo_replay(benchmark, router: Router, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _replay_against_dynamo(benchmark, router, tmp_path, [], "")


# Both sides with a host tier (Dynamo's mocker's native G2 tier, tasim's dynamo_mocker
# semantics) of 8,192 blocks behind a GPU pool cut to 4,096 so that both tiers evict, as in the
# tiered rows of the validation matrix: the same trace, the same speed target, judged the same
# way (the median of `SPEED_PAIRS` pairs).
HOST_TIER = ["cluster.engine.kv_blocks=4096", "cluster.engine.host_tier.blocks=8192"]


@pytest.mark.parametrize("router", ["kv_router", "round_robin"])
def test_mooncake_conversation_with_host_tiers_against_dynamo_replay(benchmark, router: Router, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _replay_against_dynamo(benchmark, router, tmp_path, HOST_TIER, ", host tiers")
