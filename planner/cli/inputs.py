"""From parsed arguments to the planner's inputs: model, cluster, workload, pins, policy.

Messages name the flag a value came from.  The note that no GPU is visible through NVML goes to
stderr at once; the notes about the chosen GPU (FP16 on a part without BF16, a pinned rollout
engine that does not run on it, efficiencies not calibrated on it) are held in
:mod:`planner.cli.notes` and printed with the answer.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from planner.catalog.engines import engine_problem, training_precision
from planner.catalog.hardware import (
    DEFAULT_GPU,
    DEFAULT_GPUS_PER_NODE,
    ClusterSpec,
    detect_local_gpus,
    get_gpu,
    gpu_from_detected,
)
from planner.catalog.models import local_model_path, model_at_length, windows_within
from planner.catalog.workload import GrpoWorkload, PretrainWorkload
from planner.cli import notes
from planner.cli.args import UsageError
from planner.cost.efficiency import CostModel, read_calibration
from planner.cost.request import PlanRequest
from planner.errors import PlanInputError
from planner.modes import BEST, all_modes, baseline_name, get_mode
from planner.policy import DEFAULT_POLICY, MemoryPolicy
from planner.search.layout import RECOMPUTE
from planner.search.space import SearchOptions

if TYPE_CHECKING:
    from planner.catalog.lengths import ResponseLengths


def resolve_cluster(args) -> ClusterSpec:
    """``--gpu-type``/``--gpus``/``--gpus-per-node``, else what NVML reports."""
    detected = None
    if args.gpu_type is not None:
        gpu = get_gpu(args.gpu_type)
    else:
        detected = detect_local_gpus()
        if detected is None and args.gpus is None:
            raise UsageError("--gpus is required when no local GPU is detected")
        if detected is None:
            print(f"note: no GPU visible through NVML; planning for {DEFAULT_GPU} "
                  f"(pass --gpu-type to choose)", file=sys.stderr)
            gpu = get_gpu(DEFAULT_GPU)
        else:
            gpu = gpu_from_detected(detected)
    gpus = args.gpus if args.gpus is not None else (detected.count if detected else None)
    if gpus is None:
        raise UsageError("--gpus is required when no local GPU is detected")
    per_node = args.gpus_per_node or (detected.count if detected else DEFAULT_GPUS_PER_NODE)
    if args.gpus is not None and args.gpus < per_node and not args.gpus_per_node:
        per_node = max(args.gpus, 1)
    cluster = ClusterSpec(gpu=gpu, num_gpus=gpus, gpus_per_node=per_node,
                          host_memory_gib=getattr(args, "host_memory_gib", None))
    gpu_notes(args, gpu)
    return cluster


def gpu_notes(args, gpu) -> None:
    """Settle the precision on this GPU (``--precision`` unset: BF16, FP16 without BF16) and
    hold the notes about the GPU: FP16 forced, a rollout engine the card cannot run, and the
    efficiencies' source when the calibration has no measurements of this GPU type."""
    if not hasattr(args, "precision"):
        return
    args.precision, forced = training_precision(gpu, args.precision)
    if forced:
        notes.note(forced)
    engine = getattr(args, "rollout_engine", None)
    if engine and getattr(args, "workload", "grpo") == "grpo":
        problem = engine_problem(gpu, engine)
        if problem:
            notes.note(f"{problem}; the plan's times assume it")
    source = cost_model(args).source_of(gpu, args.precision)
    if source.startswith("uncalibrated"):
        notes.note(f"{gpu.name} step times are {source} (`plan-parallel calibrate` fits a "
                   f"cluster's own trials)")


