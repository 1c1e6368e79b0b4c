"""verl's names, in one place: the release the planner targets, its entry point and root config,
the config keys the planner reads and writes, keys older releases had, and the files an export
writes.  No verl import: the names are data."""

from __future__ import annotations

from typing import Any

from planner.versions import target_verl_version

VERL_VERSION = target_verl_version()  # the ``verl==`` pin of plan-parallel's ``verl`` extra
ENTRY_MODULE = "verl.trainer.main_ppo"
ENTRY_FILE = "verl/trainer/main_ppo.py"
ROOT_CONFIG = "ppo_trainer"
# Training modes (planner/placement.py): the entry point each runs and the Hydra config it
# composes (its package and root config name).  The asynchronous trainers live under
# verl.experimental and need separate rollout/trainer pools (hybrid_engine off).
MODE_ENTRY = {"sync": ENTRY_MODULE,
              "one-step-off": "verl.experimental.one_step_off_policy.main_ppo",
              "fully-async": "verl.experimental.fully_async_policy.fully_async_main"}
MODE_CONFIG = {"sync": ("verl.trainer.config", ROOT_CONFIG),
               "one-step-off": ("verl.experimental.one_step_off_policy.config",
                                "one_step_off_ppo_trainer"),
               "fully-async": ("verl.experimental.fully_async_policy.config",
                               "fully_async_ppo_trainer")}
ASYNC_TRAINING = "async_training"
# What each asynchronous mode's root config sets on top of ppo_trainer (verl 0.9.1's
# one_step_off_ppo_trainer.yaml / fully_async_ppo_trainer.yaml).  An exported grpo.yaml cannot
# take those files as defaults (they set hydra.searchpath, which Hydra allows only in the
# primary config), so it carries these keys itself.
MODE_CONFIG_KEYS = {
    "one-step-off": {
        "actor_rollout_ref.rollout.free_cache_engine": False,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl",
        "algorithm.rollout_correction.bypass_mode": True,
        "rollout.nnodes": 1, "rollout.n_gpus_per_node": 8},
    "fully-async": {
        "actor_rollout_ref.actor.use_rollout_log_probs": True,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl",
        "actor_rollout_ref.rollout.standalone_gpu_memory_utilization": None,
        "actor_rollout_ref.model.use_remove_padding": True,
        "data.gen_batch_size": 1,
        "algorithm.rollout_correction.bypass_mode": True,
        f"{ASYNC_TRAINING}.staleness_threshold": 0.1,
        f"{ASYNC_TRAINING}.trigger_parameter_sync_step": 4,
        f"{ASYNC_TRAINING}.require_batches": 1,
        f"{ASYNC_TRAINING}.partial_rollout": True,
        f"{ASYNC_TRAINING}.use_trainer_do_validate": False,
        f"{ASYNC_TRAINING}.use_dynamic_resource_scheduling": False,
        f"{ASYNC_TRAINING}.dynamic_schedule_policy": "default",
        f"{ASYNC_TRAINING}.dynamic_schedule_deactivate_ratio": 0.3,
        f"{ASYNC_TRAINING}.dynamic_schedule_enable_rebalance": True,
        f"{ASYNC_TRAINING}.concurrent_samples_per_replica": 16,
        "rollout.nnodes": 1, "rollout.n_gpus_per_node": 8, "rollout.n": 4,
        "rollout.total_rollout_steps": 100},
}

ACTOR = "actor_rollout_ref.actor"
MEGATRON = f"{ACTOR}.megatron"
TRANSFORMER_CONFIG_KEY = "override_transformer_config"
TRANSFORMER = f"{MEGATRON}.{TRANSFORMER_CONFIG_KEY}"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
MODEL = "actor_rollout_ref.model"
# planner layout field -> key under ``actor_rollout_ref.actor.megatron``
PARALLEL_KEYS = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
                 "vpp": "virtual_pipeline_model_parallel_size", "cp": "context_parallel_size",
                 "ep": "expert_model_parallel_size", "etp": "expert_tensor_parallel_size"}

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

# What a user supplies at launch: (environment variable, override key).  The script reads each
# from the environment with the planned value as default; the YAML through ${oc.env:...}.
LAUNCH_VARIABLES = (
    ("MODEL_PATH", f"{MODEL}.path"),
    ("TRAIN_FILES", "data.train_files"),
    ("VAL_FILES", "data.val_files"),
    ("NNODES", "trainer.nnodes"),
    ("GPUS_PER_NODE", "trainer.n_gpus_per_node"),
)
PATH_VARIABLES = ("MODEL_PATH", "TRAIN_FILES", "VAL_FILES")

_MISSING = object()


def get(config: dict, key: str, default: Any = _MISSING) -> Any:
    """The value at a dotted ``key`` of a plain config dict, ``default`` when absent."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node
