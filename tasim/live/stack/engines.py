"""Worker command lines for each engine, configured from the scenario's cluster.

``mocker`` (CPU, default): one ``dynamo.mocker`` process per worker, publishing KV events in
vLLM's wire format on its own port; its polynomial step times are divided by the scenario's
``speedup_ratio`` times the live ``time_scale``. A process per worker (rather than the mocker's
``--num-workers``) lets a worker die alone, as a GPU worker does.

``vllm`` / ``sglang`` (GPU hosts): one ``dynamo.vllm`` / ``dynamo.sglang`` process per worker,
pinned to its own GPU, with prefix caching and ZMQ KV events on; their timing is the hardware's,
so ``time_scale`` must be 1.

A scenario's host tier (``cluster.engine.host_tier``) goes to the workers as their own flags: the
mocker's G2 tier (``--num-host-blocks`` and its copy bandwidths), vLLM's native CPU offloading
(the ``OffloadingConnector``). A tier a worker cannot run is refused, never dropped.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from tasim.config.host_sizing import PAGE_BYTES
from tasim.config.scenario import Scenario
from tasim.core.errors import LiveError

# tasim's preemption order → the mocker's flag (vLLM v1 itself always preempts the newest).
PREEMPTION_MODE = {"newest_first": "lifo", "oldest_first": "fifo"}

WorkerCommand = tuple[str, list[str], dict[str, str]]


def worker_commands(
    engine: str, scenario: Scenario, model_path: Path, model_name: str, kv_ports: list[int], time_scale: float
) -> list[WorkerCommand]:
    if engine == "mocker":
        return [_mocker(scenario, model_path, model_name, port, index, time_scale) for index, port in enumerate(kv_ports)]
    if time_scale != 1.0:
        raise ValueError(f"--time-scale must be 1 with --engine {engine}: real engines run in real time")
    if engine == "vllm":
        return [_vllm(scenario, model_path, model_name, port, index) for index, port in enumerate(kv_ports)]
    if engine == "sglang":
        return [_sglang(scenario, model_path, model_name, port, index) for index, port in enumerate(kv_ports)]
    raise ValueError(f"unknown engine {engine!r} (allowed: mocker, vllm, sglang)")


def host_tier_refusal(engine: str, scenario: Scenario) -> str | None:
    """Why ``engine``'s workers cannot run the scenario's host tier as it is modelled, if they cannot."""
    tier = scenario.cluster.engine.host_tier
    if tier is None:
        return None
    if engine == "sglang":
        return (
            f"cluster.engine.host_tier ({tier.semantics} semantics) with --engine sglang: "
            "SGLang's HiCache is not configured from it yet (allowed: --engine mocker or vllm)"
        )
    if engine == "mocker" and tier.store_threshold:
        return (
            f"cluster.engine.host_tier.store_threshold {tier.store_threshold} with --engine mocker: "
            "Dynamo's mocker has no store threshold (allowed: 0)"
        )
    return None


def check_engine(engine: str, scenario: Scenario) -> None:
    """Refuse, before anything starts, an engine this machine cannot run: a real engine needs its
    Python package and ``cluster.backends`` x ``cluster.tp`` CUDA GPUs. Without the check a worker
    fails tens of seconds later with an import error deep in its log."""
    if engine == "mocker":
        return
    needed = scenario.cluster.backends * scenario.cluster.tp
    import torch  # the live extra's; a CPU build sees no GPU

    visible = torch.cuda.device_count()
    if visible < needed:
        raise LiveError(
            f"--engine {engine} needs {needed} CUDA GPUs (cluster.backends {scenario.cluster.backends} x cluster.tp {scenario.cluster.tp}), "
            f"torch {torch.__version__} sees {visible} here; on a CPU machine use --engine mocker"
        )
    if importlib.util.find_spec(engine) is None:
        raise LiveError(f"--engine {engine} needs the {engine} package installed (Dynamo's [{engine}] extra); it is not importable here")


def _mocker(scenario: Scenario, model_path: Path, model_name: str, kv_port: int, index: int, time_scale: float) -> WorkerCommand:
    cluster = scenario.cluster
    engine = cluster.engine
    args = [
        sys.executable,
        "-m",
        "dynamo.mocker",
        "--model-path",
        str(model_path),
        "--model-name",
        model_name,
        "--block-size",
        str(engine.block_size),
        "--num-gpu-blocks-override",
        str(cluster.kv_blocks_per_worker()),
        "--max-num-seqs",
        str(engine.max_num_seqs),
        "--max-num-batched-tokens",
        str(engine.max_num_batched_tokens),
        "--preemption-mode",
        PREEMPTION_MODE[engine.preemption],
        "--speedup-ratio",
        repr(cluster.perf.speedup_ratio * time_scale),
        "--zmq-kv-events-ports",
        str(kv_port),
        "--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching",
        "--enable-chunked-prefill" if engine.enable_chunked_prefill else "--no-enable-chunked-prefill",
        *_mocker_host_tier(scenario, time_scale),
    ]
    return f"worker{index}", args, {}


def _mocker_host_tier(scenario: Scenario, time_scale: float) -> list[str]:
    """The mocker's G2 tier equal to the scenario's: as many host blocks, a rank's share of the
    KV bytes (the simulator's copies move that share), and bandwidths times ``time_scale``. The
    mocker divides its step times by ``--speedup-ratio`` but not its copy times (measured on
    Dynamo 1.6.1's replay: a 838.86 ms load stays 838.86 ms at speedup 10), and the simulator does
    not scale copies by ``speedup_ratio`` either; only live time is compressed."""
    cluster = scenario.cluster
    tier = cluster.engine.host_tier
    if tier is None:
        return []
    return [
        "--num-host-blocks",
        str(cluster.host_blocks_per_worker()),
        "--kv-bytes-per-token",
        str(cluster.kv_bytes_per_token() // cluster.tp),
        "--host-offload-d2h-bandwidth-gbps",
        repr(tier.d2h_gbps * time_scale),
        "--host-offload-h2d-bandwidth-gbps",
        repr(tier.h2d_gbps * time_scale),
    ]


def _own_gpus(scenario: Scenario, index: int) -> dict[str, str]:
    """Worker ``index``'s environment: its own ``cluster.tp`` GPUs."""
    tp = scenario.cluster.tp
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(index * tp + g) for g in range(tp))}