def precision(args) -> str:
    """``--precision``, or when unset the one the named GPU types train in (``resolve_cluster``
    settles it for one GPU; sizing several types reads ``--gpu-type`` here)."""
    from planner.sizing.counts import parse_gpu_types

    gpus = parse_gpu_types(args.gpu_type) if getattr(args, "gpu_type", None) else ()
    if args.precision is not None:
        for gpu in gpus:  # every swept part must run it (refused by name, as for one part)
            training_precision(gpu, args.precision)
        return args.precision
    lacking = [gpu.name for gpu in gpus if not gpu.bf16]
    if gpus and len(lacking) == len(gpus):
        args.precision, forced = training_precision(gpus[0], None)
        notes.note(forced)
        return args.precision
    if lacking:
        notes.note(f"{', '.join(lacking)} ha{'s' if len(lacking) == 1 else 've'} no BF16 "
                   f"tensor cores: sized at {'its' if len(lacking) == 1 else 'their'} FP16 "
                   f"tensor rate with the others' BF16 workload")
    return "bf16"


LENGTH_FLAGS = (("--response-lengths", "response_lengths"), ("--lengths-from", "lengths_from"),
                ("--mean-response-length", "mean_response_length"))


def response_lengths(args, model_name: str = "") -> tuple["ResponseLengths", float]:
    """The response lengths the answer rests on, and the run's mean prompt length (0: not
    read): ``--response-lengths``, ``--lengths-from``, ``--mean-response-length`` (a fixed
    mean), else the published default for the kind of job ``model_name`` (else ``--model``)
    does (:func:`planner.catalog.lengths.default_lengths`)."""
    from planner.catalog.lengths import (
        ResponseLengths,
        default_lengths,
        parse_response_lengths,
        recut_lengths,
    )

    given = [flag for flag, name in LENGTH_FLAGS if getattr(args, name, None)]
    if len(given) > 1:
        raise UsageError(f"{given[0]} and {given[1]} both set the response lengths; give one")
    name = model_name or getattr(args, "model", None) or ""
    if getattr(args, "response_lengths", None):
        return parse_response_lengths(args.response_lengths, args.response_length, name), 0.0
    if getattr(args, "lengths_from", None):
        from trials.runs import read_run

        run = read_run(args.lengths_from)
        prompts = run.series("prompt_length/mean")
        cap = run.response_cap()
        if cap is not None and cap < args.response_length:
            notes.note(f"--lengths-from: the run's means were measured with responses cut at {cap} "
                 f"tokens (its response_length/clip_ratio); under --response-length "
                 f"{args.response_length} they may grow (taken unchanged)")
        longest = run.series("response_length/max")
        if len(longest) and float(longest.max()) > args.response_length:
            # its longer responses would be cut at this maximum: the means shrink
            lengths = recut_lengths(run.response_lengths(), cap, args.response_length)
        else:
            lengths = run.response_lengths(args.response_length)
        return lengths, float(prompts.mean()) if len(prompts) else 0.0
    if getattr(args, "mean_response_length", None):
        if args.mean_response_length > args.response_length:
            raise PlanInputError(f"--mean-response-length {args.mean_response_length} must "
                                 f"be between 1 and --response-length {args.response_length}")
        return ResponseLengths.fixed(args.mean_response_length, args.response_length), 0.0
    return default_lengths(args.response_length, name), 0.0


def mini_batch_size(args) -> int:
    """``--mini-batch-size``; its default (verl's examples' 256) when it exceeds or does not
    divide ``--train-batch-size`` is refused as the default (the user never typed it)."""
    from planner.cli.args import DefaultInt

    mini, train = int(args.mini_batch_size), args.train_batch_size
    if isinstance(args.mini_batch_size, DefaultInt) and (mini > train or train % mini):
        # the largest mini-batch up to the default that divides the train batch
        near = max(size for size in range(1, min(train, mini) + 1) if not train % size)
        raise PlanInputError(
            f"--mini-batch-size {mini} (the default) "
            + (f"exceeds --train-batch-size {train}; pass --mini-batch-size {train} or less"
               if mini > train else
               f"does not divide --train-batch-size {train}; pass a --mini-batch-size that "
               f"does")
            + f" (verl would pad each step with no-op samples to whole mini-batches; e.g. "
              f"--mini-batch-size {near})")
    return mini


