"""verl's names, in one place: the release the planner targets, its entry point and root config,
keys older releases had, and the files an export writes.  The config keys the planner reads and
writes are the table of :mod:`planner.verl.keymap` (its section names, ``get`` and the maps
derived from it are re-exported here).  No verl import: the names are data."""

from __future__ import annotations

from planner.results import COLOCATED_MODE
from planner.verl.keymap import (  # noqa: F401 - re-exported
    _MISSING,
    ACTOR,
    ASYNC_TRAINING,
    FULLY_ASYNC_MODE,
    LAUNCH_VARIABLES,
    MEGATRON,
    MODE_CONFIG_KEYS,
    MODEL,
    ONE_STEP_OFF,
    PARALLEL_KEYS,
    REF,
    ROLLOUT,
    TRANSFORMER,
    TRANSFORMER_CONFIG_KEY,
    get,
)
from planner.versions import target_verl_version

VERL_VERSION = target_verl_version()  # the ``verl==`` pin of plan-parallel's ``verl`` extra
ENTRY_MODULE = "verl.trainer.main_ppo"
ENTRY_FILE = "verl/trainer/main_ppo.py"
ROOT_CONFIG = "ppo_trainer"
# Training modes (planner/placement.py): the entry point each runs and the Hydra config it
# composes (its package and root config name).  The asynchronous trainers live under
# verl.experimental and need separate rollout/trainer pools (hybrid_engine off).
MODE_ENTRY = {COLOCATED_MODE: ENTRY_MODULE,
              ONE_STEP_OFF: "verl.experimental.one_step_off_policy.main_ppo",
              FULLY_ASYNC_MODE: "verl.experimental.fully_async_policy.fully_async_main"}
MODE_CONFIG = {COLOCATED_MODE: ("verl.trainer.config", ROOT_CONFIG),
               ONE_STEP_OFF: ("verl.experimental.one_step_off_policy.config",
                                "one_step_off_ppo_trainer"),
               FULLY_ASYNC_MODE: ("verl.experimental.fully_async_policy.config",
                               "fully_async_ppo_trainer")}
# Keys older verl releases had, with what the targeted release says instead (matched on the
# key's end).
RETIRED_KEYS = {
    "megatron.grad_offload": "removed in verl 0.9: param_offload also releases the gradient "
                             "buffers",
    "rollout.update_weights_bucket_megabytes": "moved to actor_rollout_ref.rollout."
                                               "checkpoint_engine.update_weights_bucket_megabytes",
    "use_legacy_worker_impl": "removed in verl 0.9: the engine workers are the only ones",
}

# What an export writes.
SCRIPT_FILE = "run_grpo.sh"
CONFIG_FILE = "grpo.yaml"
PLAN_FILE = "plan.json"
EXPORTED_FILES = (SCRIPT_FILE, CONFIG_FILE, PLAN_FILE)

PATH_VARIABLES = ("MODEL_PATH", "TRAIN_FILES", "VAL_FILES")  # the launch variables that are paths
