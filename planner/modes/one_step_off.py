"""``one-step-off``: generation of step k+1 overlaps training of step k on separate pools
(``verl.experimental.one_step_off_policy``); every sample is one parameter version stale, and
each batch waits for its longest response (verl's one-step-off has no partial rollout)."""

from __future__ import annotations

from planner.catalog.workload import GrpoWorkload
from planner.cost.pool_time import overlapped_steady_state
from planner.modes.registry import register
from planner.modes.split import SplitMode
from planner.results import Staleness
from planner.search.layout import Columns
from planner.verl.findings import Finding
from planner.verl.keys import ASYNC_TRAINING, ROLLOUT, get


@register
class OneStepOffMode(SplitMode):
    """Separate pools, one step of overlap: ``max(G, T) + S`` per step."""

    name = "one-step-off"
    summary = ("separate pools, generation of step k+1 overlaps training of step k "
               "(verl.experimental.one_step_off_policy)")

    def steady_state(self, generate: float, train: float, sync: float,
                     workload: GrpoWorkload) -> Columns:
        return overlapped_steady_state(generate, train, sync)

    def staleness(self) -> Staleness:
        return Staleness(max_versions_behind=1, stale_sample_fraction=1.0, off_policy=True)

    def reads_config(self, config: dict) -> bool:
        """The rollout pool's keys without verl's ``async_training`` section."""
        return (not isinstance(config.get(ASYNC_TRAINING), dict)
                and get(config, "rollout.nnodes", None) is not None)

    def mode_findings(self, config: dict) -> list[Finding]:
        if get(config, f"{ROLLOUT}.free_cache_engine", False):
            return [Finding("pools", f"one-step-off syncs parameters into a running engine: set "
                            f"{ROLLOUT}.free_cache_engine=False",
                            (f"{ROLLOUT}.free_cache_engine",))]
        return []
