# The DAPO Qwen2.5-Math-7B job of ISEEKYAN/verl_megatron_practice dapo7b.csv row 7
# (benchmarks/data/grpo_runs.csv row 62: 8 x H100, actor TP4 PP1, rollout TP1, dynamic batches of
# 20k/60k tokens, parameter and optimizer offload, no KL), written as verl 0.9.1 overrides for the
# advise tests; the run logs beside it are written by tests/fixtures/verl_runs.py.
set -x

python3 -m verl.trainer.main_ppo --config-path=config \
    --config-name='ppo_megatron_trainer.yaml' \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files="$HOME/data/dapo-math-17k.parquet" \
    data.val_files="$HOME/data/aime-2024.parquet" \
    data.train_batch_size=512 \
    data.max_prompt_length=2048 \
    data.max_response_length=8192 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-7B \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=61440 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1 \
    actor_rollout_ref.actor.megatron.param_offload=True \
    actor_rollout_ref.actor.megatron.grad_offload=True \
    actor_rollout_ref.actor.megatron.optimizer_offload=True \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=16 \
    trainer.logger='["console","file"]' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 $@