def _kv_events_config(port: int) -> str:
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": ""})


def _vllm(scenario: Scenario, model_path: Path, model_name: str, kv_port: int, index: int) -> WorkerCommand:
    engine = scenario.cluster.engine
    args = [
        sys.executable,
        "-m",
        "dynamo.vllm",
        "--model",
        str(model_path),
        "--served-model-name",
        model_name,
        "--block-size",
        str(engine.block_size),
        "--max-num-seqs",
        str(engine.max_num_seqs),
        "--max-num-batched-tokens",
        str(engine.max_num_batched_tokens),
        "--tensor-parallel-size",
        str(scenario.cluster.tp),
        "--gpu-memory-utilization",
        repr(engine.gpu_memory_utilization),
        "--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching",
        "--kv-events-config",
        _kv_events_config(kv_port),
    ]
    if engine.kv_blocks != "auto":
        args += ["--num-gpu-blocks-override", str(engine.kv_blocks)]
    if engine.host_tier is not None:
        args += ["--kv-transfer-config", json.dumps(_vllm_offloading(scenario))]
    if engine.scheduling_policy == "priority":  # the calls' priorities travel as routing.priority
        args += ["--scheduling-policy", "priority"]
    return f"worker{index}", args, _own_gpus(scenario, index)


def _vllm_offloading(scenario: Scenario) -> dict[str, object]:
    """vLLM 0.31's native CPU offloading with the scenario's host capacity: what
    ``--kv-offloading-size`` sets (vllm/config/vllm.py:1124-1158), in bytes so that a tier sized
    in blocks or by a ratio keeps its exact size, and with the store threshold. Copy bandwidths
    are the hardware's."""
    cluster = scenario.cluster
    tier = cluster.engine.host_tier
    assert tier is not None
    page_rounded_block = -(-cluster.engine.block_size * cluster.kv_bytes_per_token() // PAGE_BYTES) * PAGE_BYTES
    extra: dict[str, object] = {"cpu_bytes_to_use": cluster.host_blocks_per_worker() * page_rounded_block}
    if tier.store_threshold:
        extra["store_threshold"] = tier.store_threshold
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}


def _sglang(scenario: Scenario, model_path: Path, model_name: str, kv_port: int, index: int) -> WorkerCommand:
    engine = scenario.cluster.engine
    args = [
        sys.executable,
        "-m",
        "dynamo.sglang",
        "--model-path",
        str(model_path),
        "--served-model-name",
        model_name,
        "--page-size",
        str(engine.block_size),
        "--tp",
        str(scenario.cluster.tp),
        "--max-running-requests",
        str(engine.max_num_seqs),
        "--chunked-prefill-size",
        str(engine.max_num_batched_tokens),
        "--mem-fraction-static",
        repr(engine.gpu_memory_utilization),
        "--kv-events-config",
        json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kv_port}", "topic": ""}),
    ]
    return f"worker{index}", args, _own_gpus(scenario, index)