def check_context(model, prompt_length: int, response_length: int) -> None:
    """Refuse a prompt + response longer than the model's context: verl 0.9.1's rollout
    server takes ``max_model_len`` as at most ``max_position_embeddings``
    (``vllm_async_server._validate_configs``), so a longer sequence never runs."""
    total = prompt_length + response_length
    if model.max_position_embeddings and total > model.max_position_embeddings:
        raise PlanInputError(
            f"--prompt-length {prompt_length} + --response-length {response_length} = {total} "
            f"tokens exceeds {model.name}'s max_position_embeddings "
            f"{model.max_position_embeddings}, the longest sequence verl's rollout serves "
            f"(max_model_len); shorten the lengths, or pass a config.json whose "
            f"max_position_embeddings covers {total}")


# the workload flags a pretraining step does not read, with their defaults: (attribute,
# default); an integer's default is a DefaultInt, a boolean's --no- form is named when off
GRPO_WORKLOAD_FLAGS = (
    ("train_batch_size", None), ("rollout_n", None), ("prompt_length", None),
    ("response_length", None), ("mini_batch_size", None), ("ppo_epochs", None),
    ("mean_response_length", 0), ("response_lengths", None), ("lengths_from", None),
    ("mean_prompt_length", 0), ("overlap_grad_reduce", False), ("max_num_seqs", 256),
    ("kl_loss", True), ("kl_in_reward", False), ("bypass_old_log_prob", False),
    ("fused_kernels", False), ("entropy_chunk_size", 0), ("grad_reduce_in_fp32", True),
    ("adam_moments", "fp32"), ("rollout_engine", "vllm"), ("rollout_precision", "bf16"),
    ("enforce_eager", False), ("free_cache_engine", True), ("max_num_batched_tokens", 8192),
    ("prefix_caching", True), ("speculative", "off"), ("speculative_tokens", 1),
    ("acceptance_length", 0.0), ("train_mtp", False))


def _typed(value, default) -> bool:
    from planner.cli.args import DefaultInt

    if default is None and isinstance(value, int) and not isinstance(value, bool):
        return not isinstance(value, DefaultInt)
    return value is not None and value != default


def check_workload_flags(args) -> None:
    """Flags of the other workload are usage errors, never dropped: a pretraining step reads
    ``--seq-len``, ``--global-batch`` and ``--precision`` only, a GRPO step neither of the
    first two."""
    if args.workload == "pretrain":
        given = [("--no-" if value is False else "--") + name.replace("_", "-")
                 for name, default in GRPO_WORKLOAD_FLAGS
                 if hasattr(args, name) and _typed(value := getattr(args, name), default)]
        if given:
            raise UsageError(f"--workload pretrain does not read {', '.join(given)}: it times "
                             f"a plain Megatron step of --global-batch sequences of --seq-len "
                             f"tokens (drop {'it' if len(given) == 1 else 'them'}, or use "
                             f"--workload grpo)")
        return
    for name in ("seq_len", "global_batch"):
        if _typed(getattr(args, name, None), None):
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} is --workload pretrain's; a GRPO step's sequences are "
                             f"--prompt-length + --response-length and its batch "
                             f"--train-batch-size x --rollout-n")


def workload(args, model=None):
    """The workload of the flags; a GRPO step's response lengths as
    :func:`response_lengths` states them (``model``: the resolved model, whose name picks the
    default's kind of job, and whose windows that hold every sequence a note names)."""
    made = _flags_workload(args, model)
    if model is not None:
        window_note(model, made)
    return made


def window_note(model, work) -> None:
    """Say which windowed layers a plan of ``work`` costs as full attention: their window holds
    every sequence (:func:`planner.catalog.models.model_at_length`, which the request
    applies)."""
    costed = model_at_length(model, work.sequence_length)
    if costed is model:
        return
    notes.note(f"{windows_within(model, costed)} layers of {model.name}: every "
               f"{work.sequence_length:,}-token sequence (prompt + response) fits in the "
               f"window, so they are costed as full attention (vLLM frees none of their pages "
               f"and masks no key)")


