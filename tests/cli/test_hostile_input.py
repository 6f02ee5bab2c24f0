"""Hostile input: scenario files and traces malformed in every way we could think of
must end ``tasim simulate`` (and ``compare`` / ``validate dynamo``, which read the same files)
with status 2 and one line on stderr naming the file (and line) and the field: never a
traceback, a hang or a runaway allocation, and never at the cost of results already written.

The CLI runs in this process (``tasim.cli.main``) under a time and memory limit, so a hang or a
blow-up fails the test instead of stalling or swapping the machine. Fuzzing is derandomized.
"""

from __future__ import annotations

import copy
import json
import math
import re
import resource
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from conftest import REPO, TEST_DATA, assert_usage_error
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from tasim.cli import main
from tasim.config.scenario import WORKLOAD_KINDS, Scenario
from tasim.policies import POLICIES
from tasim.workloads.trace_formats import TraceError, read_dynamo_agent_trace, read_mooncake

PRESETS = REPO / "scenarios"
CONVERSATION = PRESETS / "traces" / "conversation_trace.jsonl"
DYNAMO_TRACE = TEST_DATA / "dynamo_agent_trace.jsonl"

TIME_LIMIT_S = 30  # a valid run here simulates 5 s of a tiny cluster: well under a second
MEMORY_HEADROOM = 2 << 30  # bytes a run may add to this process's address space
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --- running the CLI ---------------------------------------------------------------------------


class Runaway(BaseException):
    """The CLI ran past the time limit (a BaseException, so no handler in tasim swallows it)."""


