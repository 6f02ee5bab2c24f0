# Two commands matter: `make demo` and `make test`. Both install into .venv first if needed:
# the demo only the simulator and tune (CORE, about a minute with its compiled core), the tests everything.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CORE   := $(VENV)/.core-installed
STAMP  := $(VENV)/.installed
NATIVE := build/native/manifest.json

.PHONY: install demo test test-fast lint bench baseline validation vllm-validation reliability peers paper-shapes published calibration-records reference-hashes reference-docs docs clean

install: $(STAMP) $(NATIVE)

# The policy host, the simulation, its clock, the engine, its block pool, folded runs, perf
# models and the KV router's indexes and cost compiled with mypyc (tasim/native: MODULES),
# rebuilt when they change; without a C compiler the build records why and the plain modules run.
$(NATIVE): $(CORE) $(wildcard tasim/native/*.py) tasim/hosting/policy_host.py $(wildcard tasim/sim/*.py) $(wildcard tasim/sim/engine/*.py) $(wildcard tasim/sim/perf/*.py) tasim/policies/prefix_index.py tasim/policies/booked_blocks.py tasim/policies/worker_cost.py
	$(BIN)/python -m tasim.native

# ai-dynamo 1.6.1 declares a dependency on `aisimulate`, a placeholder wheel that downloads from a
# host outside the package registries; it is not needed for the mocker, the frontend or replay.
# So the two Dynamo wheels go in with --no-deps and their real dependencies come from the
# `live` extra in pyproject.toml. torch is pinned to the CPU wheel (a bare `torch` pulls CUDA).
# vLLM 0.31.0 (what Dynamo 1.6.1's [vllm] extra pins) is the oracle of `validate vllm`: only its
# scheduler runs, so it goes in with --no-deps (its own dependencies would pull CUDA torch and
# triton), with the three grammar wheels its imports need at the versions it pins, and the rest
# of what its scheduler imports comes from the `oracle` extra.
$(CORE): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "tasim needs Python >= 3.11")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[native,calibrate]'
	touch $@

$(STAMP): $(CORE)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps ai-dynamo-runtime==1.6.1 ai-dynamo==1.6.1
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps vllm==0.31.0 xgrammar==0.2.7 llguidance==1.7.6 apache-tvm-ffi==0.1.11
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[live,oracle,calibrate,test,lint,native,docs]'
	touch $@

# The README's first quickstart command (tests/test_readme.py holds them to each other).
demo: $(CORE) $(NATIVE)
	$(BIN)/python -m tasim compare swe-agent-2x --policies round_robin,kv_router,thunderagent --seeds 3 --set workload.concurrency=96
	@echo "next, its knobs: python -m tasim tune swe-agent-2x --policy thunderagent --set workload.concurrency=96 --space policy.params.scheduler_interval_s=1:20:log --space 'policy.params.admission_order=smallest_first|fifo' --objective calls_per_min --trials 8 (then live: README.md, Quickstart)"

# The whole suite, as CI runs it, with the slowest tests named at the end: the tests that start
# no real process on both cores, then those that do (Dynamo stacks, Ray, vLLM's scheduler, the
# CLI under signals) one at a time, since they bind ports and hold live-vs-simulated tolerances.
test: install
	$(BIN)/python -m pytest -n 2 -m "not processes" --durations=15
	$(BIN)/python -m pytest -m processes --durations=15

# The developer's loop: everything but the tests that start real processes or run long, on both
# cores (about two minutes on 2 cores).
test-fast: install
	$(BIN)/python -m pytest -n 2 -m "not processes and not slow" --durations=15

# ruff (lint rules and formatting, configured in pyproject.toml), mypy (strict where simulation
# and live mode share code: tasim/policies, tasim/sim, the policy hosts) and import-linter (the
# layers and no import cycles: [tool.importlinter] in pyproject.toml).
lint: install
	$(BIN)/ruff check tasim tests benchmarks lab
	$(BIN)/ruff format --check tasim tests benchmarks lab
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: install
	$(BIN)/python -m pytest benchmarks --benchmark-only --benchmark-columns=mean,stddev,rounds

# Record the policy regression suite's current metrics as the baseline `make bench` checks.
baseline: install
	$(BIN)/python -m lab.regression --update

# Load held, faults injected and outcomes: rewrites the table in docs/results/reliability.md (~4 min).
reliability: install
	$(BIN)/python -m lab.reliability

# tasim's ThunderAgent against Dynamo 1.6.1's Rust one, live (proxy and pin) and simulated, three
# seeds each, on live-mocker and a four-times larger variant: rewrites docs/results/peers.md (~25 min).
peers: install
	$(BIN)/python -m lab.peers scenarios/live-mocker.yaml --doc docs/results/peers.md --section live-mocker
	$(BIN)/python -m lab.peers scenarios/live-mocker.yaml $(PEERS_LARGER) --doc docs/results/peers.md --section larger

PEERS_LARGER := --set workload.programs=96 --set workload.concurrency=48 --set cluster.engine.kv_blocks=320

# Cross-validation against Dynamo's replay: rewrites the matrix in docs/results/validation.md (~20 min).
validation: install
	$(BIN)/python -m lab.dynamo_matrix --json runs/validation-matrix.json

# tasim's engine against vLLM's own scheduler: rewrites the vLLM matrix in docs/results/validation.md (~2 min).
vllm-validation: install
	$(BIN)/python -m lab.vllm_matrix

# tasim against the ThunderAgent paper's curves: rewrites the paper-shapes section of
# docs/results/validation.md and docs/results/paper-shapes/*.png (40 runs, ~12 min on 2 idle cores).
paper-shapes: install
	$(BIN)/python -m lab.paper_shapes

# tasim against every published measurement (measurements/*.yaml): rewrites section 4 of
# docs/results/validation.md and docs/results/published/*.png, with the committed records of earlier tasim
# (measurements/baseline-*.json) as columns (51 runs, ~8 min on 2 idle cores); the host-tier file has a
# page of its own, docs/results/host-tier.md (6 runs, ~1.5 min).
published: install
	$(BIN)/python -m tasim validate published $(filter-out measurements/host-tier.yaml,$(sort $(wildcard measurements/*.yaml))) \
		$(foreach record,$(sort $(wildcard measurements/baseline-*.json)),--before $(record)) --doc docs/results/validation.md
	$(BIN)/python -m tasim validate published measurements/host-tier.yaml --out runs/published-host-tier --doc docs/results/host-tier.md

# The committed calibration records (measurements/calibrations/), one section each, in the order
# the calibration prose of docs/results/validation.md tells them: rewrites docs/results/calibration-records.md (seconds).
CALIBRATIONS := $(foreach name,rl-rollout-verl-recipe-1 rl-rollout-verl-recipe-2 rl-rollout-verl-recipe-3 \
	swe-agent-thunderagent-paper-1 swe-agent-thunderagent-paper-2 swe-agent-thunderagent-paper-3 swe-agent-thunderagent-paper-4 \
	openhands-thunderagent-paper-1 openhands-thunderagent-paper-2 swe-agent-qwen3-235b-thunderagent-paper-1 \
	swe-agent-qwen3-235b-thunderagent-paper-2 scienceagent-thunderagent-paper-1 toolorchestra-thunderagent-paper-1 \
	toolorchestra-thunderagent-paper-2,measurements/calibrations/$(name).json)

calibration-records: install
	$(BIN)/python -m lab.calibration_doc $(CALIBRATIONS)

# The reference pages of the documentation (docs/reference: the CLI, the scenario file, the
# policies and the summary keys), generated from the code; tests/lab/test_reference_docs.py fails
# while they are not current.
reference-docs: install
	$(BIN)/python -m lab.reference_docs

# The documentation site (mkdocs.yml), strict: a broken link, a missing anchor or a page left out of
# the navigation fails the build. Open build/site/index.html, or serve it with `$(BIN)/mkdocs serve`.
docs: install
	$(BIN)/mkdocs build --strict --site-dir build/site

# The event logs of a reference set of simulations (every regression case, every preset for 300 s,
# the Mooncake replays in full, tasim's side of a few `validate dynamo` replays) against their
# digests in lab/reference_hashes.json: a change meant to leave behaviour alone keeps them all.
# After an intended change in behaviour: $(BIN)/python -m lab.reference_hashes --update.
reference-hashes: install
	$(BIN)/python -m lab.reference_hashes

clean:
	rm -rf $(VENV) build runs .pytest_cache .benchmarks .mypy_cache .ruff_cache