def _flags_workload(args, model=None):
    check_workload_flags(args)
    if args.workload == "pretrain":
        return PretrainWorkload(seq_len=args.seq_len, global_batch=args.global_batch,
                                precision=precision(args))
    if model is not None:
        check_context(model, args.prompt_length, args.response_length)
    mini_batch = mini_batch_size(args)
    lengths, prompt = response_lengths(args, model.name if model is not None else "")
    mean_prompt = args.mean_prompt_length
    if prompt and not mean_prompt:
        mean_prompt = int(min(max(round(prompt), 1), args.prompt_length))
    return GrpoWorkload(lengths=lengths,
                        mean_prompt_length=mean_prompt,
                        overlap_grad_reduce=args.overlap_grad_reduce,
                        train_batch_size=args.train_batch_size, rollout_n=args.rollout_n,
                        prompt_length=args.prompt_length, response_length=args.response_length,
                        mini_batch_size=mini_batch, ppo_epochs=args.ppo_epochs,
                        precision=precision(args), max_num_seqs=args.max_num_seqs,
                        use_kl_loss=args.kl_loss, use_kl_in_reward=args.kl_in_reward,
                        bypass_old_log_prob=args.bypass_old_log_prob,
                        fused_kernels=args.fused_kernels,
                        entropy_chunk_tokens=args.entropy_chunk_size,
                        grad_reduce_in_fp32=args.grad_reduce_in_fp32,
                        adam_moment_bytes=2 if args.adam_moments == "bf16" else 4,
                        rollout_engine=args.rollout_engine,
                        rollout_precision=args.rollout_precision,
                        enforce_eager=args.enforce_eager,
                        free_cache_engine=args.free_cache_engine,
                        max_num_batched_tokens=args.max_num_batched_tokens,
                        prefix_caching=args.prefix_caching,
                        speculative=args.speculative,
                        speculative_tokens=args.speculative_tokens,
                        acceptance_length=args.acceptance_length,
                        train_mtp=args.train_mtp)


def cost_model(args) -> CostModel:
    """The cost model: ``--calibration FILE`` read once, else the shipped calibration."""
    if not getattr(args, "calibration", None):
        return CostModel.load()
    # size, depth, NaN, schema
    cost = CostModel.load(read_calibration(Path(args.calibration)), source=args.calibration,
                          fill_from_shipped=True)
    note_filled(args.calibration, cost.filled_from_shipped)
    return cost


def note_filled(path: str, filled: tuple[str, ...]) -> None:
    """Hold a note naming the RL constants a user's calibration file lacked and that were taken
    from the shipped calibration (:func:`planner.cost.efficiency.with_shipped_rl_constants`)."""
    if filled:
        notes.note(f"{path} has no {', '.join(filled)}; the shipped calibration's "
                   f"value{'s' if len(filled) > 1 else ''} used (RL phases)")


def note_versions(args, cost: CostModel, workload) -> None:
    """Hold a note (once) for each installed verl or vLLM release the calibration's RL
    constants were not measured with, under a text answer; a JSON answer carries them in its
    ``calibration.version_notes`` instead (:func:`planner.output.calibration_json`).  A step
    without rollout (pretraining) uses no RL constant: no note."""
    from planner.cost.provenance import version_notes

    if getattr(args, "format", "table") == "json" or not workload.has_rollout:
        return
    for text in version_notes(dict(cost.calibration)):
        notes.note(text.removeprefix("note: "))


def policy(args) -> MemoryPolicy:
    text = getattr(args, "memory_band", None)
    return DEFAULT_POLICY if text is None else MemoryPolicy.parse(text)


def request(args, model, cluster, work, options: SearchOptions | None = None) -> PlanRequest:
    """The plan request of a command: its model, cluster and workload, the search options
    (default: :func:`search_options` of the flags), ``--calibration`` and ``--memory-band``."""
    return PlanRequest(model, cluster, work,
                       search_options(args, work) if options is None else options,
                       cost_model(args), policy(args))


