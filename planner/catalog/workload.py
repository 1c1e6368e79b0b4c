"""What the job does: a verl GRPO step's batch and sequence shape, and the job settings the
search does not choose (algorithm switches, kernel and rollout-engine settings) -- or a plain
Megatron training step.  Both implement :class:`Workload`, the one view of a step the search
space, the cost model and the outputs read; nothing outside this module asks which kind a
workload is.

Defaults follow verl's GRPO Megatron examples
(``examples/grpo_trainer/run_qwen2-7b_math_megatron.sh``:
``data.train_batch_size=1024``, ``ppo_mini_batch_size=256``, ``rollout.n=5``, 1024-token prompts
and responses, ``use_kl_loss=True``) and verl 0.9.1's config defaults for everything those
scripts leave unset (``rollout.yaml``: ``max_num_seqs 256``, ``max_num_batched_tokens 8192``,
CUDA graphs on, ``free_cache_engine``, prefix caching; ``model.use_fused_kernels False``;
``grad_reduce_in_fp32`` True unless the precision-aware optimizer keeps lower-precision grads,
``workers/engine/megatron/transformer_impl.py``).  Batch sizes count prompts, as verl's config
does; ``rollout_n`` responses are sampled per prompt, so a step trains on
``train_batch_size * rollout_n`` sequences.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

from planner.bounds import MAX_BATCH, MAX_TOKENS, check_number
from planner.catalog.lengths import ResponseLengths
from planner.errors import PlanInputError
from planner.phases import PHASES, Phase

PRECISIONS = ("bf16", "fp16", "fp8")
ROLLOUT_ENGINES = ("vllm", "sglang")
ROLLOUT_PRECISIONS = ("bf16", "fp8")  # rollout weights and KV cache (vLLM quantization=fp8)
WEIGHT_SYNC_PATHS = ("per_tensor", "bucketed")
# Speculative decoding in rollout: "off" or "mtp", the model's own multi-token-prediction layers
# as the drafter (verl 0.9.1 actor_rollout_ref.model.mtp.{enable, enable_rollout}).  A separate
# draft model is refused by name: verl syncs the actor's weights into vLLM's MTP drafter only
# (workers/rollout/vllm_rollout/utils.py ``_iter_all_models``: "Independent non-MTP draft models
# are not compatible with actor weight loading through this path").
SPECULATIVE_METHODS = ("off", "mtp")
REFUSED_SPECULATIVE = {"draft": "a separate draft model", "eagle": "an EAGLE draft model",
                       "eagle3": "an EAGLE-3 draft model"}
MAX_SPECULATIVE_TOKENS = 16
# Acceptance of one drafted token by the target: the DeepSeek-V3 technical report (arXiv
# 2412.19437, §5.4.3) measures 85-90% for the second token its MTP module predicts; the low end,
# as RL rollouts sample at temperature 1 rather than greedily.
DEFAULT_DRAFT_ACCEPTANCE = 0.85


def default_acceptance_length(speculative_tokens: int,
                              acceptance: float = DEFAULT_DRAFT_ACCEPTANCE) -> float:
    """Mean tokens one verification step advances with ``speculative_tokens`` drafted tokens,
    each accepted with probability ``acceptance`` given the ones before (Leviathan et al. 2023,
    "Fast Inference from Transformers via Speculative Decoding", eq. 1):
    ``(1 - a^(k+1)) / (1 - a)``; k = 1 at 85%: 1.85 tokens per step."""
    a, k = acceptance, speculative_tokens
    return (1 - a ** (k + 1)) / (1 - a)
# mean / max response length of a library caller that states neither a mean nor lengths; every
# command states its lengths (planner.cli.inputs: given, read from a run, or the published
# default for the kind of job, planner.catalog.lengths.default_lengths), so no answer rests on it
DEFAULT_MEAN_RESPONSE_FRACTION = 0.5


class Workload(Protocol):
    """One training step as the planner sees it.

    The search space reads the batch shape (sequences per step and per optimizer step, the
    longest sequence), the cost model the phases the step runs, what they hold and how long an
    average sample is, and the outputs :meth:`describe` and :meth:`to_dict`.  Capabilities are
    stated, never inferred from a kind: ``has_rollout`` (the step generates its samples: a
    rollout engine and the ``generate`` phase, verl's offload and dynamic batches around it),
    ``needs_reference``, ``engine`` (the rollout engine's settings, None without one).
    """

    precision: str
    # the Megatron actor's kernels and optimizer (both kinds of step train with Megatron)
    fused_kernels: bool
    entropy_chunk_tokens: int
    grad_reduce_in_fp32: bool
    adam_moment_bytes: int
    # speculative decoding and MTP (verl actor_rollout_ref.model.mtp); a workload without a
    # rollout states "off", no drafted tokens and untrained MTP layers
    speculative: str
    draft_tokens: int
    tokens_per_verification: float
    train_mtp: bool
    mtp_enabled: bool

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases of :data:`~planner.phases.PHASES` a step runs."""

    @property
    def has_rollout(self) -> bool:
        """The step generates its samples (a rollout engine, a ``generate`` phase)."""

    @property
    def needs_reference(self) -> bool:
        """A reference model is built and runs its forward pass."""

    @property
    def engine(self) -> "RolloutEngine | None":
        """The rollout engine's settings; None when the step has no rollout."""

    @property
    def sequence_length(self) -> int:
        """The longest sample, in tokens: what memory is sized for."""

    @property
    def mean_sequence_length(self) -> float:
        """The tokens an average sample costs in time."""

    @property
    def lengths(self) -> "ResponseLengths | None":
        """The mean response length over the run (None: no responses, or a fixed mean a
        library caller set): what the time model is evaluated over."""

    @property
    def moving_lengths(self) -> bool:
        """``lengths`` move over the run (the time model is evaluated at three points)."""

    @property
    def sequences_per_step(self) -> int:
        """Sequences one step trains on."""

    @property
    def sequences_per_mini_batch(self) -> int:
        """Sequences of one optimizer step."""

    @property
    def dataset_rows_per_step(self) -> int:
        """Rows of the training set one step draws (verl: prompts; pretraining: sequences)."""

    def describe(self) -> str:
        """One line for the outputs' header."""

    def to_dict(self) -> dict:
        """The workload as the outputs' JSON states it (``kind`` and every setting)."""


@dataclass(frozen=True)
class RolloutEngine:
    """What the memory and time models read of a rollout engine (verl's ``rollout.*`` keys)."""

    name: str = "vllm"  # rollout.name
    precision: str = "bf16"  # bf16, or fp8 weights and KV cache
    max_num_seqs: int = 256  # concurrency cap per engine
    max_num_batched_tokens: int = 8192  # prefill chunk
    enforce_eager: bool = False  # no CUDA graphs
    free_cache_engine: bool = True  # sleep during training
    kv_sharing: int = 1  # sequences that share a prompt's KV blocks (prefix caching: rollout.n)
    prefix_caching: bool = True  # enable_prefix_caching: Mamba/GDN layers keep 2 state pages


# every count of a GRPO workload -> (low, high), the flags' bounds (planner/bounds.py)
GRPO_LIMITS = {"train_batch_size": (1, MAX_BATCH), "rollout_n": (1, 4096),
               "prompt_length": (1, MAX_TOKENS), "response_length": (1, MAX_TOKENS),
               "mini_batch_size": (1, MAX_BATCH), "ppo_epochs": (1, 1000),
               "max_num_seqs": (1, MAX_BATCH), "max_num_batched_tokens": (1, MAX_TOKENS),
               "mean_response_length": (0, MAX_TOKENS), "entropy_chunk_tokens": (0, MAX_TOKENS)}


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
    max_num_seqs: int = 256  # concurrency cap per engine (rollout.max_num_seqs)
    # Tokens actually generated per response on average: the point the time model is
    # evaluated at.  0 (not given): the mean of ``lengths`` over the run, else half the maximum
    # (DEFAULT_MEAN_RESPONSE_FRACTION, a library caller's fallback), set when the workload is
    # made so every output states the figure.  Memory is sized for the maximum.
    mean_response_length: int = 0
    # Prompt tokens on average; 0 means the maximum (``prompt_length``).  verl strips the left
    # padding before vLLM and packs without it (use_remove_padding), so time follows the mean
    # prompt; memory is sized for the maximum.
    mean_prompt_length: int = 0
    # --- algorithm switches that decide which passes run ---------------------------------------
    use_kl_in_reward: bool = False  # algorithm.use_kl_in_reward: also needs the reference
    # algorithm.rollout_correction.bypass_mode: old log-probs are the rollout's, no recompute
    bypass_old_log_prob: bool = False
    # --- actor kernels and precision ---------------------------------------------------------
    fused_kernels: bool = False  # actor_rollout_ref.model.use_fused_kernels
    entropy_chunk_tokens: int = 0  # entropy_from_logits_with_chunking's chunk size; 0: off
    grad_reduce_in_fp32: bool = True  # fp32 (4 B) or bf16 (2 B) main-grad buffer
    adam_moment_bytes: int = 4  # optim.exp_avg(_sq)_dtype: fp32 4, bf16 2 (precision-aware)
    # DDP overlap_grad_reduce: verl's Megatron workers leave it off unless
    # actor.megatron.override_ddp_config sets it, so the gradient reduce-scatter is exposed
    overlap_grad_reduce: bool = False
    # --- the rollout engine -------------------------------------------------------------------
    rollout_engine: str = "vllm"  # rollout.name
    rollout_precision: str = "bf16"  # bf16, or fp8 weights and KV cache
    enforce_eager: bool = False  # rollout.enforce_eager: False captures CUDA graphs
    free_cache_engine: bool = True  # rollout.free_cache_engine: sleep during training
    max_num_batched_tokens: int = 8192  # rollout.max_num_batched_tokens (prefill chunk)
    prefix_caching: bool = True  # rollout.enable_prefix_caching: n samples share a prompt
    # How weights reach the rollout engine: verl exports tensor by tensor ("per_tensor", the
    # Megatron backend's per-tensor all-gather + load_weights); NeMo RL's refit packs tensors
    # into large buffers handed over by CUDA IPC ("bucketed").  Not a verl key: it lets the
    # time model score NeMo RL runs too.
    weight_sync: str = "per_tensor"
    # --- speculative decoding and MTP (verl actor_rollout_ref.model.mtp) ------------------------
    speculative: str = "off"  # "mtp": mtp.enable + enable_rollout, the MTP layers draft
    speculative_tokens: int = 1  # mtp.num_speculative_tokens: tokens drafted per step (k)
    # Mean tokens one verification step advances, bonus token included (1..k+1); 0 (not
    # given): default_acceptance_length(k), stated on every answer
    acceptance_length: float = 0.0
    train_mtp: bool = False  # mtp.enable + enable_train: the MTP loss trains the MTP layers
    # The mean response length over the run (planner.catalog.lengths): given, read from a run or
    # the published default for the kind of job.  Plans time each layout at the trajectory's
    # start, middle and end (planner.cost.trajectory) and rank by the expected step time; None:
    # the fixed ``mean_response_length`` alone (a library caller's workload).
    lengths: ResponseLengths | None = None

    def __post_init__(self) -> None:
        for name, (low, high) in GRPO_LIMITS.items():  # from flags, plan.json, a study, a job
            check_number(f"--{name.replace('_', '-')}", getattr(self, name), low, high,
                         integer=True)
        if self.mini_batch_size > self.train_batch_size:
            raise PlanInputError(
                f"--mini-batch-size {self.mini_batch_size} exceeds --train-batch-size "
                f"{self.train_batch_size}; verl needs train_batch_size >= ppo_mini_batch_size")
        # A mini-batch that does not divide the train batch is legal: verl 0.9.1's trainer
        # (trainer/ppo/v1/trainer_base.py, _balance_batch -> padding_utils.
        # upsample_batch_to_divisible_size, on every step) pads the step's sequences with
        # minimal no-op samples to a multiple of lcm(DP, ppo_mini_batch_size * n), so the update
        # runs ceil(train / mini) optimizer steps (planner/cost/timing.py); `validate` warns,
        # and refuses it under the legacy trainer (trainer.use_v1=False), which does not pad.
        if self.precision not in PRECISIONS:
            raise PlanInputError(f"--precision {self.precision!r} is not one of "
                                 f"{', '.join(PRECISIONS)}")
        if not 0 <= self.mean_response_length <= self.response_length:
            raise PlanInputError(f"--mean-response-length {self.mean_response_length} must be "
                                 f"between 1 and --response-length {self.response_length} "
                                 f"(0: half of it)")
        if not 0 <= self.mean_prompt_length <= self.prompt_length:
            raise PlanInputError(f"--mean-prompt-length {self.mean_prompt_length} must be "
                                 f"between 1 and --prompt-length {self.prompt_length} "
                                 f"(0: the maximum)")
        if self.weight_sync not in WEIGHT_SYNC_PATHS:
            raise PlanInputError(f"weight sync {self.weight_sync!r} is not one of "
                                 f"{', '.join(WEIGHT_SYNC_PATHS)}")
        if self.lengths is not None:
            lengths = ResponseLengths.from_dict(self.lengths, "workload lengths")
            if lengths.max_tokens != self.response_length:
                raise PlanInputError(f"response lengths for a maximum of {lengths.max_tokens} "
                                     f"tokens do not match --response-length "
                                     f"{self.response_length}")
            object.__setattr__(self, "lengths", lengths)
            if not self.mean_response_length:  # the run's mean: the one point a caller reads
                object.__setattr__(self, "mean_response_length",
                                   int(min(max(round(lengths.mean_tokens), 1),
                                           self.response_length)))
        if not self.mean_response_length:  # the fallback, stated: what plan.json records
            object.__setattr__(self, "mean_response_length", max(1, self.response_length // 2))
        if self.rollout_engine not in ROLLOUT_ENGINES:
            raise PlanInputError(f"rollout engine {self.rollout_engine!r} is not one of "
                                 f"{', '.join(ROLLOUT_ENGINES)}")
        if self.rollout_precision not in ROLLOUT_PRECISIONS:
            raise PlanInputError(f"--rollout-precision {self.rollout_precision!r} is not one of "
                                 f"{', '.join(ROLLOUT_PRECISIONS)}")
        if self.adam_moment_bytes not in (2, 4):
            raise PlanInputError(f"Adam moment bytes {self.adam_moment_bytes}: valid are 4 "
                                 f"(fp32) and 2 (bf16, precision-aware optimizer)")
        if self.entropy_chunk_tokens < 0:
            raise PlanInputError(f"entropy chunk size {self.entropy_chunk_tokens} must be >= 0")
        self._check_speculation()

    def _check_speculation(self) -> None:
        """The speculative-decoding and MTP settings, and the acceptance length's default."""
        method = self.speculative
        if method in REFUSED_SPECULATIVE:
            raise PlanInputError(
                f"--speculative {method}: verl 0.9.1 cannot run {REFUSED_SPECULATIVE[method]} "
                f"in rollout (it syncs the actor's weights into vLLM's MTP drafter only, "
                f"vllm_rollout/utils.py); valid: {', '.join(SPECULATIVE_METHODS)}")
        if method not in SPECULATIVE_METHODS:
            raise PlanInputError(f"--speculative {method!r} is not one of "
                                 f"{', '.join(SPECULATIVE_METHODS)}")
        check_number("--speculative-tokens", self.speculative_tokens, 1,
                     MAX_SPECULATIVE_TOKENS, integer=True)
        check_number("--acceptance-length", self.acceptance_length, 0,
                     MAX_SPECULATIVE_TOKENS + 1)
        if method == "off":
            if self.acceptance_length or self.speculative_tokens != 1:
                given = (f"--acceptance-length {self.acceptance_length:g}"
                         if self.acceptance_length
                         else f"--speculative-tokens {self.speculative_tokens}")
                raise PlanInputError(f"{given} needs --speculative mtp (speculative decoding "
                                     f"is off)")
            return
        k = self.speculative_tokens
        if not self.acceptance_length:
            object.__setattr__(self, "acceptance_length",
                               round(default_acceptance_length(k), 4))
        elif not 1 <= self.acceptance_length <= k + 1:
            raise PlanInputError(f"--acceptance-length {self.acceptance_length:g} must be "
                                 f"between 1 and --speculative-tokens + 1 = {k + 1} (tokens "
                                 f"one verification step advances)")
        if self.fused_kernels:
            raise PlanInputError("--fused-kernels with MTP: verl 0.9.1 turns fused kernels off "
                                 "when mtp.enable is set (workers/engine/megatron/"
                                 "transformer_impl.py); drop --fused-kernels")

    @property
    def sequence_length(self) -> int:
        """Longest prompt+response sequence: what one sample can cost in memory."""
        return self.prompt_length + self.response_length

    @property
    def mean_sequence_length(self) -> float:
        """Mean prompt + mean response: the tokens an average sample costs in time (prompts:
        the maximum when no mean is given; responses: half the maximum)."""
        return (float(self.mean_prompt_length or self.prompt_length)
                + float(self.mean_response_length
                        or DEFAULT_MEAN_RESPONSE_FRACTION * self.response_length))

    @property
    def sequences_per_step(self) -> int:
        return self.train_batch_size * self.rollout_n

    @property
    def dataset_rows_per_step(self) -> int:
        """Prompts one step draws (``data.train_batch_size``)."""
        return self.train_batch_size

    @property
    def engine(self) -> RolloutEngine:
        """The rollout engine's settings."""
        return RolloutEngine(name=self.rollout_engine, precision=self.rollout_precision,
                             max_num_seqs=self.max_num_seqs,
                             max_num_batched_tokens=self.max_num_batched_tokens,
                             enforce_eager=self.enforce_eager,
                             free_cache_engine=self.free_cache_engine,
                             kv_sharing=self.rollout_n if self.prefix_caching else 1,
                             prefix_caching=self.prefix_caching)

    @property
    def sequences_per_mini_batch(self) -> int:
        return self.mini_batch_size * self.rollout_n

    @property
    def mtp_enabled(self) -> bool:
        """verl builds the MTP layers into the actor (``mtp.enable``): for speculative decoding
        with them or to train them."""
        return self.speculative == "mtp" or self.train_mtp

    @property
    def draft_tokens(self) -> int:
        """Tokens drafted per verification step (0 without speculative decoding)."""
        return self.speculative_tokens if self.speculative != "off" else 0

    @property
    def tokens_per_verification(self) -> float:
        """Tokens one decode (verification) step advances per sequence: the acceptance length
        with speculative decoding, else 1."""
        return float(self.acceptance_length) if self.speculative != "off" else 1.0

    kind = "grpo"
    has_rollout = True  # a step generates its samples (the ``generate`` phase)

    @property
    def needs_reference(self) -> bool:
        """verl builds and runs the reference only for a KL loss or a KL penalty in the reward
        (``need_reference_policy``)."""
        return self.use_kl_loss or self.use_kl_in_reward

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases a step runs: verl skips the reference without KL and the old-log-prob
        pass in bypass mode (``RayPPOTrainer.fit``)."""
        skipped = set()
        if not self.needs_reference:
            skipped.add(Phase.REF.value)
        if self.bypass_old_log_prob:
            skipped.add(Phase.OLD_LOG_PROB.value)
        return tuple(phase for phase in PHASES if phase not in skipped)

    @property
    def moving_lengths(self) -> bool:
        """The mean response length moves over the run: a plan times three points of it."""
        return self.lengths is not None and not self.lengths.constant

    def describe(self) -> str:
        lengths = self.lengths
        mean = (f"{lengths.start_tokens:.0f}->{lengths.end_tokens:.0f} over the run"
                if self.moving_lengths else f"{self.mean_response_length}")
        # a mean prompt below the maximum (--mean-prompt-length, or a run's) times the step
        prompt_mean = (f" (mean {self.mean_prompt_length})"
                       if 0 < self.mean_prompt_length < self.prompt_length else "")
        return (f"GRPO: {self.train_batch_size} prompts x n={self.rollout_n}, prompt "
                f"{self.prompt_length}{prompt_mean} + response {self.response_length} tokens "
                f"(mean {mean}), mini-batch {self.mini_batch_size}, {self.precision}"
                + self.describe_mtp())

    def describe_mtp(self) -> str:
        """The MTP settings and the acceptance assumption, for the header ('' when off)."""
        parts = []
        if self.speculative != "off":
            default = self.acceptance_length == round(
                default_acceptance_length(self.speculative_tokens), 4)
            parts.append(f"MTP speculative decoding: {self.speculative_tokens} drafted "
                         f"token(s), acceptance length {self.acceptance_length:g} tokens/step"
                         + (f" (assumed: {DEFAULT_DRAFT_ACCEPTANCE:.0%} per drafted token, "
                            f"DeepSeek-V3 report; set --acceptance-length)" if default
                            else " (given)"))
        if self.train_mtp:
            parts.append("MTP layers trained")
        return "".join(f"; {part}" for part in parts)

    def to_dict(self) -> dict:
        out = {"kind": self.kind, **asdict(self)}
        out["lengths"] = None if self.lengths is None else self.lengths.to_dict()
        return out


@dataclass(frozen=True)
class PretrainWorkload:
    """A plain Megatron training step (``--workload pretrain``): what public measurements
    report, and what the GRPO actor update is made of."""

    seq_len: int = 4096
    global_batch: int = 1024  # sequences per optimizer step
    precision: str = "bf16"

    def __post_init__(self) -> None:
        for name, high in (("seq_len", MAX_TOKENS), ("global_batch", MAX_BATCH)):
            check_number(f"--{name.replace('_', '-')}", getattr(self, name), 1, high,
                         integer=True)
        if self.precision not in PRECISIONS:
            raise PlanInputError(f"--precision {self.precision!r} is not one of "
                                 f"{', '.join(PRECISIONS)}")

    kind = "pretrain"
    # One optimizer step over the global batch of given data: no generation (no rollout
    # engine, no verl offload or dynamic batches around it), no reference model, no responses
    # whose length moves.
    has_rollout = False
    lengths = None
    moving_lengths = False
    engine = None
    phases = (Phase.UPDATE_ACTOR.value,)
    needs_reference = False
    # no rollout, so no speculative decoding; the MTP layers are not built
    speculative = "off"
    draft_tokens = 0
    tokens_per_verification = 1.0
    train_mtp = False
    mtp_enabled = False
    # Megatron's defaults: no verl log-prob kernels, fp32 main grads, fp32 Adam moments
    fused_kernels = False
    entropy_chunk_tokens = 0
    grad_reduce_in_fp32 = True
    adam_moment_bytes = 4

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @property
    def sequence_length(self) -> int:
        return self.seq_len

    @property
    def mean_sequence_length(self) -> float:
        return float(self.seq_len)

    @property
    def sequences_per_step(self) -> int:
        return self.global_batch

    @property
    def sequences_per_mini_batch(self) -> int:
        return self.global_batch

    @property
    def dataset_rows_per_step(self) -> int:
        return self.global_batch

    def to_dict(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def describe(self) -> str:
        return (f"pretrain: {self.global_batch} sequences x {self.seq_len} tokens per step, "
                f"{self.precision}")
