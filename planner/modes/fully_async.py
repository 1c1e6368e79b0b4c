"""``fully-async``: the rollout pool streams samples to the trainer pool, which syncs the
parameters every ``trigger_parameter_sync_step`` mini-batches
(``verl.experimental.fully_async_policy``); with partial rollout a sequence interrupted by a
sync resumes with the new weights, so no rank waits for the long tail.  The rollouter may run
``staleness_threshold`` of a cycle ahead: samples lag up to ``1 + ceil(threshold)`` versions."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Sequence

import numpy as np

from planner.catalog.workload import GrpoWorkload
from planner.cost.pool_time import StreamingLimits, SyncCycle, streamed_steady_state
from planner.modes.registry import register
from planner.modes.split import SplitMode
from planner.placement import mini_batches_per_step
from planner.results import AsyncTraining, Candidate, Staleness
from planner.search.layout import Columns
from planner.verl.findings import Finding
from planner.verl.keys import ACTOR, ASYNC_TRAINING, get

# verl's fully_async_rollouter (set_max_required_samples): at most len(server_handles) *
# concurrency_multiplier (16) prompts run at once, and no more than required_samples *
# (1 + staleness_threshold) * trigger_parameter_sync_step per parameter version
VERL_PROMPTS_PER_SERVER = 16
REQUIRE_BATCHES = 1  # async_training.require_batches: the planner plans one mini-batch each
# async_training.staleness_threshold values a fully-async study tries: 0 (the rollouter never
# runs ahead of the trainer's sync), verl's default 0.1, and 0.3 / 0.5 (up to half a cycle of
# samples generated ahead: more overlap, older samples); above 1 a sample may lag more than two
# versions, which the study leaves to the user (--staleness-grid).
STALENESS_GRID = (0.0, 0.1, 0.3, 0.5)


@register
class FullyAsyncMode(SplitMode):
    """Separate pools, streaming: mini-batches train as they arrive, a sync every ``k``."""

    name = "fully-async"
    summary = "separate pools, streaming rollout (verl.experimental.fully_async_policy)"
    study_fields = ("trainer_gpus", "staleness_threshold")
    settings_used = ("trainer_gpus", "staleness_threshold", "trigger_parameter_sync_step",
                     "partial_rollout")

    def streaming(self, workload: GrpoWorkload) -> StreamingLimits | None:
        """verl's rollouter's in-flight bounds (:data:`VERL_PROMPTS_PER_SERVER`, the staleness
        bound); without partial rollout each batch waits for its longest response."""
        settings = self.settings
        if not settings.partial_rollout:
            return None
        required = workload.mini_batch_size * REQUIRE_BATCHES
        return StreamingLimits(max_in_flight_prompts=required
                               * (1 + settings.staleness_threshold)
                               * settings.trigger_for(workload),
                               prompts_per_replica=VERL_PROMPTS_PER_SERVER)

    def steady_state(self, generate: float, train: float, sync: float,
                     workload: GrpoWorkload) -> Columns:
        return streamed_steady_state(generate, train, sync, SyncCycle(
            mini_batches_per_step=mini_batches_per_step(workload),
            trigger_parameter_sync_step=self.settings.trigger_for(workload),
            staleness_threshold=self.settings.staleness_threshold))

    def staleness(self) -> Staleness:
        # verl fully_async_rollouter: at most required_samples * (1 + staleness) * trigger
        # samples are generated per parameter version; with partial rollout a sequence may span
        # versions
        threshold = self.settings.staleness_threshold
        return Staleness(max_versions_behind=1 + int(np.ceil(threshold)),
                         stale_sample_fraction=threshold / (1 + threshold), off_policy=True)

    def async_training(self, workload: GrpoWorkload) -> AsyncTraining:
        return AsyncTraining(staleness_threshold=self.settings.staleness_threshold,
                             trigger_parameter_sync_step=self.settings.trigger_for(workload),
                             require_batches=REQUIRE_BATCHES,
                             partial_rollout=self.settings.partial_rollout)

    def settings_lines(self, workload: GrpoWorkload) -> list[str]:
        o = self.settings
        return [f"         staleness_threshold {o.staleness_threshold:g}, parameter sync every "
                f"{o.trigger_for(workload)} mini-batch(es), partial rollout "
                f"{'on' if o.partial_rollout else 'off'}"]

    def study_variants(self, grid: Sequence[float]) -> list["FullyAsyncMode"]:
        return [self.with_settings(replace(self.settings, staleness_threshold=float(value)))
                for value in grid]

    def study_values(self, candidate: Candidate) -> dict:
        return {"trainer_gpus": candidate.placement.trainer_gpus,
                "staleness_threshold": self.settings.staleness_threshold}

    # --- export and reading back -----------------------------------------------------------

    def reads_config(self, config: dict) -> bool:
        """verl's ``async_training`` section."""
        return isinstance(config.get(ASYNC_TRAINING), dict)

    def step_config(self, config: dict) -> dict:
        """``data.train_batch_size`` = what one parameter version trains (fully-async sets it
        to 0 and streams): ``ppo_mini_batch_size x require_batches x
        trigger_parameter_sync_step`` (fully_async_trainer.py)."""
        mini = int(get(config, f"{ACTOR}.ppo_mini_batch_size", 1) or 1)
        require = int(get(config, f"{ASYNC_TRAINING}.require_batches", 1) or 1)
        trigger = int(get(config, f"{ASYNC_TRAINING}.trigger_parameter_sync_step", 1) or 1)
        out = copy.deepcopy(config)
        out.setdefault("data", {})["train_batch_size"] = mini * require * trigger
        return out

    def mode_findings(self, config: dict) -> list[Finding]:
        out = []
        if get(config, "data.train_batch_size", 0) != 0:
            out.append(Finding("pools", f"fully-async streams prompts: data.train_batch_size must "
                               f"be 0 (is {get(config, 'data.train_batch_size', None)}); a step "
                               f"is ppo_mini_batch_size x require_batches x "
                               f"trigger_parameter_sync_step", ("data.train_batch_size",)))
        if get(config, "data.gen_batch_size", 1) != 1:
            out.append(Finding("pools", "fully-async generates one prompt at a time: "
                               "data.gen_batch_size must be 1", ("data.gen_batch_size",)))
        staleness = get(config, f"{ASYNC_TRAINING}.staleness_threshold", 0) or 0
        trigger = get(config, f"{ASYNC_TRAINING}.trigger_parameter_sync_step", 1) or 0
        if staleness < 0:
            out.append(Finding("pools", f"{ASYNC_TRAINING}.staleness_threshold {staleness} must "
                               f"be >= 0", (f"{ASYNC_TRAINING}.staleness_threshold",)))
        if trigger < 1:
            out.append(Finding("pools", f"{ASYNC_TRAINING}.trigger_parameter_sync_step "
                               f"{trigger} must be >= 1",
                               (f"{ASYNC_TRAINING}.trigger_parameter_sync_step",)))
        return out
