"""`tasim live`: bad input fails with a one-line error before any process starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# the live extra
pytest.importorskip("msgpack")
pytest.importorskip("zmq")
pytest.importorskip("xxhash")

from conftest import SCENARIOS  # noqa: E402

from tasim.cli import main  # noqa: E402


@pytest.fixture
def no_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    import tasim.live.run as run
    import tasim.live.stack.launcher as stack

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a live stack was started")

    monkeypatch.setattr(run, "run_live", refuse)
    monkeypatch.setattr(run, "LiveStack", refuse)
    monkeypatch.setattr(stack.LiveStack, "__init__", refuse)


LIVE = str(SCENARIOS / "live-mocker.yaml")


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        ([LIVE, "--time-scale", "0"], ["--time-scale", "must be a positive finite number (got 0)"]),
        ([LIVE, "--time-scale", "-1"], ["--time-scale", "must be a positive finite number (got -1)"]),
        ([LIVE, "--time-scale", "inf"], ["--time-scale", "must be a positive finite number (got inf)"]),
        ([LIVE, "--engine", "tpu"], ["--engine", "invalid choice", "tpu"]),
        ([LIVE, "--programs", "0"], ["--programs", "must be at least 1 (got 0)"]),
        ([LIVE, "--model", "/nonexistent"], ["--model /nonexistent: no config.json there"]),
        ([LIVE, "--engine", "vllm", "--time-scale", "2"], ["--time-scale must be 1 with --engine vllm"]),
        ([str(SCENARIOS / "swe-agent.yaml")], ["finite workload", "workload.programs", "--programs"]),
        (["/nonexistent.yaml"], ["/nonexistent.yaml"]),
        ([LIVE, "--routing", "sideways"], ["--routing", "invalid choice", "sideways"]),
        ([LIVE, "--routing", "pin", "--set", "live.routing=proxy"], ["--set live.routing=proxy: --routing pin sets live.routing too"]),
        ([LIVE, "--routing", "dynamo-two-tier"], ["set policy.name=cache_aware (got thunderagent)"]),
        ([LIVE, "--routing", "dynamo-thunderagent", "--set", "policy.params={placement: best_fit}"], ["no counterpart", "placement"]),
        ([str(SCENARIOS / "rl-live-mocker.yaml"), "--driver", "verl", "--routing", "dynamo-thunderagent"], ["the verl driver runs through"]),
        (
            [
                str(SCENARIOS / "rl-live-mocker.yaml"),
                "--driver",
                "verl",
                "--set",
                "workload.mode=fully_async",
                "--set",
                "workload.reset_prefix_cache=true",
            ],
            ["the verl driver runs workload.mode sync or colocate_async; fully_async is simulated only"],
        ),
        (
            [
                str(SCENARIOS / "swe-agent.yaml"),
                "--programs",
                "4",
                "--set",
                "policy.name=autellix",
                "--set",
                "policy.params={}",
                "--set",
                "cluster.engine.scheduling_policy=priority",
            ],
            ["scheduling_policy priority (policy autellix) runs live on --engine vllm only, not mocker", "simulate it instead"],
        ),
        (
            [str(SCENARIOS / "swe-agent.yaml"), "--programs", "4", "--engine", "sglang", "--set", "cluster.engine.scheduling_policy=priority"],
            ["scheduling_policy priority (policy round_robin) runs live on --engine vllm only, not sglang"],
        ),
    ],
)
def test_live_bad_input_is_one_line_and_starts_nothing(
    argv: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str], no_stack: None
) -> None:
    _assert_one_line_error(["live", *argv], fragments, capsys)


def test_live_refuses_a_trace_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str], no_stack: None) -> None:
    # scenarios/mooncake-synthetic.yaml reads a trace from outside the repository, so a small
    # trace scenario of its own keeps this independent of that data
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 60, "output_length": 20, "hash_ids": [1, 2]}\n')
    scenario = tmp_path / "trace.yaml"
    scenario.write_text("cluster: {engine: {block_size: 16, kv_blocks: 64}}\nworkload: {kind: mooncake_trace, path: t.jsonl}\n")
    fragments = ["the http driver runs agent workloads (workload.kind: agent), not 'mooncake_trace'"]
    _assert_one_line_error(["live", str(scenario)], fragments, capsys)


def _assert_one_line_error(argv: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error:"), lines[0]
    assert "Traceback" not in captured.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert captured.out == ""
