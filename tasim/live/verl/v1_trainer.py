"""``workload.mode: colocate_async`` live: verl 0.9.1's own V1 trainer, `PPOTrainerColocateAsync`.

What runs is verl's, as it ships:
- the trainer's ``fit`` loop and hook order: warm-up batches ahead, then per step a batch
  submitted, the replay buffer sampled, ``on_sample_end`` (abort, sleep), training,
  ``on_step_end`` (push the weights, resume);
- its replay buffer on TransferQueue: a step takes whole GRPO groups, the oldest first, and
  accounts their off-policy span from the weight versions their calls were served by;
- `AgentLoopManagerTQ` and its Ray workers, running the ``tasim_agent`` loop per sample;
- the partial-rollout client (`PartialRolloutDynamoClient`), which sends a call the sync cut
  again with its output so far.

What stands in, because this machine has no GPU and the mocker holds no weights:
- the model work of a step (old log-probs, advantages, the actor's update) is the scenario's
  training time, waited out (divided by the time scale) between ``training_started`` and
  ``training_finished`` marks at the router;
- the checkpoint engine is `RouterWeightSync`: its abort begins a weight sync with abort at the
  router, its sleep empties the workers' prefix caches, its weight push waits the scenario's
  ``weight_sync_s``, and its resume ends the sync (the workers then serve the new version,
  which the router reports with every call);
- rewards are not scored: the mocker's tokens mean nothing, and no reward reaches the router.

The dataset is the scenario's prompt groups in the order the simulator submits them
(`colocate_async_submissions`), one row per group carrying its samples' plans; verl's
``rollout.n`` samples of a row take the plans in session order. Step ``s`` of the simulator is
verl's global step ``s + 1``; weight version ``v`` is the one pushed after global step ``v``.
For each group a step trains on, the router logs ``group_sampled`` with the versions verl's tags
hold, so the live summary has the same staleness figures as a simulated run.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tasim.config.scenario import RolloutWorkload
from tasim.core.determinism import training_rng
from tasim.live.stack.launcher import LiveStack

SETTLE_POLL_S = 0.2


@dataclass
class SampledGroup:
    """A group a trainer step took from verl's replay buffer, with the weight versions (verl's
    ``min_global_steps`` / ``max_global_steps`` tags) its samples' calls were served by."""

    step: int
    group: str
    min_version: int
    max_version: int


class RouterWeightSync:
    """What verl's `CheckpointEngineManager` does for the colocated trainer, done at the router.

    verl calls ``abort_replicas`` and ``sleep_replicas`` when a step has its samples, then
    ``update_weights(global_steps)`` and ``resume_generation_replicas`` when it has trained."""

    def __init__(self, stack: LiveStack, workload: RolloutWorkload, seed: int, time_scale: float) -> None:
        self.stack = stack
        self.workload = workload
        self.time_scale = time_scale
        self.rng = training_rng(seed)  # a step draws its training time, then its push time, as simulated
        self.version = 0  # the weight version the workers serve
        self.syncing: int | None = None  # the version a sync begun at an abort is pushing
        self.began: list[dict[str, Any]] = []  # the router's begin replies
        self.cache_resets: list[dict[str, Any]] = []

    def abort_replicas(self) -> None:
        """Every call streaming is cut (verl's client sends it again after the sync); new ones wait."""
        self.syncing = self.version + 1
        self.began.append(self.stack.begin_weight_sync(self.syncing, abort=True))

    def sleep_replicas(self) -> None:
        """Sleeping discards the engines' weights and KV: the prefix caches empty."""
        self.cache_resets.append(self.stack.clear_caches())

    def update_weights(self, global_steps: int) -> None:
        """The trained weights of ``global_steps`` reach the engines. At start-up (no sync
        begun) the engines already serve the initial weights: nothing to push."""
        if self.syncing is None:
            return
        if global_steps != self.syncing:
            raise RuntimeError(f"verl pushes the weights of step {global_steps} during the sync to version {self.syncing}")
        time.sleep(self.workload.weight_sync_s.sample(self.rng) / self.time_scale)

    def resume_generation_replicas(self) -> None:
        if self.syncing is None:
            return
        self.stack.end_weight_sync(self.syncing)
        self.version, self.syncing = self.syncing, None