@contextmanager
def _limits() -> Iterator[None]:
    """Fail instead of hanging or exhausting the machine: a timer, and on Linux a cap on the
    address space (an allocation past it raises MemoryError, which `main` does not catch)."""

    def expire(signum: int, frame: Any) -> None:
        raise Runaway(f"the CLI ran for more than {TIME_LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if sys.platform == "linux":
        status = Path("/proc/self/status").read_text()
        used = int(re.search(r"VmSize:\s+(\d+) kB", status).group(1)) * 1024
        cap = used + MEMORY_HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m tasim ARGV`` in this process, as a CompletedProcess for conftest's helpers."""
    capsys.readouterr()
    with _limits():
        code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(list(map(str, argv)), code, captured.out, captured.err)


def simulate(capsys: pytest.CaptureFixture[str], scenario: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli(capsys, "simulate", scenario, "--out", out, "--quiet", *extra)


def error_line(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """conftest's check (status 2, one line, no traceback, every fragment), and a short line."""
    assert_usage_error(result, *fragments)
    line = result.stderr.strip()
    assert line.startswith("error: ") and len(line) < 1000, line
    return line


def write_scenario(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _merge(node: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(node.get(key), dict):
            _merge(node[key], value)
        else:
            node[key] = value
    return node


def _trace_slice(path: Path, lines: int = 50) -> Path:
    with CONVERSATION.open() as source:
        path.write_text("".join(next(source) for _ in range(lines)))
    return path


# Presets cut down to a few simulated seconds of a few programs, so a mutation that stays valid
# still runs in milliseconds.
SMALL = {
    "swe-agent.yaml": {"workload": {"concurrency": 2}},
    "rl-rollout.yaml": {"workload": {"prompts_per_step": 2, "samples_per_prompt": 2, "steps": 1, "max_concurrency": 4}},
    "mooncake-conversation.yaml": {"workload": {"max_requests": 20}},  # path: a 50-line slice
}


def small_preset(name: str, trace: Path | None = None) -> dict[str, Any]:
    raw = yaml.safe_load((PRESETS / name).read_text())
    _merge(raw, {"duration_s": 5, "metrics": {"warmup_s": 0}, **SMALL[name]})
    if raw["workload"].get("kind") == "mooncake_trace":
        assert trace is not None
        raw["workload"]["path"] = str(trace)
    return raw


@pytest.fixture(scope="module")
def trace_slice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _trace_slice(tmp_path_factory.mktemp("traces") / "conversation-50.jsonl")


# --- scenario fuzz ---------------------------------------------------------------------------

HOSTILE_VALUES: list[Any] = [
    None,
    True,
    False,
    "",
    "many",
    "x" * 10_000,
    "a\nb",
    "\x00",
    [],
    [1, "two"],
    {},
    {"nested": {"deep": [1]}},
    -1,
    0,
    0.5,
    -1e300,
    1e300,
    1e-300,
    math.inf,
    -math.inf,
    math.nan,
    10**30,
    2**63,
    "1e999",
]
JUNK_KEYS = ["bogus", "Seed", "seed ", "duration", "kv-blocks", "x" * 300, "a\nb", "1", ""]
YAML_BREAKERS = ["{", "[", ": :", "\t", "&a *b", "!!python/object/apply:os.system [x]", "- - -", "%YAML 9.9\n", "'", "? "]
POLICY_NAMES = sorted(POLICIES) + ["nope", "", "Round_Robin", "x" * 500]


def _model_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, field in model.model_fields.items():
        yield prefix + (name,)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _model_paths(field.annotation, prefix + (name,))


def _key_paths(node: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, value in node.items():
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from _key_paths(value, prefix + (key,))


def _settable_paths(raw: dict[str, Any]) -> list[tuple[str, ...]]:
    """Every key the file has, and every field the models know (set or left to its default)."""
    kind = raw["workload"].get("kind", "agent")
    workload = next(cls for cls in WORKLOAD_KINDS if get_args(cls.model_fields["kind"].annotation) == (kind,))
    known = set(_model_paths(Scenario)) | {("workload", name) for name in workload.model_fields}
    return sorted(set(_key_paths(raw)) | known)


def _set(raw: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = raw
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


def _parent(raw: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = raw
    for key in path[:-1]:
        node = node[key]
    return node


@st.composite
def hostile_scenarios(draw: st.DrawFn, trace: Path) -> tuple[str, bytes, str | None]:
    """(what was done, the file's bytes, what a message about the file must name): one mutation
    of a small preset. A message names the field changed, or the section holding it when the
    problem is with the section (a cluster whose weights leave no KV memory)."""
    name = draw(st.sampled_from(sorted(SMALL)))
    raw = small_preset(name, trace)
    existing = list(_key_paths(raw))
    op = draw(
        st.sampled_from(["set", "set", "set", "delete", "rename", "duplicate", "policy", "syntax", "truncate", "junk", "empty", "not a mapping"])
    )
    if op == "set":
        path = draw(st.sampled_from(_settable_paths(raw)))
        value = draw(st.sampled_from(HOSTILE_VALUES))
        _set(raw, path, value)
        return f"{name}: {'.'.join(path)} = {value!r:.40}", yaml.safe_dump(raw).encode(), path[0]
    if op == "delete":
        path = draw(st.sampled_from(existing))
        del _parent(raw, path)[path[-1]]
        return f"{name}: delete {'.'.join(path)}", yaml.safe_dump(raw).encode(), path[0]
    if op == "rename":  # every junk key is unknown where it lands
        path = draw(st.sampled_from(existing))
        parent, junk = _parent(raw, path), draw(st.sampled_from(JUNK_KEYS))
        parent[junk] = parent.pop(path[-1])
        named = path[0] if len(path) > 1 else "unknown key"
        return f"{name}: rename {'.'.join(path)} to {junk!r:.40}", yaml.safe_dump(raw).encode(), named
    if op == "duplicate":  # refused: PyYAML would keep the last one silently
        key, value = draw(st.sampled_from(sorted(raw))), draw(st.sampled_from(HOSTILE_VALUES))
        text = yaml.safe_dump(raw) + yaml.safe_dump({key: value})
        return f"{name}: duplicate {key} = {value!r:.40}", text.encode(), key
    if op == "policy":
        policy = draw(st.sampled_from(POLICY_NAMES))
        fields = sorted(POLICIES[policy].params_model.model_fields) if policy in POLICIES else []
        param, value = draw(st.sampled_from(fields + ["bogus", "a\nb"])), draw(st.sampled_from(HOSTILE_VALUES))
        raw["policy"] = {"name": policy, "params": {param: value}}
        return f"{name}: policy {policy!r:.40} with {param} = {value!r:.40}", yaml.safe_dump(raw).encode(), "policy"
    text = yaml.safe_dump(raw).encode()
    if op == "syntax":
        at, breaker = draw(st.integers(0, len(text))), draw(st.sampled_from(YAML_BREAKERS)).encode()
        return f"{name}: {breaker!r} at byte {at}", text[:at] + breaker + text[at:], None
    if op == "truncate":
        at = draw(st.integers(0, len(text)))
        return f"{name}: cut at byte {at}", text[:at], None
    if op == "junk":
        return "binary junk", draw(st.binary(min_size=1, max_size=300)), None
    if op == "empty":
        return "empty", draw(st.sampled_from([b"", b"\n", b"# only a comment\n", b"~\n"])), None
    not_a_mapping = [b"- a\n- b\n", b"42\n", b"just text\n", b"[1, 2]\n", b"true\n"]
    return "not a mapping", draw(st.sampled_from(not_a_mapping)), "top level must be a mapping"


@settings(FUZZ, max_examples=200)
@given(data=st.data())
def test_fuzzed_scenarios_fail_cleanly_or_run(capsys: pytest.CaptureFixture[str], tmp_path: Path, data: st.DataObject) -> None:
    # Mooncake scenarios name the trace relative to themselves, so that a cut path names
    # nothing outside their own directory.
    slice_ = tmp_path / "slice.jsonl"
    if not slice_.exists():
        _trace_slice(slice_)
    _what, content, must_name = data.draw(hostile_scenarios(Path(slice_.name)), label="mutation")
    with tempfile.TemporaryDirectory(dir=tmp_path) as work:
        scenario, out = Path(work) / "hostile.yaml", Path(work) / "out"
        scenario.write_bytes(content)
        trace = Path(work) / slice_.name
        trace.write_bytes(slice_.read_bytes())
        out.mkdir()
        (out / "summary.json").write_bytes(b'{"earlier": "run"}')
        result = simulate(capsys, scenario, out)
        event(f"exit {result.returncode}")  # shown by --hypothesis-show-statistics
        if result.returncode == 0:  # the mutation happened to be valid: a real, finished run
            assert result.stderr == ""
            run = json.loads((out / "run.json").read_text())
            assert json.loads((out / "summary.json").read_text())["sim_time_s"] <= run["scenario"]["duration_s"]
            return
        line = error_line(result)
        assert (out / "summary.json").read_bytes() == b'{"earlier": "run"}', "a failed run replaced earlier results"
        # Mooncake lines are read as the run starts, so a trace_block_size they contradict is
        # reported at the trace's line; everything else is the scenario file's.
        if trace is not None and line.startswith(f"error: {trace}:"):
            return
        assert line.startswith(f"error: {scenario}"), line
        assert must_name is None or must_name in line, line


# --- scenario defects found by the fuzz, one by one ----------------------------------------------

SWE = "swe-agent.yaml"


@pytest.mark.parametrize(
    ("preset", "changes", "fragments"),
    [
        # tracebacks
        (SWE, {"seed": -1}, ["seed", "greater than or equal to 0", "(got -1)"]),
        (SWE, {"workload": {"turns": math.inf}}, ["workload.turns.value", "finite number"]),
        (SWE, {"workload": {"output_tokens": 1e300}}, ["workload.output_tokens.value", "less than or equal to 1000000000"]),
        (
            SWE,
            {"workload": {"tools": {"shell": {"latency_s": {"kind": "pareto", "scale": 1, "alpha": 1e-300}}}}},
            ["workload.tools.shell.latency_s.alpha", "greater than or equal to 0.1"],
        ),
        (SWE, {"workload": {"tools": {"python": {"share": -1}}}}, ["workload.tools.python.share", "greater than 0", "(got -1)"]),
        (SWE, {"workload": {"tools": {"python": {"shares": 1}}}}, ["workload.tools.python.shares", "unknown key (allowed: share, latency_s)"]),
        (SWE, {"workload": {"tool_latency_s": 2.0}}, ["workload", "give tool_latency_s or tools, not both"]),
        (
            SWE,
            {"workload": {"tool_latency_s": {"median": 1.5}}},
            ["workload.tool_latency_s", "a mapping here needs a kind (fixed, uniform, lognormal, pareto, empirical)"],
        ),
        (
            SWE,
            {"workload": {"turns": {"kind": "empirical", "values": [1, 2], "weights": [math.inf, 1]}}},
            ["workload.turns.weights", "finite number"],
        ),
        (SWE, {"workload": {"turns": {"kind": "uniform", "low": 0, "high": 1e300}}}, ["workload.turns.high", "1000000000"]),
        (SWE, {"workload": {"tools": {"shell": {"latency_s": math.inf}}}}, ["workload.tools.shell.latency_s.value", "finite number"]),
        ("rl-rollout.yaml", {"workload": {"tool_latency_s": math.inf}}, ["workload.tool_latency_s.value", "finite number"]),
        (SWE, {"policy": {"name": "continuum", "params": {"ttl_s": math.inf}}}, ["policy", "params.ttl_s", "finite number"]),
        (SWE, {"name": "a\x00b"}, ["name", "should match pattern"]),
        (SWE, {"name": "x" * 5000}, ["name", "at most 100 characters"]),
        # hangs: a period or an arrival gap so short that the clock stops
        (SWE, {"metrics": {"sample_interval_s": 1e-300}}, ["metrics.sample_interval_s", "greater than or equal to 0.001"]),
        (
            SWE,
            {"policy": {"name": "thunderagent", "params": {"scheduler_interval_s": 1e-300}}},
            ["params.scheduler_interval_s", "greater than or equal to 0.001"],
        ),
        (SWE, {"workload": {"arrival": "poisson", "rate_per_s": 1e300}}, ["workload.rate_per_s", "less than or equal to 10000"]),
        # runaway allocations or hours of planning that the old bounds allowed
        (SWE, {"workload": {"concurrency": 1_000_000}}, ["workload.concurrency", "less than or equal to 100000"]),
        (
            "rl-rollout.yaml",
            {"workload": {"prompts_per_step": 100_000, "samples_per_prompt": 8, "steps": 1}},
            ["workload", "prompts_per_step x samples_per_prompt must be at most 100000 (got 800000)"],
        ),
        # more prompt groups or trajectories than their block-hash owner-key ranges hold
        (
            "rl-rollout.yaml",
            {"workload": {"prompts_per_step": 11, "steps": 100_000}},
            ["workload", "(steps + warmup_batches) x prompts_per_step must be at most 1048575 (got 1100000)"],
        ),
        (
            "rl-rollout.yaml",
            {"workload": {"prompts_per_step": 10, "samples_per_prompt": 100, "steps": 100_000}},
            ["workload", "(steps + warmup_batches) x prompts_per_step x samples_per_prompt must be at most 66060288 (got 100000000)"],
        ),
        (SWE, {"workload": {"max_context_tokens": 10**30}}, ["workload.max_context_tokens", "less than or equal to 10000000"]),
        # a message that said nothing of the field
        (SWE, {"cluster": {"engine": {"activation_reserve_gib": 1e300}}}, ["cluster.engine.activation_reserve_gib", "less than or equal to 1024"]),
        # several lines, or a line as long as the input
        (SWE, {"a\nb": 1}, ["'a\\nb': unknown key (allowed: name,"]),
        (SWE, {"policy": {"name": "kv_router", "params": {"a\nb": 1}}}, ["params.'a\\nb': unknown parameter of kv_router"]),
        (SWE, {"cluster": {"gpu": "x" * 100_000}}, ["cluster.gpu", "unknown GPU 'xxxxxxxxxxxx...xxxxxxxxxxxxx'"]),
        (SWE, {"policy": {"name": "x" * 100_000}}, ["policy", "unknown policy 'xxxxxxxxxxxx...xxxxxxxxxxxxx'"]),
        (
            SWE,
            {"workload": {"turns": {"kind": "x" * 100_000}}},
            ["workload.turns: unknown kind 'xxxxxxxxxxxx...xxxxxxxxxxxxx' (allowed: 'fixed', 'uniform', 'lognormal',"],
        ),
    ],
)
def test_scenario_defects_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, preset: str, changes: dict[str, Any], fragments: list[str]
) -> None:
    scenario = write_scenario(tmp_path / "s.yaml", _merge(small_preset(preset), copy.deepcopy(changes)))
    error_line(simulate(capsys, scenario, tmp_path / "out"), str(scenario), *fragments)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (b"seed: " + b"7" * 5000 + b"\n", ["YAML value out of range", "4300 digits"]),
        (b"workload: " + b"[" * 20_000 + b"]" * 20_000 + b"\n", ["YAML nested too deeply"]),
        (b"name: caf\xe9\n", ["invalid UTF-8 at byte 10", "expected a YAML text file"]),
    ],
)
def test_unreadable_yaml_is_a_one_line_error(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: bytes, fragments: list[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_bytes(text)
    error_line(simulate(capsys, scenario, tmp_path / "out"), str(scenario), *fragments)


def test_overrides_too_big_for_yaml_are_read_as_text(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "s.yaml", small_preset(SWE))
    result = simulate(capsys, scenario, tmp_path / "out", "--set", "seed=" + "7" * 5000)
    error_line(
        result,
        "error: --set 'seed=7777777...7777777777777': seed: Unable to parse input string as an integer, exceeded maximum size",
        "(got '777777777777...7777777777777')",
    )


def test_default_output_directory_stays_under_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The scenario's name makes the default output directory: runs/<name>-<policy>-s<seed>. The
    # names that escape runs/ land in tmp_path, where the last line would see them.
    monkeypatch.chdir(tmp_path)
    for name in ["../escaped", f"{tmp_path}/absolute", "a/b", "..", "", "a\x00b"]:
        scenario = write_scenario(tmp_path / "s.yaml", _merge(small_preset(SWE), {"name": name}))
        error_line(run_cli(capsys, "simulate", scenario, "--quiet"), str(scenario), "name", "should match pattern")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


def test_stalled_workload_error_names_the_scenario_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Raised mid-run, where the file is not known: the CLI adds it.
    scenario = write_scenario(tmp_path / "s.yaml", _merge(small_preset(SWE), {"workload": {"system_prompt_tokens": 10**7}}))
    error_line(simulate(capsys, scenario, tmp_path / "out"), f"error: {scenario}: programs finish without taking simulated time")


def test_mooncake_block_sizes_that_do_not_nest_are_a_scenario_error(capsys: pytest.CaptureFixture[str], tmp_path: Path, trace_slice: Path) -> None:
    raw = _merge(small_preset("mooncake-conversation.yaml", trace_slice), {"workload": {"trace_block_size": 500}})
    scenario = write_scenario(tmp_path / "s.yaml", raw)
    error_line(
        simulate(capsys, scenario, tmp_path / "out"),
        str(scenario),
        "cluster.engine.block_size and workload.trace_block_size",
        "block_size 64 must divide trace_block_size 500",
    )
    raw["workload"]["trace_block_size"] = 10**12
    write_scenario(scenario, raw)
    error_line(simulate(capsys, scenario, tmp_path / "out"), str(scenario), "workload.trace_block_size", "less than or equal to 1048576")


# --- trace fuzz ------------------------------------------------------------------------------

JSON_HOSTILE: list[Any] = [
    None,
    True,
    "",
    "x",
    "7",
    "a" * 5000,
    [],
    [[1]],
    {},
    {"a": 1},
    -1,
    0,
    1.5,
    -1e300,
    1e300,
    math.nan,
    math.inf,
    10**30,
    2**64,
    1 << 20,
    (1 << 20) + 1,
]
BAD_IDS: list[Any] = [-1, 1 << 30, 2**64, 1.5, True, "7", None, []]
MOONCAKE_FIELDS = ["timestamp", "input_length", "output_length", "hash_ids", "session_id", "delay"]
DYNAMO_FIELDS = [
    ("schema",),
    ("event_type",),
    ("event_time_unix_ms",),
    ("agent_context",),
    ("agent_context", "session_id"),
    ("agent_context", "parent_session_id"),
    ("request",),
    ("request", "request_id"),
    ("request", "output_tokens"),
    ("request", "request_received_ms"),
    ("request", "total_time_ms"),
    ("request", "replay"),
    ("request", "replay", "trace_block_size"),
    ("request", "replay", "input_length"),
    ("request", "replay", "input_sequence_hashes"),
    ("tool",),
    ("tool", "tool_call_id"),
    ("tool", "started_at_unix_ms"),
    ("tool", "ended_at_unix_ms"),
    ("tool", "duration_ms"),
    ("event",),
]
NOT_UTF8 = [b"\xff", b"\xc3\x28", b"\x80", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]


def _record(line: dict[str, Any]) -> dict[str, Any]:
    return line["event"] if "schema" not in line and isinstance(line.get("event"), dict) else line


def _get(node: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


@st.composite
def corrupt_lines(draw: st.DrawFn, lines: list[bytes], fields: list[tuple[str, ...]], ids_field: tuple[str, ...]) -> tuple[str, int, bytes]:
    """(what was done, the 1-based line changed, the line's new bytes) for one corruption."""
    index = draw(st.sampled_from([i for i, line in enumerate(lines) if line.strip()]))
    line = lines[index]
    op = draw(st.sampled_from(["set", "set", "delete", "id", "truncate", "junk", "bytes", "digits", "deep"]))
    if op in ("set", "delete", "id"):
        whole = json.loads(line)
        record = _record(whole)  # the event itself when the line wraps it
        ids = _get(record, ids_field)
        if op == "id" and isinstance(ids, list) and ids:
            at, bad = draw(st.integers(0, len(ids) - 1)), draw(st.sampled_from(BAD_IDS))
            ids[at] = bad
            return f"{'.'.join(ids_field)}[{at}] = {bad!r}", index + 1, json.dumps(whole).encode()
        path = draw(st.sampled_from(fields))
        parent = _get(record, path[:-1])
        if op == "delete" and isinstance(parent, dict) and path[-1] in parent:
            del parent[path[-1]]
            return f"delete {'.'.join(path)}", index + 1, json.dumps(whole).encode()
        value = draw(st.sampled_from(JSON_HOSTILE))
        _set(record, path, value)
        return f"{'.'.join(path)} = {value!r:.40}", index + 1, json.dumps(whole).encode()
    if op == "truncate":
        at = draw(st.integers(1, len(line) - 1))
        return f"cut at byte {at}", index + 1, line[:at]
    if op == "junk":
        junk = draw(st.binary(min_size=1, max_size=200).filter(lambda b: b"\n" not in b and b.strip()))
        return f"junk {junk!r:.40}", index + 1, junk
    if op == "bytes":
        at, bad = draw(st.integers(0, len(line))), draw(st.sampled_from(NOT_UTF8))
        return f"{bad!r} at byte {at}", index + 1, line[:at] + bad + line[at:]
    if op == "digits":  # a number Python will not convert (the first one of the line)
        return "a 5000-digit number", index + 1, re.sub(rb":\s*-?\d+", b": " + b"9" * 5000, line, count=1)
    return "nested 100,000 deep", index + 1, b"[" * 100_000 + b"]" * 100_000


def _trace_scenario(directory: Path, kind: str, trace: Path) -> Path:
    """A tiny scenario replaying ``trace`` (block size 4 nests with both traces' blocks)."""
    return write_scenario(
        directory / "replay.yaml",
        {
            "name": "replay",
            "duration_s": 30,
            "cluster": {"backends": 2, "engine": {"block_size": 4 if kind == "dynamo_trace" else 16, "kv_blocks": 100_000}},
            "workload": {"kind": kind, "path": str(trace)},
        },
    )


def _check_trace_outcome(result: subprocess.CompletedProcess[str], trace: Path, line: int | None) -> None:
    """Exit 0, or one line naming ``trace`` and, for a line-level problem, ``line`` (any line
    when None: a Dynamo record can conflict with one elsewhere in the file)."""
    event(f"exit {result.returncode}")
    if result.returncode == 0:
        assert result.stderr == ""
        return
    message = error_line(result)
    number = r"\d+" if line is None else str(line)
    assert re.match(rf"error: {re.escape(str(trace))}:{number}: \S", message), message


@settings(FUZZ, max_examples=300)
@given(data=st.data())
def test_fuzzed_mooncake_traces_fail_at_their_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace_slice: Path, data: st.DataObject
) -> None:
    lines = trace_slice.read_bytes().splitlines()
    what, number, changed = data.draw(corrupt_lines(lines, [(field,) for field in MOONCAKE_FIELDS], ("hash_ids",)), label="corruption")
    trace = tmp_path / "corrupt.jsonl"
    trace.write_bytes(b"\n".join(lines[: number - 1] + [changed] + lines[number:]) + b"\n")
    result = simulate(capsys, _trace_scenario(tmp_path, "mooncake_trace", trace), tmp_path / "out")
    # Mooncake lines are checked one by one, so a bad line is reported as itself (a line cut
    # down to blanks is skipped, and the rest is still a valid trace).
    _check_trace_outcome(result, trace, number)


@settings(FUZZ, max_examples=300)
@given(data=st.data())
def test_fuzzed_dynamo_traces_fail_at_a_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, data: st.DataObject) -> None:
    lines = DYNAMO_TRACE.read_bytes().splitlines()
    what, number, changed = data.draw(corrupt_lines(lines, DYNAMO_FIELDS, ("request", "replay", "input_sequence_hashes")), label="corruption")
    trace = tmp_path / "corrupt.jsonl"
    trace.write_bytes(b"\n".join(lines[: number - 1] + [changed] + lines[number:]) + b"\n")
    result = simulate(capsys, _trace_scenario(tmp_path, "dynamo_trace", trace), tmp_path / "out")
    if result.returncode == 2 and ": no request_end records" in result.stderr:  # every request line gone bad
        return
    _check_trace_outcome(result, trace, None)


# --- trace defects, one by one, through every command that reads the trace ---------------------


def _mooncake_line(**changes: Any) -> bytes:
    return json.dumps({"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [0, 1], **changes}).encode()


GOOD_LINE = _mooncake_line()
TRACE_DEFECTS = [  # (bad line 3, the message after "path:3: ")
    (b'{"timestamp": 0, "note": "caf\xe9"}', "invalid UTF-8 at byte 30; expected one JSON object per line"),
    (b'{"timestamp": ' + b"9" * 5000 + b"}", "invalid JSON (a number with too many digits); expected one JSON object per line"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid JSON (nested too deeply); expected one JSON object per line"),
    (_mooncake_line(output_length=10**15), "output_length must be at most 1048576 tokens (got 1000000000000000)"),
    (_mooncake_line(input_length=2**40, hash_ids=[0]), "input_length must be at most 1048576 tokens (got 1099511627776)"),
    # the yardstick of the style: a one-line error naming path, line and field
    (
        b'{"timestamp": 0, "input_length": 600,',
        "invalid JSON (Expecting property name enclosed in double quotes at column 38); expected one JSON object per line",
    ),
    (_mooncake_line(hash_ids=[0, 1 << 30]), "hash_ids must be a list of integers in [0, 2**30) (got element 1073741824)"),
    (_mooncake_line(input_length=-5), "input_length must be a non-negative integer (got -5)"),
]


@pytest.mark.parametrize(("bad", "message"), TRACE_DEFECTS)
def test_mooncake_reader_names_path_and_line(tmp_path: Path, bad: bytes, message: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b"\n".join([GOOD_LINE, b"", bad, GOOD_LINE]) + b"\n")
    with pytest.raises(TraceError) as error:
        read_mooncake(trace, block_size=16)
    assert str(error.value) == f"{trace}:3: {message}"


@pytest.mark.parametrize("command", ["simulate", "compare", "validate"])
@pytest.mark.parametrize(("bad", "message"), [TRACE_DEFECTS[0], TRACE_DEFECTS[3], TRACE_DEFECTS[5]])
def test_every_command_reports_a_bad_trace_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, bad: bytes, message: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b"\n".join([GOOD_LINE, b"", bad, GOOD_LINE]) + b"\n")
    scenario = _trace_scenario(tmp_path, "mooncake_trace", trace)
    args = {
        "simulate": ["simulate", scenario, "--quiet"],
        "compare": ["compare", scenario, "--policies", "round_robin,kv_router", "--jobs", "1"],
        "validate": ["validate", "dynamo", scenario, "--routers", "round_robin", "--repeats", "1"],
    }[command]
    line = error_line(run_cli(capsys, *args, "--out", tmp_path / "out"))
    assert line == f"error: {trace}:3: {message}"


@pytest.mark.parametrize("command", ["simulate", "compare", "validate"])
def test_every_command_reports_a_bad_scenario(capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str) -> None:
    scenario = write_scenario(tmp_path / "s.yaml", _merge(small_preset(SWE), {"seed": -1}))
    args = {
        "simulate": ["simulate", scenario],
        "compare": ["compare", scenario, "--policies", "round_robin"],
        "validate": ["validate", "dynamo", scenario],
    }[command]
    error_line(run_cli(capsys, *args, "--out", tmp_path / "out"), f"error: {scenario}: seed:", "greater than or equal to 0")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"output_tokens": 10**15}, "output_tokens must be at most 1048576 tokens (got 1000000000000000)"),
        (
            {"replay": {"trace_block_size": 10**12, "input_length": 10**12, "input_sequence_hashes": [1]}},
            "trace_block_size must be at most 1048576 tokens (got 1000000000000)",
        ),
    ],
)
def test_dynamo_reader_bounds_token_counts(tmp_path: Path, record: dict[str, Any], message: str) -> None:
    request = {
        "request_id": "a",
        "output_tokens": 1,
        "request_received_ms": 0,
        "replay": {"trace_block_size": 4, "input_length": 4, "input_sequence_hashes": [1]},
        **record,
    }
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps({"schema": "dynamo.request.trace.v1", "event_type": "request_end", "event_time_unix_ms": 10, "request": request}) + "\n"
    )
    with pytest.raises(TraceError) as error:
        read_dynamo_agent_trace(trace, block_size=4)
    assert str(error.value) == f"{trace}:1: {message}"


def test_dynamo_conflicting_parents_are_shown_short(tmp_path: Path) -> None:
    def request(request_id: str, parent: str) -> dict[str, Any]:
        return {
            "schema": "dynamo.request.trace.v1",
            "event_type": "request_end",
            "event_time_unix_ms": 10,
            "agent_context": {"session_id": "s", "parent_session_id": parent},
            "request": {
                "request_id": request_id,
                "output_tokens": 1,
                "request_received_ms": 0,
                "replay": {"trace_block_size": 4, "input_length": 4, "input_sequence_hashes": [1]},
            },
        }

    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(request("a", "p" * 5000)) + "\n" + json.dumps(request("b", "q")) + "\n")
    with pytest.raises(TraceError) as error:
        read_dynamo_agent_trace(trace, block_size=4)
    parent = '"' + "p" * 56 + "..."
    assert str(error.value) == (f'{trace}:2: session "s" has conflicting parent_session_id values {parent}, "q" (expected one parent per session)')


def test_unreadable_trace_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    for reader in (lambda path: read_mooncake(path, 16), lambda path: read_dynamo_agent_trace(path, 4)):
        with pytest.raises(TraceError) as error:
            reader(folder)
        assert str(error.value) == f"{folder}: is a directory (expected a JSONL file)"
    # through a scenario the path is checked as the file is loaded, before any run
    for kind in ("mooncake_trace", "dynamo_trace"):
        scenario = _trace_scenario(tmp_path, kind, folder)
        error_line(simulate(capsys, scenario, tmp_path / "out"), f"error: {scenario}: workload.path: not a file: {folder}")
        scenario = _trace_scenario(tmp_path, kind, tmp_path / "absent.jsonl")
        error_line(simulate(capsys, scenario, tmp_path / "out"), f"error: {scenario}: workload.path: file not found:")
    # a path with a line break, longer than the file system allows, or with a NUL byte
    too_long = ("x" * 5000, "cannot read (File name too long): /", "xxx...")
    nul = ("a\x00b", "not a valid path: 'a\\x00b'")
    for path, *shown in [("a\nb", "file not found: '/", "/a\\nb'"), too_long, nul]:
        raw = yaml.safe_load(_trace_scenario(tmp_path, "mooncake_trace", folder).read_text())
        scenario = write_scenario(tmp_path / "replay.yaml", _merge(raw, {"workload": {"path": path}}))
        error_line(simulate(capsys, scenario, tmp_path / "out"), f"error: {scenario}: workload.path:", *shown)
    for content, message in [(b"", "no requests"), (b"\n \n", "no requests"), (b"\x00\xff\xfe", "invalid UTF-8 at byte 2")]:
        trace = tmp_path / "t.jsonl"
        trace.write_bytes(content)
        result = simulate(capsys, _trace_scenario(tmp_path, "mooncake_trace", trace), tmp_path / "out")
        error_line(result, f"error: {trace}", message)


def test_bad_trace_keeps_earlier_results(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace, out = tmp_path / "t.jsonl", tmp_path / "out"
    trace.write_bytes(b"\n".join([GOOD_LINE, GOOD_LINE]) + b"\n")
    scenario = _trace_scenario(tmp_path, "mooncake_trace", trace)
    assert simulate(capsys, scenario, out).returncode == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    assert {"summary.json", "run.json", "events.jsonl"} <= set(before)
    trace.write_bytes(b"\n".join([GOOD_LINE, _mooncake_line(output_length=10**15)]) + b"\n")
    error_line(simulate(capsys, scenario, out), f"error: {trace}:2: output_length must be at most")
    after = {path.name: path.read_bytes() for path in out.iterdir() if not path.name.endswith(".partial")}
    assert after == before
