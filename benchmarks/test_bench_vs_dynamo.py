"""tasim against Dynamo's own offline replay (Rust) on the Mooncake conversation trace: 12,031
requests on 4 workers, both sides in the same run, same engine settings (issue 8's yardstick).
Fidelity is asserted for both routers, and speed for ``kv_router`` (issue 8's target: tasim's
wall time must not exceed Dynamo's); ``round_robin``'s ratio is reported."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RESULTS

from tasim.scenario import load_scenario
from tasim.validation.against_dynamo import validate
from tasim.validation.measures import all_within

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "mooncake-conversation.yaml"


@pytest.mark.parametrize("router", ["kv_router", "round_robin"])
def test_mooncake_conversation_against_dynamo_replay(benchmark, router: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("dynamo.replay.api")
    scenario = load_scenario(SCENARIO, ["cluster.backends=4"])
    runs: list = []
    benchmark.pedantic(lambda: runs.append(validate(scenario, tmp_path, [router], repeats=1)[1][0]), rounds=1, iterations=1)
    result = runs[0]
    tasim_s, dynamo_s = result.tasim["wall_s"], result.dynamo["wall_s"]
    info = {"dynamo_wall_s": dynamo_s, "tasim_wall_s": tasim_s, "tasim_over_dynamo": tasim_s / dynamo_s}
    benchmark.extra_info.update(info)
    RESULTS.append((f"Mooncake conversation, 4 workers, {router}: tasim vs Dynamo replay", info))
    assert all_within(result.differences), [d for d in result.differences if d.within is False]
    if router == "kv_router":
        assert tasim_s <= dynamo_s, f"tasim {tasim_s:.1f} s is slower than Dynamo's replay ({dynamo_s:.1f} s)"