def trainer_class() -> type:
    """`PPOTrainerColocateAsync` with the stand-ins above (made on call: verl is optional)."""
    import numpy as np
    import transfer_queue as tq
    from tensordict import TensorDict
    from torchdata.stateful_dataloader import StatefulDataLoader
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.rl_dataset import collate_fn

    class TasimColocateAsyncTrainer(PPOTrainerColocateAsync):
        def __init__(self, config: Any, rows: list[dict[str, Any]], client: Any, weights: RouterWeightSync, stack: LiveStack) -> None:
            super().__init__(config)
            self.rows = rows
            self.client = client
            self.weights = weights
            self.checkpoint_manager = weights  # type: ignore[assignment]  # verl calls the four methods it has
            self.stack = stack
            self.workload = weights.workload
            self.group_of_uid: dict[str, str] = {}
            self.sampled: list[SampledGroup] = []
            self.step_timings_s: list[dict[str, float]] = []

        # -- set-up: no worker groups, no servers, no reward workers --------------------------

        def _setup(self) -> None:
            self._init_tokenizer()
            self.train_dataloader = StatefulDataLoader(dataset=self.rows, batch_size=1, shuffle=False, drop_last=True, collate_fn=collate_fn)
            self.train_dataloader_it = None
            self.steps_per_epoch = len(self.rows) // self.config.data.train_batch_size
            self.total_training_steps = self.workload.steps
            self._init_dump_executor()
            self.reward_loop_manager = _Unscored()  # type: ignore[assignment]  # verl reads its handles only
            self.teacher_model_manager = None  # type: ignore[assignment]  # as verl's own _setup sets it without a teacher
            self.global_steps = 0

        def get_llm_client(self) -> Any:
            return self.client

        def warm_up(self, manager: Any, rows: list[dict[str, Any]]) -> None:
            """verl's agent-loop workers set themselves up on their first groups (seconds): run
            one call-less group on each through the validation partition, as verl's own
            validation submits, so that the run's clock starts with them ready."""
            batch_dict = collate_fn(rows)
            batch_dict["uid"] = np.array([f"warm-up-{i}" for i in range(len(rows))], dtype=object)
            batch = tu.get_tensordict(batch_dict)
            tu.assign_non_tensor_data(batch, "global_steps", self.global_steps)
            tu.assign_non_tensor_data(batch, "validate", True)
            tags = [{"is_prompt": True, "status": "pending", "global_steps": self.global_steps} for _ in rows]
            tq.kv_batch_put(keys=list(batch["uid"]), partition_id="val", tags=tags)
            manager.generate_sequences(batch)
            done, _ = self.replay_buffer.sample(global_steps=self.global_steps, partition_id="val", batch_size=len(rows))
            tq.kv_clear(keys=done.keys, partition_id="val")

        # -- rollout: the router hears of each step's submissions and of each group by name ---

        def on_train_begin(self) -> None:
            # The simulator's step 0 submits its batch and the warm-up batches ahead at once;
            # verl submits the warm-up here and the step's batch in its first prepare_step.
            self._mark_rollout(1 + self.config.trainer.v1.colocate_async.num_warmup_batches)
            super().on_train_begin()

        def prepare_step(self) -> dict[str, Any]:
            if self.global_steps > 1:
                self._mark_rollout(1)
            prepared: dict[str, Any] = super().prepare_step()
            return prepared

        def _mark_rollout(self, batches: int) -> None:
            trajectories = batches * self.config.data.train_batch_size * self.config.actor_rollout_ref.rollout.n
            self.stack.mark("rollout_started", step=self.global_steps - 1, trajectories=trajectories)

        def _submit_batch_to_rollout(self, batch: TensorDict) -> int:
            for uid, extra in zip(batch["uid"], batch["extra_info"], strict=True):
                self.group_of_uid[uid] = extra["tasim"]["group"]
            submitted: int = super()._submit_batch_to_rollout(batch)
            return submitted

        # -- training: the model work is the scenario's training time -------------------------

        def _compute_reward_colocate(self, batch: KVBatchMeta, metrics: dict[str, Any] | None = None) -> KVBatchMeta:
            return batch

        def _balance_batch(self, batch: KVBatchMeta, metrics: dict[str, Any], logging_prefix: str = "", keep_minibatch: bool = False) -> KVBatchMeta:
            return batch

        def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict[str, Any]) -> KVBatchMeta:
            return batch

        def _compute_advantage(self, batch: KVBatchMeta, metrics: dict[str, Any]) -> KVBatchMeta:
            return batch

        def _update_actor(self, batch: KVBatchMeta, metrics: dict[str, Any]) -> KVBatchMeta:
            step = self.global_steps - 1
            self._mark_sampled(batch, step)
            self.stack.mark("training_started", step=step)
            time.sleep(self.workload.training_s.sample(self.weights.rng) / self.weights.time_scale)
            self.stack.mark("training_finished", step=step)
            return batch

        def _mark_sampled(self, batch: KVBatchMeta, step: int) -> None:
            versions: dict[str, tuple[int, int]] = {}
            for key, tag in zip(batch.keys, batch.tags, strict=True):
                group = self.group_of_uid[key.rsplit("_", 2)[0]]
                low, high = int(tag["min_global_steps"]), int(tag["max_global_steps"])
                if group in versions:
                    low, high = min(low, versions[group][0]), max(high, versions[group][1])
                versions[group] = (low, high)
            for group, (low, high) in sorted(versions.items()):
                self.stack.mark_group_sampled(step, group, low, high)
                self.sampled.append(SampledGroup(step, group, low, high))

        def _compute_metrics(self, batch: KVBatchMeta, metrics: dict[str, Any], timing_raw: dict[str, float], global_steps: int, epoch: int) -> None:
            # verl's own metrics read the rewards, values and advantages no model computed here;
            # its staleness figures are the router's (group_sampled), and its timings are kept.
            self.step_timings_s.append(dict(timing_raw))

    return TasimColocateAsyncTrainer


