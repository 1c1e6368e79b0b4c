"""What the job does: a verl GRPO step's batch and sequence shape.

Defaults follow verl's GRPO Megatron examples
(``examples/grpo_trainer/run_qwen2-7b_math_megatron.sh``:
``data.train_batch_size=1024``, ``ppo_mini_batch_size=256``, ``rollout.n=5``, 1024-token prompts
and responses).  Batch sizes count prompts, as verl's config does; ``rollout_n`` responses are
sampled per prompt, so a step trains on ``train_batch_size * rollout_n`` sequences.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.errors import PlanInputError
from planner.phases import PHASES, Phase

PRECISIONS = ("bf16", "fp16", "fp8")


@dataclass(frozen=True)
class GrpoWorkload:
    train_batch_size: int = 1024  # prompts per step (data.train_batch_size)
    rollout_n: int = 5  # responses per prompt (actor_rollout_ref.rollout.n)
    prompt_length: int = 1024  # data.max_prompt_length (tokens)
    response_length: int = 1024  # data.max_response_length (tokens)
    mini_batch_size: int = 256  # prompts per optimizer step (actor.ppo_mini_batch_size)
    ppo_epochs: int = 1
    precision: str = "bf16"
    use_kl_loss: bool = True  # GRPO's KL to the reference policy needs the reference model
    max_num_seqs: int = 1024  # vLLM concurrency cap per engine (rollout.max_num_seqs)
    # Tokens actually generated per response on average; 0 means half the maximum
    # (timing.DEFAULT_MEAN_RESPONSE_FRACTION).  Time follows it; memory is sized for the maximum.
    mean_response_length: int = 0

    def __post_init__(self) -> None:
        for name in ("train_batch_size", "rollout_n", "prompt_length", "response_length",
                     "mini_batch_size", "ppo_epochs", "max_num_seqs"):
            value = getattr(self, name)
            if value < 1:
                raise PlanInputError(f"--{name.replace('_', '-')} must be a positive integer, "
                                     f"got {value}")
        if self.mini_batch_size > self.train_batch_size:
            raise PlanInputError(
                f"--mini-batch-size {self.mini_batch_size} exceeds --train-batch-size "
                f"{self.train_batch_size}; verl needs train_batch_size >= ppo_mini_batch_size")
        if self.precision not in PRECISIONS:
            raise PlanInputError(f"--precision {self.precision!r} is not one of "
                                 f"{', '.join(PRECISIONS)}")
        if not 0 <= self.mean_response_length <= self.response_length:
            raise PlanInputError(f"--mean-response-length {self.mean_response_length} must be "
                                 f"between 1 and --response-length {self.response_length} "
                                 f"(0: half of it)")

    @property
    def sequence_length(self) -> int:
        """Longest prompt+response sequence: what one sample can cost in memory."""
        return self.prompt_length + self.response_length

    @property
    def sequences_per_step(self) -> int:
        return self.train_batch_size * self.rollout_n

    @property
    def sequences_per_mini_batch(self) -> int:
        return self.mini_batch_size * self.rollout_n

    kind = "grpo"
    phases = PHASES

    @property
    def mean_response_tokens(self) -> int:
        """Tokens generated per response on average (half the maximum when not given)."""
        return self.mean_response_length or self.response_length // 2

    def describe(self) -> str:
        return (f"GRPO: {self.train_batch_size} prompts x n={self.rollout_n}, prompt "
                f"{self.prompt_length} + response {self.response_length} tokens (mean "
                f"{self.mean_response_tokens}), mini-batch {self.mini_batch_size}, "
                f"{self.precision}")

    def to_dict(self) -> dict:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class PretrainWorkload:
    """A plain Megatron training step (``--workload pretrain``): what public measurements
    report, and what the GRPO actor update is made of."""

    seq_len: int = 4096
    global_batch: int = 1024  # sequences per optimizer step
    precision: str = "bf16"

    def __post_init__(self) -> None:
        if self.seq_len < 1 or self.global_batch < 1:
            raise PlanInputError(f"--seq-len {self.seq_len} and --global-batch "
                                 f"{self.global_batch} must be positive integers")
        if self.precision not in PRECISIONS:
            raise PlanInputError(f"--precision {self.precision!r} is not one of "
                                 f"{', '.join(PRECISIONS)}")

    kind = "pretrain"
    phases = (Phase.UPDATE_ACTOR.value,)
    # The same view of the batch the GRPO workload gives the rules and the memory model:
    # one optimizer step over the global batch, no reference model, no rollout.
    rollout_n = 1
    ppo_epochs = 1
    use_kl_loss = False
    max_num_seqs = 1
    mean_response_length = 0

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @property
    def sequence_length(self) -> int:
        return self.seq_len

    @property
    def sequences_per_step(self) -> int:
        return self.global_batch

    @property
    def sequences_per_mini_batch(self) -> int:
        return self.global_batch

    @property
    def train_batch_size(self) -> int:
        return self.global_batch

    @property
    def mini_batch_size(self) -> int:
        return self.global_batch

    def to_dict(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def describe(self) -> str:
        return (f"pretrain: {self.global_batch} sequences x {self.seq_len} tokens per step, "
                f"{self.precision}")