# flag attribute -> layout field a plan may pin
PIN_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch", "rollout_tp", "rollout_dp",
              "rollout_ep", "param_offload", "optimizer_offload", "ref_param_offload")
GRPO_ONLY = ("rollout_tp", "rollout_dp", "rollout_ep", "param_offload", "optimizer_offload",
             "ref_param_offload")


# flags that describe one layout and are for `estimate`, not for a search
ESTIMATE_ONLY = ("first_stage_layers", "last_stage_layers", "recompute_modules",
                 "recompute_method", "recompute_num_layers", "log_prob_micro_batch",
                 "log_prob_max_token_len_per_gpu", "pipeline_layout")


def cpu_optimizer_fraction(args) -> float | None:
    """``--optimizer-cpu-offload [--optimizer-offload-fraction F]`` as one fraction (None: not
    given)."""
    if args.optimizer_cpu_offload is None:
        if args.optimizer_offload_fraction is not None:
            raise UsageError("--optimizer-offload-fraction needs --optimizer-cpu-offload")
        return None
    if not args.optimizer_cpu_offload:
        if args.optimizer_offload_fraction:
            raise UsageError("--optimizer-offload-fraction contradicts "
                             "--no-optimizer-cpu-offload")
        return 0.0
    return 1.0 if args.optimizer_offload_fraction is None else args.optimizer_offload_fraction


def pins(args) -> dict:
    """Layout values the search keeps fixed (``--tp 4`` and the like)."""
    pinned = {name: getattr(args, name) for name in PIN_FIELDS if getattr(args, name) is not None}
    for name in ESTIMATE_ONLY:
        if getattr(args, name, None) is not None:
            raise UsageError(f"--{name.replace('_', '-')} is for `estimate`; the search "
                             f"chooses it")
    for flag in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if getattr(args, flag, False):
            raise UsageError(f"--{flag.replace('_', '-')} is for `estimate`; the search tries "
                             f"every split megatron-core allows")
    fraction = cpu_optimizer_fraction(args)
    if fraction is not None:
        pinned["optimizer_cpu_fraction"] = fraction
    return pinned


def search_options(args, work) -> SearchOptions:
    """The search space a plan (or a tuning study) explores, from the pins and knobs."""
    pinned = pins(args)
    if args.no_offload and any(pinned.get(name) for name in ("param_offload", "optimizer_offload",
                                                             "ref_param_offload")):
        raise UsageError("--no-offload contradicts --param-offload/--optimizer-offload/"
                         "--ref-param-offload")
    grpo_only = [name for name in GRPO_ONLY if name in pinned]
    if not work.has_rollout and (grpo_only or args.gpu_memory_utilization is not None):
        flags = ", ".join("--" + name.replace("_", "-") for name in grpo_only)
        raise UsageError(f"--workload pretrain has no rollout, reference or verl offload; drop "
                         f"{flags or '--gpu-memory-utilization'}")
    offload = (False,) if args.no_offload else (False, True)
    cpu = pinned.pop("optimizer_cpu_fraction", None)
    if args.no_offload and cpu:
        raise UsageError("--no-offload contradicts --optimizer-cpu-offload")
    budget = getattr(args, "max_token_len_per_gpu", None)
    if budget is not None and args.dynamic_batch is False:
        raise UsageError("--max-token-len-per-gpu is the dynamic batches' budget; it "
                         "contradicts --no-dynamic-batch")
    return SearchOptions(
        offload=offload,
        ref_param_offload=offload,
        optimizer_cpu_fraction=(cpu,) if cpu is not None else (
            (0.0,) if args.no_offload else (0.0, 1.0)),
        dynamic_batch=args.dynamic_batch is not False,
        max_token_len=budget or 0,
        micro_batches=(1,) if budget and "micro_batch" not in pinned else (1, 2, 4, 8),
        recompute=(args.recompute,) if args.recompute else RECOMPUTE,
        gpu_memory_utilization=args.gpu_memory_utilization,
        fixed=tuple(sorted(pinned.items())))


