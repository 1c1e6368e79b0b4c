#!/usr/bin/env bash
# GRPO with verl 0.9.1 (Megatron backend): Llama-3.1-70B on 32 x H100-80GB (4 node(s) x 8 GPUs)
# Planned by plan-parallel 0.1.0 (layout rank 1); plan.json holds the layout and every prediction.
# Workload:  GRPO: 1024 prompts x n=5, prompt 1024 + response 1024 tokens (mean 483->717 over the run), mini-batch 256, bf16
# Actor:     TP4 PP4 VPP1 CP1 EP1 ETP1 DP2, dynamic batch 4096 tokens/GPU (log-prob 4096), recompute none, offload -, CPU optimizer 100%, layers per stage 20/20/../20
# Reference: the actor's parallel sizes, param offload no
# Rollout:   vLLM TP8 DP1 EP1 (4 replica(s) of 8 GPUs), gpu_memory_utilization 0.40
# Predicted: peak 67.28 GiB of 79.6 GiB (84%) in generate; step 535.5 s, 485 tokens/s/GPU
#
# Usage: MODEL_PATH=... TRAIN_FILES=... VAL_FILES=... bash run_grpo.sh [key=value ...]
#   Extra arguments are Hydra overrides appended to the command (the last one wins).
#   Multi-node: start a Ray cluster first (`ray start --head` on the head node, `ray start
#   --address=HEAD:6379` on the others) and run this script on the head node.
# Check before launching: plan-parallel validate run_grpo.sh --gpu-type H100-80GB
set -xeuo pipefail

MODEL_PATH="${MODEL_PATH:-$HOME/models/Llama-3.1-70B}"
TRAIN_FILES="${TRAIN_FILES:-$HOME/data/gsm8k/train.parquet}"
VAL_FILES="${VAL_FILES:-$HOME/data/gsm8k/test.parquet}"
NNODES="${NNODES:-4}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"

# Megatron overlaps TP/SP communication with compute only with one CUDA connection (verl sets it too on Hopper/Ampere)
export CUDA_DEVICE_MAX_CONNECTIONS=1
# NVLink SHARP buffers take GPU memory that the actor and vLLM share
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
# free NCCL tensors when the collective ends, not when the stream next syncs
export TORCH_NCCL_AVOID_RECORD_STREAMS=1
# full stack traces from Hydra
export HYDRA_FULL_ERROR=1

# Each path below reaches Hydra as key='PATH': any character but a single quote (or a final
# backslash) passes as it is; a list of data files goes as an argument, data.train_files=[a,b]
for path in "$MODEL_PATH" "$TRAIN_FILES" "$VAL_FILES"; do
  case "$path" in
    *\'* | *\\) echo "run_grpo.sh: path '$path' holds a single quote or ends with a backslash, which Hydra's override parser cannot take inside '...'; rename it or link it from a plain path" >&2; exit 2 ;;
  esac
done

python3 -m verl.trainer.main_ppo \
    model_engine=megatron \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    "data.train_files='${TRAIN_FILES}'" \
    "data.val_files='${VAL_FILES}'" \
    data.train_batch_size=1024 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    "actor_rollout_ref.model.path='${MODEL_PATH}'" \
    actor_rollout_ref.model.use_fused_kernels=False \
    actor_rollout_ref.actor.optim.lr=1e-06 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096 \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=4096 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.ppo_epochs=1 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=4 \
    actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=null \
    actor_rollout_ref.actor.megatron.context_parallel_size=1 \
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=1 \
    actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1 \
    actor_rollout_ref.actor.megatron.sequence_parallel=True \
    actor_rollout_ref.actor.megatron.use_distributed_optimizer=True \
    actor_rollout_ref.actor.megatron.param_offload=False \
    actor_rollout_ref.actor.megatron.optimizer_offload=False \
    actor_rollout_ref.actor.optim.use_precision_aware_optimizer=True \
    +actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True \
    +actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=1.0 \
    +actor_rollout_ref.actor.optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=True \
    actor_rollout_ref.ref.megatron.param_offload=False \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=8 \
    actor_rollout_ref.rollout.data_parallel_size=1 \
    actor_rollout_ref.rollout.expert_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.max_num_seqs=256 \
    actor_rollout_ref.rollout.max_num_batched_tokens=8192 \
    actor_rollout_ref.rollout.enable_chunked_prefill=True \
    actor_rollout_ref.rollout.enable_prefix_caching=True \
    actor_rollout_ref.rollout.enforce_eager=False \
    actor_rollout_ref.rollout.free_cache_engine=True \
    trainer.critic_warmup=0 \
    'trainer.logger=[console]' \
    trainer.project_name=verl_grpo \
    trainer.experiment_name=Llama-3.1-70B_32xH100-80GB \
    trainer.n_gpus_per_node="${GPUS_PER_NODE}" \
    trainer.nnodes="${NNODES}" \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 \
    "$@"