class _Unscored:
    """verl's reward loop manager without reward workers (``None``): nothing is scored."""

    reward_loop_worker_handles = None


def settle(stack: LiveStack, prompts: Iterable[str], timeout_s: float) -> None:
    """Wait for the groups still running when the last step trained (the batches ahead): until
    verl's TransferQueue has none of ``prompts`` pending or running (a group is marked finished
    once its samples' loops, program releases included, are done) and the router has no call in
    flight and no program open."""
    import transfer_queue as tq

    deadline = time.monotonic() + timeout_s
    while True:
        tags = tq.kv_list(partition_id="train").get("train", {})
        running = [uid for uid in prompts if tags.get(uid, {}).get("status") in ("pending", "running")]
        status = stack.status()
        if not running and status["requests"]["in_flight"] == 0 and not status["programs"]["table"]:
            return
        if time.monotonic() > deadline:
            live = status["programs"]["live"]
            raise TimeoutError(f"the rollout did not settle in {timeout_s:.0f} s: {len(running)} groups running, {live} programs live")
        time.sleep(SETTLE_POLL_S)


def v1_overrides(workload: RolloutWorkload) -> list[str]:
    """verl's V1 config for the colocated asynchronous trainer, from the scenario."""
    span = "null" if workload.max_off_policy_span is None else str(workload.max_off_policy_span)
    return [
        "trainer.v1.trainer_mode=colocate_async",
        f"trainer.v1.colocate_async.num_warmup_batches={workload.warmup_batches}",
        f"trainer.v1.sampler.max_off_policy_threshold={span}",
        f"data.train_batch_size={workload.prompts_per_step}",
        "data.gen_batch_size=1",  # what verl's async trainers set
        f"actor_rollout_ref.rollout.n={workload.samples_per_prompt}",
        "algorithm.adv_estimator=grpo",  # GRPO: no critic
        f"trainer.total_training_steps={workload.steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[]",
        # one storage unit: the run's groups fit, and every unit is a Ray actor on 2 cores
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]


@dataclass
class V1Result:
    trainer: Any
    weights: RouterWeightSync


def run_colocate_async(
    config: Any,
    rows: list[dict[str, Any]],
    warm_up_rows: list[dict[str, Any]],
    stack: LiveStack,
    workload: RolloutWorkload,
    seed: int,
    time_scale: float,
    settle_timeout_s: float,
) -> V1Result:
    """Run verl's colocated asynchronous trainer on ``rows`` (Ray is up) until its last step,
    then until the groups it submitted ahead have finished at the router; ``warm_up_rows``
    (call-less, one per agent-loop worker) go first, before the run's clock starts."""
    import transfer_queue as tq
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ

    from tasim.live.verl.client import PartialRolloutDynamoClient

    tq.init(config.transfer_queue)
    try:
        weights = RouterWeightSync(stack, workload, seed, time_scale)
        client = PartialRolloutDynamoClient(config, stack.base_url, stack.model_name)
        trainer = trainer_class()(config, rows, client, weights, stack)
        trainer.init()
        # wired as verl's TaskRunnerV1 wires it
        manager = AgentLoopManagerTQ.create(
            config=config,
            llm_client=trainer.get_llm_client(),
            teacher_client=trainer.get_teacher_client(),
            reward_loop_worker_handles=trainer.get_reward_handles(),
        )
        trainer.warm_up(manager, warm_up_rows)
        stack.begin_run()
        trainer.fit(manager)
        settle(stack, trainer.group_of_uid, settle_timeout_s)
    finally:
        tq.close()
    return V1Result(trainer, weights)
