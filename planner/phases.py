"""The phases of one GRPO step in verl's order (``RayPPOTrainer.fit``): the rollout generates
responses, the actor scores them (old log-probabilities), the reference scores them, the actor
updates, and the new weights are synced into the rollout engine."""

from __future__ import annotations

import enum


class Phase(str, enum.Enum):
    GENERATE = "generate"
    OLD_LOG_PROB = "old_log_prob"
    REF = "ref"
    UPDATE_ACTOR = "update_actor"
    WEIGHT_SYNC = "weight_sync"

    def __str__(self) -> str:
        return self.value

    @property
    def is_training(self) -> bool:
        """Phases that run Megatron (not the rollout engine)."""
        return self is not Phase.GENERATE


PHASES: tuple[str, ...] = tuple(phase.value for phase in Phase)
TRAINING_PHASES: tuple[str, ...] = tuple(phase.value for phase in Phase if phase.is_training)