# the --mode flags a mode may use (TrainingMode.settings_used) -> (flag, default)
MODE_FLAGS = {"trainer_gpus": ("--trainer-gpus", []),
              "staleness_threshold": ("--staleness-threshold", 0.1),
              "trigger_parameter_sync_step": ("--trigger-parameter-sync-step", 0),
              "partial_rollout": ("--no-partial-rollout", True)}


SIZING_FLAGS = ("price", "prices", "steps", "epochs", "dataset_prompts")


def sizing_requested(args) -> bool:
    """A range, list or ``auto`` of ``--gpus``, a list of ``--gpu-type``, or a sizing flag
    (:mod:`planner.cli.sizing` answers; here so that a plain plan does not import it)."""
    return (isinstance(args.gpus, str) or "," in (args.gpu_type or "")
            or any(getattr(args, name, None) is not None for name in SIZING_FLAGS))


def baseline_mode(args) -> bool:
    """The command runs the baseline mode (``sync``, the default): the plain plan and
    estimate outputs."""
    return getattr(args, "mode", baseline_name()) == baseline_name()


def check_trainer_gpus(args) -> None:
    """``--trainer-gpus`` values: each once, and each leaving the rollout at least one GPU of a
    ``--gpus`` count (a repeated value planned the same split twice)."""
    given = list(getattr(args, "trainer_gpus", None) or [])
    for count in given:
        if given.count(count) > 1:
            raise UsageError(f"--trainer-gpus {count} is given twice")
        gpus = getattr(args, "gpus", None)
        if isinstance(gpus, int) and gpus > 1 and count >= gpus:
            raise UsageError(f"--trainer-gpus {count} leaves no rollout GPU of --gpus {gpus}; "
                             f"valid: 1..{gpus - 1}")


def check_mode_flags(args) -> None:
    """Flags of a training mode given with another are usage errors, never silently ignored:
    ``--trainer-gpus`` splits the cluster (only the modes on separate pools), the
    ``async_training`` flags shape the modes that read them (``best`` plans every mode)."""
    mode = getattr(args, "mode", baseline_name())
    check_trainer_gpus(args)
    if mode == BEST:
        return
    used = set(get_mode(mode).settings_used)
    if "trainer_gpus" in used and getattr(args, "gpus", None) == 1:
        raise UsageError(f"--mode {mode} splits the GPUs into a trainer and a rollout pool of at "
                         f"least one GPU each; --gpus 1 has one (--mode sync colocates them)")
    if getattr(args, "trainer_gpus", None) and "trainer_gpus" not in used:
        splitting = [m.name for m in all_modes() if "trainer_gpus" in m.settings_used]
        raise UsageError(f"--trainer-gpus {args.trainer_gpus[0]} sizes the trainer pool of "
                         f"--mode {', '.join(splitting)} or {BEST}; {mode} colocates both on "
                         f"every GPU")
    given = [flag for name, (flag, default) in MODE_FLAGS.items()
             if name != "trainer_gpus" and hasattr(args, name) and getattr(args, name) != default
             and name not in used]
    if given:
        readers = [m.name for m in all_modes() if "staleness_threshold" in m.settings_used]
        raise UsageError(f"{', '.join(given)}: {' and '.join(readers)}'s async_training "
                         f"settings; --mode {mode} does not use them (use --mode "
                         f"{' or '.join(readers)} or {BEST})")


def job_model_path(args) -> str | None:
    """The model directory a written job launches from: ``--model-path``, else the local
    directory whose config.json ``--model`` planned (a config.json path: its folder), else None
    (the script's ``$MODEL_PATH``, default ``~/models/<model>``)."""
    if getattr(args, "model_path", None):
        return args.model_path
    given = str(getattr(args, "model", None) or "")
    local = local_model_path(given) if given.strip() else None
    if local is None:
        return None
    return str((local.parent if local.is_file() else local).absolute())
