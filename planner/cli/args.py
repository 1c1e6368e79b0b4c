"""Every ``plan-parallel`` argument, in one place.

Only argparse is imported here: ``plan-parallel --help`` builds every parser and must start at
once.  Numbers are checked as they are parsed (:func:`integer`, :func:`fraction`), with the
realistic bounds stated in ``--help``; a bad value is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import math

from planner import bounds

# Realistic upper bounds of user-given counts, stated in --help (planner/bounds.py says why)
from planner.bounds import (
    MAX_BATCH,
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_LAYERS,
    MAX_PARALLEL,
    MAX_TOKENS,
    MAX_VPP,
)
from planner.errors import PlanInputError
from trials.defaults import FIRST_TRIALS, PHASE_MODELS, PRUNERS, SAMPLERS, TUNE_DEFAULTS


class UsageError(PlanInputError):
    """A command-line error argparse or a handler found (exit code 2)."""


class Parser(argparse.ArgumentParser):
    """argparse that reports bad input as one line and exit code 2 (no usage dump), and takes
    every option by its whole name: a prefix is never read as a longer option (``explain --pp
    2`` is not ``--ppo-epochs 2``, ``report --mode best`` not ``--model best``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UsageError(message)


def trailing_inputs(args: argparse.Namespace, extra: list[str]) -> None:
    """``validate PATH --gpu-type h100 -- KEY=VALUE``: argparse fills a positional list once,
    so words after the options arrive unrecognised.  For the commands that read a job
    (``inputs``: validate, fix) they join the inputs; anything else, or an unknown option, is
    refused as argparse would."""
    words = [word for word in extra if word != "--"]
    if not hasattr(args, "inputs") or any(word.startswith("-") for word in words):
        raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
    check = free_text("a path or KEY=VALUE", 1 << 16)
    try:
        args.inputs = list(args.inputs) + [check(word) for word in words]
    except argparse.ArgumentTypeError as error:
        raise UsageError(f"argument PATH | -- KEY=VALUE: {error}") from None


def integer(low: int, high: int):
    """An argparse type: an integer in ``low..high``."""

    def parse(text: str) -> int:
        cleaned = str(text).strip().replace("_", "")
        if len(cleaned) > 24 or not cleaned.lstrip("+-").isdigit():
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not an integer "
                                             f"({low}..{high})")
        value = int(cleaned)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is outside {low}..{high:,}")
        return value

    parse.__name__ = "integer"
    return parse


def fraction(low: float, high: float, inclusive_low: bool = True):
    """An argparse type: a finite number in ``low..high``."""

    def parse(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not a number") from None
        if not math.isfinite(value) or not (low <= value if inclusive_low else low < value) \
                or value > high:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is outside {low:g}..{high:g}")
        return value

    parse.__name__ = "number"
    return parse


def free_text(what: str, max_chars: int = bounds.MAX_NAME_CHARS):
    """An argparse type: a name or path -- not empty, no control characters (a newline would
    become a live line in an exported script), at most ``max_chars`` characters.  Other
    unicode is taken as given."""

    def parse(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"empty value; give {what}")
        try:
            return bounds.check_text("value", value, max_chars=max_chars, what=what)
        except PlanInputError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix("value ")) from None

    parse.__name__ = "text"
    return parse


NAME = free_text("a name or path")
PATH = free_text("a path")


def _shown(text: str, limit: int = 40) -> str:
    text = str(text)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def gpu_counts(text: str):
    """An argparse type: a GPU count (int), or a sizing sweep's range, list or ``auto`` (the
    text, read by :func:`planner.sizing.counts.parse_counts` once the node size is known)."""
    cleaned = str(text).strip()
    if cleaned.lower() == "auto" or "," in cleaned or "-" in cleaned.lstrip("-+"):
        return cleaned
    return integer(1, MAX_GPUS)(text)


gpu_counts.__name__ = "GPU count, range or list"


def cluster_args(parser: argparse.ArgumentParser, required: bool = True,
                 sweep: bool = False) -> None:
    group = parser.add_argument_group("model and cluster")
    group.add_argument("--model", type=NAME, required=required,
                       help="catalog name or alias (qwen3-30b, llama3.1-70b, deepseek-v3, ...) "
                            "or a local model directory / config.json")
    if sweep:
        group.add_argument("--gpus", type=gpu_counts,
                           help=f"number of GPUs, 1..{MAX_GPUS:,} (default: the local GPUs "
                                f"NVML reports); a range (8-256: every count of whole nodes), "
                                f"a list (8,16,32) or auto sizes the cluster")
        group.add_argument("--gpu-type", type=NAME,
                           help="GPU catalog name (h100, h200, h20, b200, ...), or a list "
                                "(h100,h200,h20) to size the cluster; default: detected through "
                                "NVML, else H100-80GB")
    else:
        group.add_argument("--gpus", type=integer(1, MAX_GPUS),
                           help=f"number of GPUs, 1..{MAX_GPUS:,} (default: the local GPUs NVML "
                                f"reports)")
        group.add_argument("--gpu-type", type=NAME,
                           help="GPU catalog name (h100, h200, h20, b200, ...); default: "
                                "detected through NVML, else H100-80GB")
    group.add_argument("--gpus-per-node", type=integer(1, MAX_GPUS_PER_NODE),
                       help="GPUs per node (default 8, or the detected count)")
    group.add_argument("--host-memory-gib", type=fraction(1, 1 << 20),
                       help="host RAM per node in GiB (default: the GPU type's typical server, "
                            "e.g. 2048 for 8 x H100); offload and the CPU optimizer must fit")


def sizing_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "size the cluster (with a range or list of --gpus or --gpu-type, or any flag below)")
    prices = group.add_mutually_exclusive_group()
    prices.add_argument("--price", metavar="GPU=PRICE,...",
                        help="price of one GPU-hour per GPU type, e.g. h100=2.5,h200=3.4 "
                             "(nothing is built in; without prices, GPU-hours but no cost)")
    prices.add_argument("--prices", metavar="FILE",
                        help="the same as a TOML or JSON table: h100 = 2.5 (optionally under "
                             "[prices], with currency = \"$\")")
    group.add_argument("--steps", type=integer(1, 1 << 30),
                       help="training steps of the run (default 100)")
    group.add_argument("--epochs", type=integer(1, 1 << 20),
                       help="epochs over --dataset-prompts instead of --steps")
    group.add_argument("--dataset-prompts", type=integer(1, 1 << 40),
                       help="prompts in the training set (verl runs floor(prompts / "
                            "--train-batch-size) steps per epoch)")
    group.add_argument("--min-scaling", type=fraction(1.0, 16.0, inclusive_low=False),
                       default=1.5, help="a doubling of GPUs past the knee speeds the step up "
                                         "less than this (default 1.5)")


def memory_band_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--memory-band", type=NAME, metavar="LOW-HIGH",
                        help="fraction of GPU memory a peak should sit in (default 0.70-0.85, "
                             "the band users watch in nvidia-smi; 0.70-0.95 fills the GPU)")


class DefaultInt(int):
    """An integer flag's default, told apart from the same value typed by the user."""


def workload_args(parser: argparse.ArgumentParser) -> None:
    from_defaults = {  # verl GRPO example defaults, see planner/catalog/workload.py
        "train_batch_size": (1024, MAX_BATCH), "rollout_n": (5, 4096),
        "prompt_length": (1024, MAX_TOKENS), "response_length": (1024, MAX_TOKENS),
        "mini_batch_size": (256, MAX_BATCH), "ppo_epochs": (1, 1000)}
    group = parser.add_argument_group("GRPO workload (verl's data/actor settings)")
    for name, (default, high) in from_defaults.items():
        # a default marks itself (planner.cli.inputs.workload says '(the default)' when the
        # mini-batch's does not suit the --train-batch-size given)
        group.add_argument(f"--{name.replace('_', '-')}", type=integer(1, high),
                           default=DefaultInt(default), help=f"default {default}")
    # 0 is the library's "not given"; a user who types it gets the range, not the default
    group.add_argument("--mean-response-length", type=integer(1, MAX_TOKENS), default=0,
                       help="tokens generated per response on average, fixed over the run "
                            "(time follows it; default: the published runs' lengths for the "
                            "kind of job, see --response-lengths)")
    group.add_argument("--response-lengths", type=free_text("MEAN[,P90] or START:END", 64),
                       metavar="MEAN[,P90]|START:END|KIND",
                       help="mean response length (tokens, or N%% of --response-length), "
                            "with its 90th percentile, or its start:end over the run, or a kind "
                            "of job (math, math-reasoning) for its published lengths; default: "
                            "the published lengths for the model's kind of job. Plans time the "
                            "start, middle and end of the run and rank by the expected step "
                            "time")
    group.add_argument("--lengths-from", type=PATH, metavar="RUN",
                       help="take the lengths from a previous verl run: its file-logger "
                            "JSONL, console log, a wandb/MLflow CSV export or a folder "
                            "holding one")
    group.add_argument("--mean-prompt-length", type=integer(1, MAX_TOKENS), default=0,
                       help="prompt tokens on average (time follows it, memory the maximum; "
                            "default: --prompt-length)")
    group.add_argument("--overlap-grad-reduce", action="store_true",
                       help="the job sets megatron override_ddp_config.overlap_grad_reduce "
                            "(verl's default leaves the DP gradient traffic exposed)")
    group.add_argument("--precision", default=None, choices=("bf16", "fp16", "fp8"),
                       help="training precision (default bf16; fp16 on GPUs without BF16, "
                            "V100)")
    group.add_argument("--max-num-seqs", type=integer(1, MAX_BATCH), default=256,
                       help="rollout engine's max concurrent sequences (default 256, verl's)")
    group.add_argument("--workload", choices=("grpo", "pretrain"), default="grpo",
                       help="grpo (verl) or a plain Megatron pretraining step")
    group.add_argument("--seq-len", type=integer(1, MAX_TOKENS), default=DefaultInt(4096),
                       help="pretrain: sequence length")
    group.add_argument("--global-batch", type=integer(1, MAX_BATCH), default=DefaultInt(1024),
                       help="pretrain: sequences per optimizer step")
    group.add_argument("--calibration", type=PATH,
                       help="efficiency constants fitted for your cluster "
                                             "(JSON from `plan-parallel calibrate`)")
    algo = parser.add_argument_group("algorithm, kernels and rollout engine (verl keys)")
    algo.add_argument("--kl-loss", action=argparse.BooleanOptionalAction, default=True,
                      help="actor.use_kl_loss: GRPO's KL loss needs the reference model "
                           "(default on, as verl's GRPO examples)")
    algo.add_argument("--kl-in-reward", action="store_true",
                      help="algorithm.use_kl_in_reward (also runs the reference)")
    algo.add_argument("--bypass-old-log-prob", action="store_true",
                      help="algorithm.rollout_correction.bypass_mode: old log-probs are the "
                           "rollout's, verl skips the old-log-prob pass")
    algo.add_argument("--fused-kernels", action="store_true",
                      help="model.use_fused_kernels: log-probs without full-vocabulary logits")
    algo.add_argument("--entropy-chunk-size", type=integer(0, MAX_TOKENS), default=0,
                      help="entropy_from_logits_with_chunking with this chunk (0: off)")
    algo.add_argument("--grad-reduce-in-fp32", action=argparse.BooleanOptionalAction,
                      default=True, help="fp32 main-grad buffer (verl's default) or bf16")
    algo.add_argument("--adam-moments", choices=("fp32", "bf16"), default="fp32",
                      help="optim.exp_avg(_sq)_dtype (bf16: the precision-aware optimizer)")
    algo.add_argument("--rollout-engine", choices=("vllm", "sglang"), default="vllm")
    algo.add_argument("--rollout-precision", choices=("bf16", "fp8"), default="bf16",
                      help="rollout weights and KV cache (fp8: rollout.quantization=fp8)")
    algo.add_argument("--enforce-eager", action="store_true",
                      help="rollout.enforce_eager: no CUDA graphs (slower decode, less memory)")
    algo.add_argument("--free-cache-engine", action=argparse.BooleanOptionalAction,
                      default=True, help="rollout.free_cache_engine: the engine sleeps during "
                                         "training (default on)")
    algo.add_argument("--max-num-batched-tokens", type=integer(1, MAX_TOKENS), default=8192,
                      help="rollout.max_num_batched_tokens (chunked-prefill size, default 8192)")
    algo.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                      help="rollout.enable_prefix_caching: the n samples share a prompt's KV")
    # speculative decoding and MTP (actor_rollout_ref.model.mtp); "draft"/"eagle"/"eagle3" are
    # accepted here so the workload refuses them by name (verl cannot run a separate drafter)
    algo.add_argument("--speculative", choices=("off", "mtp", "draft", "eagle", "eagle3"),
                      default="off", metavar="{off,mtp}",
                      help="speculative decoding in rollout: mtp drafts with the model's own "
                           "MTP layers (model.mtp.enable + enable_rollout)")
    algo.add_argument("--speculative-tokens", type=integer(1, 16), default=1,
                      help="model.mtp.num_speculative_tokens: tokens drafted per step (k, "
                           "default 1)")
    algo.add_argument("--acceptance-length", type=fraction(1.0, 17.0), default=0.0,
                      help="mean tokens one verification step advances (1..k+1; default: 85%% "
                           "acceptance per drafted token, DeepSeek-V3 report: 1.85 at k=1)")
    algo.add_argument("--train-mtp", action="store_true",
                      help="model.mtp.enable_train: train the MTP layers with their loss")


class _ModeChoices:
    """``--mode``'s choices: the registered training modes and ``best``
    (:func:`planner.modes.mode_choices`), read when argparse first asks -- building the parser
    and ``plan-parallel --help`` import no planning code.  No ``--mode``: the baseline, set by
    :func:`planner.cli.main.main`."""

    def _names(self) -> tuple[str, ...]:
        from planner.modes import mode_choices

        return mode_choices()

    def __contains__(self, value) -> bool:
        return value in self._names()

    def __iter__(self):
        return iter(self._names())

    def baseline(self) -> str:
        """What no ``--mode`` means: the first registered mode (the CLI reference shows it as
        the default)."""
        return self._names()[0]


MODE_CHOICES = _ModeChoices()


def mode_args(parser: argparse.ArgumentParser, what: str = "best: all side by side") -> None:
    """``--mode`` and verl's asynchronous-training settings (planner/placement.py)."""
    group = parser.add_argument_group("training mode: colocated or separate rollout/trainer pools")
    group.add_argument("--mode", choices=MODE_CHOICES,
                       default=None,
                       help=f"sync: colocated hybrid engine (default); one-step-off / "
                            f"fully-async: verl.experimental's separate pools; {what}")
    group.add_argument("--staleness-threshold", type=fraction(0.0, 16.0), default=0.1,
                       help="fully-async: async_training.staleness_threshold (default 0.1)")
    group.add_argument("--trigger-parameter-sync-step", type=integer(0, 1 << 20), default=0,
                       help="fully-async: mini-batch updates between parameter syncs "
                            "(default 0: train-batch-size / mini-batch-size)")
    group.add_argument("--partial-rollout", action=argparse.BooleanOptionalAction, default=True,
                       help="fully-async: async_training.partial_rollout (default on)")
    group.add_argument("--trainer-gpus", type=integer(1, 1 << 20), action="append", default=[],
                       help="trainer pool size to try (repeatable; default: every whole-node "
                            "split)")


LAYOUT_INTS = (("tp", "tensor parallel", MAX_PARALLEL), ("pp", "pipeline parallel", MAX_LAYERS),
               ("vpp", "virtual pipeline stages per rank", MAX_VPP),
               ("cp", "context parallel", MAX_PARALLEL), ("ep", "expert parallel", MAX_PARALLEL),
               ("etp", "expert tensor parallel", MAX_PARALLEL),
               ("micro-batch", "micro-batch size per GPU", MAX_BATCH),
               ("rollout-tp", "rollout engine tensor parallel", MAX_PARALLEL),
               ("rollout-dp", "rollout engine data parallel (MoE expert parallel)", MAX_PARALLEL),
               ("rollout-ep", "rollout engine expert parallel (1 or TP*DP)", MAX_PARALLEL),
               ("first-stage-layers", "layers on the first pipeline stage (uneven)", MAX_LAYERS),
               ("last-stage-layers", "layers on the last pipeline stage (uneven)", MAX_LAYERS))


def layout_args(parser: argparse.ArgumentParser, required: bool) -> None:
    group = parser.add_argument_group(
        "layout" if required else "pin layout values (the search keeps the rest free)")
    for name, text, high in LAYOUT_INTS:
        group.add_argument(f"--{name}", type=integer(1, high), help=f"{text} (1..{high})")
    group.add_argument("--recompute", choices=("none", "selective", "full"))
    group.add_argument("--recompute-modules", type=NAME, metavar="M,M",
                       help="selective: megatron-core recompute_modules (core_attn, layernorm, "
                            "moe_act, mla_up_proj, mlp, moe, shared_experts)")
    group.add_argument("--recompute-method", choices=("uniform", "block"),
                       help="full: recompute chunks of layers (uniform) or the first N layers "
                            "of each stage (block)")
    group.add_argument("--recompute-num-layers", type=integer(1, MAX_LAYERS),
                       help="full: layers per chunk (uniform) or recomputed layers (block)")
    for name in ("param-offload", "optimizer-offload", "ref-param-offload"):
        group.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None)
    group.add_argument("--optimizer-cpu-offload", action=argparse.BooleanOptionalAction,
                       default=None, help="Megatron's CPU optimizer: optimizer state and Adam "
                                          "step on the host (optimizer_cpu_offload)")
    group.add_argument("--optimizer-offload-fraction", type=fraction(0.0, 1.0),
                       help="share of the optimizer on the host, 0..1 (default 1 with "
                            "--optimizer-cpu-offload)")
    group.add_argument("--dynamic-batch", action=argparse.BooleanOptionalAction, default=None,
                       help="verl's use_dynamic_bsz: micro-batches packed to a token budget "
                            "(plans use it unless --no-dynamic-batch)")
    group.add_argument("--max-token-len-per-gpu", type=integer(1, MAX_TOKENS),
                       help="ppo_max_token_len_per_gpu, the update's token budget")
    group.add_argument("--log-prob-max-token-len-per-gpu", type=integer(1, MAX_TOKENS),
                       help="log_prob_max_token_len_per_gpu (default: the update's budget)")
    group.add_argument("--log-prob-micro-batch", type=integer(1, MAX_BATCH),
                       help="log_prob_micro_batch_size_per_gpu (default: --micro-batch)")
    group.add_argument("--account-for-embedding-in-pipeline-split", action="store_true",
                       help="count the embedding as a pipeline layer (megatron-core)")
    group.add_argument("--account-for-loss-in-pipeline-split", action="store_true",
                       help="count the loss as a pipeline layer (megatron-core)")
    group.add_argument("--pipeline-layout", type=free_text("a pipeline layout", 1 << 16),
                       metavar="LAYOUT",
                       help="pipeline_model_parallel_layout string, e.g. 'Et*3|(tt|)*29,m|L'")
    group.add_argument("--gpu-memory-utilization", type=fraction(0.05, 0.99),
                       help="rollout engine's memory fraction, 0.05..0.99 (default: picked per "
                            "layout)")


def output_args(parser: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    parser.add_argument("--format", choices=formats, default=formats[0])


def job_input_args(parser: argparse.ArgumentParser) -> None:
    """What validate, fix and diff read a job with."""
    parser.add_argument("--set", type=free_text("VAR=VALUE", 1 << 16),
                        action="append", default=[], metavar="VAR=VALUE",
                        help="environment variable for the script's $VAR / ${VAR:-...} and "
                             "YAML ${oc.env:VAR} (repeatable)")
    parser.add_argument("--model", type=NAME,
                        help="model for the checks and the memory estimate when "
                                        "actor_rollout_ref.model.path has no readable "
                                        "config.json (catalog name or config.json)")
    parser.add_argument("--gpu-type", type=NAME,
                        help="GPU catalog name (default: detected through NVML, "
                                           "else H100-80GB)")
    parser.add_argument("--gpus", type=integer(1, 1 << 20), default=None,
                        help="asynchronous jobs: the cluster the trainer and rollout pools must "
                             "add up to")
    memory_band_args(parser)


def _plan_parser(sub) -> None:
    plan = sub.add_parser("plan", help="rank every valid layout (the default command); with "
                                       "a range of --gpus or a list of --gpu-type, size the "
                                       "cluster")
    cluster_args(plan, sweep=True)
    workload_args(plan)
    layout_args(plan, required=False)
    memory_band_args(plan)
    sizing_args(plan)
    output_args(plan, ("table", "json", "csv"))
    plan.add_argument("--top", type=integer(1, 1 << 30), default=10,
                      help="layouts to show (default 10)")
    plan.add_argument("--no-offload", action="store_true",
                      help="leave every offload (actor parameters, optimizer, CPU optimizer, "
                           "reference parameters) out of the search")
    plan.add_argument("--tie-tolerance", type=fraction(0.0, 0.99), metavar="FRACTION",
                      help="layouts within this step-time ratio of the best are ties, listed "
                           "simplest first (default: the model's ranking uncertainty from the "
                           "calibration file; 0 ranks strictly by the prediction)")
    mode_args(plan)
    export = plan.add_argument_group("export the chosen layout as a runnable verl job")
    export.add_argument("--write", type=PATH,
                        metavar="DIR", help="write launch script, Hydra config and "
                                                       "plan.json for the chosen layout")
    export.add_argument("--rank", type=integer(1, 1 << 30), default=1,
                        help="which ranked layout (default 1)")
    export.add_argument("--force", action="store_true", help="overwrite files in DIR")
    export.add_argument("--model-path", type=PATH, help="HF model directory for the job (default: "
                                              "$MODEL_PATH in the script)")
    export.add_argument("--train-files", type=PATH, help="training parquet (default: $TRAIN_FILES)")
    export.add_argument("--val-files", type=PATH, help="validation parquet (default: $VAL_FILES)")
    export.add_argument("--override", type=free_text("KEY=VALUE", 1 << 16),
                        action="append", default=[], metavar="KEY=VALUE",
                        help="extra Hydra override for the job (repeatable)")


def _estimate_parser(sub) -> None:
    estimate = sub.add_parser("estimate", help="memory and time of one layout, with breakdowns")
    cluster_args(estimate)
    workload_args(estimate)
    layout_args(estimate, required=True)
    memory_band_args(estimate)
    output_args(estimate, ("table", "json"))
    mode_args(estimate, "the layout on separate pools: the actor layout above on the trainer "
                        "pool, the rollout flags (or the best rollout layout) on the rollout "
                        "pool; best is for plan and explain")


def _validate_parser(sub) -> None:
    parser = sub.add_parser("validate", help="dry-run a verl launch script, Hydra YAML or "
                                             "overrides",
                            description="Dry-run a verl GRPO job (Megatron backend): compose its "
                                        "config as verl would, run verl's validation and the "
                                        "checks it leaves to run time, and estimate memory.  "
                                        "Exit 0: would launch; 1: would not; 2: unreadable "
                                        "input.")
    parser.add_argument("inputs", nargs="*", metavar="PATH | -- KEY=VALUE",
                        type=free_text("a path or KEY=VALUE", 1 << 16),
                        help="a launch script (bash) or Hydra YAML, and/or Hydra overrides "
                             "after `--`")
    job_input_args(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text")


def _fix_parser(sub) -> None:
    parser = sub.add_parser("fix", help="mitigations for a config outside the memory band, "
                                        "cheapest first",
                            description="List the mitigations for a verl job that does not fit "
                                        "or sits outside the memory band, cheapest first.")
    parser.add_argument("inputs", nargs="*", metavar="PATH | -- KEY=VALUE",
                        type=free_text("a path or KEY=VALUE", 1 << 16),
                        help="a launch script, Hydra YAML and/or overrides, as for validate")
    job_input_args(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--write", type=PATH,
                        metavar="DIR", help="write the best mitigation as a job")
    parser.add_argument("--force", action="store_true", help="overwrite files in DIR")
    parser.add_argument("--top", type=integer(1, 1000), default=8,
                        help="mitigations to list (default 8)")


def _diff_parser(sub) -> None:
    parser = sub.add_parser("diff", help="what changes between two configs, its risk and effect",
                            description="Compare two verl jobs: changed settings, risk, "
                                        "predicted effect.")
    parser.add_argument("a", type=PATH, help="the current job (launch script or Hydra YAML)")
    parser.add_argument("b", type=PATH, help="the changed job")
    job_input_args(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text")


def _explain_parser(sub) -> None:
    parser = sub.add_parser("explain", help="the chosen layout next to the rules of thumb, in "
                                            "words")
    cluster_args(parser)
    workload_args(parser)
    memory_band_args(parser)
    parser.add_argument("--format", choices=("table", "json"), default="table")
    mode_args(parser, "the chosen split in words (bottleneck, idle, neighbouring splits, "
                      "sync share, staleness); best: which mode wins and by how much")


def _profile_parser(sub) -> None:
    parser = sub.add_parser("profile", help="communication analysis of PyTorch profiler traces")
    parser.add_argument("traces", type=PATH, nargs="+", metavar="TRACE",
                        help="PyTorch profiler Chrome trace(s), .json or .json.gz, or a folder")
    parser.add_argument("--format", choices=("table", "json"), default="table")


def _report_parser(sub) -> None:
    parser = sub.add_parser("report", help="HTML report of a plan or a tuning sweep")
    parser.add_argument("sweep", type=PATH,
                        nargs="?", help="a sweep folder (plan-parallel tune --write "
                                                 "or --sweep-dir)")
    parser.add_argument("--html", type=PATH,
                        default=None, help="output HTML (default: report.html in the "
                                                     "sweep folder, or ./report.html)")
    parser.add_argument("--png-dir", type=PATH,
                        default=None, help="also write the figures as PNG files")
    parser.add_argument("--force", action="store_true", help="overwrite an existing report")
    cluster_args(parser, required=False, sweep=True)
    workload_args(parser)
    memory_band_args(parser)
    sizing_args(parser)


def _tune_parser(sub) -> None:
    parser = sub.add_parser("tune", help="run short real verl GRPO trials with Optuna")
    cluster_args(parser)
    workload_args(parser)
    layout_args(parser, required=False)
    study = parser.add_argument_group("study (Optuna)")
    study.add_argument("--trials", type=integer(1, 100_000), default=20,
                       help="measured trials the study should have (default 20; several tuners "
                            "on one study share this count)")
    study.add_argument("--timeout", type=NAME,
                       help="start no trial after this long, e.g. 8h (default: "
                                         "no limit)")
    study.add_argument("--study-name", type=NAME,
                       help="default: derived from model, GPUs and workload")
    study.add_argument("--storage", type=NAME,
                       help="SQLAlchemy URL (sqlite:///f.db, postgresql://user:pass"
                                         "@host/db) or journal:PATH (default: SQLite in the "
                                         "sweep directory)")
    study.add_argument("--sweep-dir", type=PATH,
                       help="trial directories, logs, study.db, trials.csv "
                                           "(default: sweeps/<study name>)")
    study.add_argument("--steps", type=integer(1, 100_000), default=5,
                       help="training steps per trial (trainer.total_training_steps, default 5)")
    study.add_argument("--warmup-steps", type=integer(0, 100_000), default=1,
                       help="first steps left out of the medians (default 1)")
    study.add_argument("--top-k", type=integer(1, 100_000), default=TUNE_DEFAULTS["top_k"],
                       help=f"predicted best layouts run first (default "
                            f"{TUNE_DEFAULTS['top_k']})")
    study.add_argument("--first-trials", choices=FIRST_TRIALS,
                       default=TUNE_DEFAULTS["first_trials"],
                       help="which layouts run first: the simplest ties, one tie per TP/EP/PP "
                            "family (spread), or the best-predicted layout of each family "
                            f"(ucb) (default {TUNE_DEFAULTS['first_trials']}; "
                            "docs/tuning/regret.md)")
    study.add_argument("--patience", type=integer(0, 100_000), default=0,
                       help="stop after this many trials without improvement (default 0: "
                            "never)")
    study.add_argument("--min-improvement", type=fraction(0.0, 10.0), default=0.01,
                       help="what counts as an improvement for --patience, 0..10 (default 0.01 "
                            "= 1%%)")
    study.add_argument("--multi-objective", action="store_true",
                       help="also minimise measured peak GPU memory")
    study.add_argument("--sampler", choices=SAMPLERS,
                       default=TUNE_DEFAULTS["sampler"],
                       help="guided: the cost model's prediction corrected by the measured "
                            "trials (errors shared by TP/EP/PP and the other knobs), the "
                            "highest upper bound next; tpe/random: Optuna's over the layout "
                            f"fields (default {TUNE_DEFAULTS['sampler']})")
    study.add_argument("--ucb-width", type=fraction(0.0, 10.0),
                       default=TUNE_DEFAULTS["ucb_width"],
                       help="guided: how far the next layout's optimistic bound reaches, in "
                            "posterior standard deviations of its throughput (default "
                            f"{TUNE_DEFAULTS['ucb_width']:g}; docs/tuning/regret.md)")
    study.add_argument("--phase-model", choices=PHASE_MODELS,
                       default=TUNE_DEFAULTS["phase_model"],
                       help="guided: on fits the model's error per GRPO phase (generation, "
                            "log-prob, update, sync) from each trial's verl timers, so a "
                            "rollout layout and a training layout measured apart combine; off "
                            f"fits the step's (default {TUNE_DEFAULTS['phase_model']}; "
                            "docs/tuning/regret.md)")
    study.add_argument("--pruner", choices=PRUNERS,
                       help="stop a trial that trails the study's best at equal steps; "
                            "probe: every trial stops after one step past its warm-up unless "
                            f"it is near the best (default {TUNE_DEFAULTS['pruner']}, none with "
                            "--multi-objective; none: every trial runs --steps)")
    study.add_argument("--stop-when-confident", action=argparse.BooleanOptionalAction,
                       default=TUNE_DEFAULTS["stop_when_confident"],
                       help="stop when no untried layout is predicted to beat the best "
                            "measured one by more than the model's error (default "
                            f"{'on' if TUNE_DEFAULTS['stop_when_confident'] else 'off'})")
    study.add_argument("--seed", type=integer(0, 2**32 - 1))
    study.add_argument("--memory-margin", type=fraction(0.0, 0.95), default=0.0,
                       help="run only layouts predicted to fit with this fraction of GPU memory "
                            "to spare (default 0); measured OOMs raise it per phase")
    study.add_argument("--max-candidates", type=integer(1, 10_000_000), default=5000,
                       help="predicted best layouts the study may choose from (default 5000)")
    study.add_argument("--no-offload", action="store_true",
                       help="leave parameter/optimizer offload out of the search")
    trial = parser.add_argument_group("trials")
    trial.add_argument("--launcher", choices=("local", "ray"), default="local",
                       help="local: a process group on this node; ray: a job on a Ray cluster")
    trial.add_argument("--ray-address", type=NAME, help="Ray dashboard address for --launcher ray "
                                             "(default $RAY_ADDRESS or http://127.0.0.1:8265)")
    trial.add_argument("--no-shared-fs", action="store_true",
                       help="ray: the cluster cannot see the sweep directory (metrics come "
                            "from the job's console log)")
    trial.add_argument("--trainer-command", type=free_text("a command", 1 << 16),
                       help="command before the overrides (default "
                                                 "'python3 -m verl.trainer.main_ppo'; e.g. "
                                                 "'srun --ntasks=1 python3 -m ...')")
    trial.add_argument("--trial-timeout", type=NAME, default="30m",
                       help="wall-clock limit of one trial (default 30m)")
    trial.add_argument("--hang-timeout", type=NAME, default="10m",
                       help="stop a trial whose log and metrics stop growing this long "
                            "(default 10m)")
    trial.add_argument("--stop-grace", type=NAME, default="15s",
                       help="SIGTERM-to-SIGKILL delay when stopping a trial (default 15s, at "
                            "most 10m)")
    trial.add_argument("--trial-env", type=free_text("NAME=VALUE", 1 << 16),
                       action="append", default=[], metavar="NAME=VALUE",
                       help="environment variable for every trial (repeatable)")
    trial.add_argument("--heartbeat-interval", type=integer(1, 86_400), default=30,
                       help="seconds between a running trial's heartbeats (default 30)")
    trial.add_argument("--grace-period", type=integer(1, 86_400), default=120,
                       help="a trial without heartbeat this long lost its tuner and is retried "
                            "(default 120)")
    trial.add_argument("--max-retry", type=integer(0, 1000), default=3,
                       help="retries of a trial whose tuner died (default 3)")
    _tune_safety_args(parser, trial)
    _tune_mode_args(parser)
    export = parser.add_argument_group("the verl job (trials and the written-back best layout)")
    export.add_argument("--write", type=PATH, metavar="DIR",
                        help="write the best measured layout as a verl job (and trials.csv)")
    export.add_argument("--model-path", type=PATH, help="HF model directory (default $MODEL_PATH)")
    export.add_argument("--train-files", type=PATH, help="training parquet (default $TRAIN_FILES)")
    export.add_argument("--val-files", type=PATH, help="validation parquet (default $VAL_FILES)")
    export.add_argument("--override", type=free_text("KEY=VALUE", 1 << 16),
                        action="append", default=[], metavar="KEY=VALUE",
                        help="extra Hydra override for the job (repeatable)")


def fraction_list(low: float, high: float):
    """An argparse type: comma-separated numbers in ``low..high`` (duplicates dropped)."""
    one = fraction(low, high)

    def parse(text: str) -> tuple[float, ...]:
        parts = [part for part in str(text).split(",") if part.strip()]
        if not parts or len(parts) > 64:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not a list of 1 to 64 numbers "
                                             f"({low:g}..{high:g}), e.g. 0,0.1,0.3")
        return tuple(dict.fromkeys(round(one(part), 2) for part in parts))

    parse.__name__ = "list of numbers"
    return parse


def _tune_mode_args(parser) -> None:
    """tune's training modes: the split and the staleness threshold as trial parameters
    (trials/candidates.py)."""
    group = parser.add_argument_group("training mode (tune the split and the staleness)")
    group.add_argument("--mode", choices=MODE_CHOICES,
                       default=None,
                       help="sync: colocated layouts (default); one-step-off / fully-async: "
                            "the splits into trainer and rollout pools; best: all three in "
                            "one study")
    group.add_argument("--trainer-gpus", type=integer(1, 1 << 20), action="append", default=[],
                       help="trainer pool size to try (repeatable; default: every legal split)")
    group.add_argument("--staleness-grid", type=fraction_list(0.0, 16.0),
                       help="fully-async: async_training.staleness_threshold values to try "
                            "(default 0,0.1,0.3,0.5)")
    group.add_argument("--partial-rollout", action=argparse.BooleanOptionalAction, default=True,
                       help="fully-async: async_training.partial_rollout (default on)")


def _tune_safety_args(parser, trial) -> None:
    """tune's limits, secrets, checks and overwrite protection (trials/, planner/cli/tune.py)."""
    trial.add_argument("--max-log-bytes", type=integer(1 << 20, 1 << 50), default=256 << 20,
                       help="stop a trial whose trainer.log outgrows this many bytes and "
                            "record it failed (default 268435456 = 256 MiB)")
    trial.add_argument("--fail-fast", type=integer(0, 1000), default=3, metavar="K",
                       help="stop when the first K trials all fail with one cause (default 3; "
                            "0: never)")
    trial.add_argument("--skip-checks", action="store_true",
                       help="do not run `plan-parallel doctor`'s checks before the first trial")
    parser.add_argument("--storage-password-file", metavar="FILE",
                        help="read the --storage (or $PLAN_PARALLEL_STORAGE) URL's password "
                             "from FILE instead of the command line")
    parser.add_argument("--force", action="store_true",
                        help="let --write replace a job it did not write for this study")


def _doctor_parser(sub) -> None:
    parser = sub.add_parser("doctor", help="check this machine can run `tune`'s verl trials")
    cluster_args(parser, required=False)
    workload_args(parser)
    for flag, text in (("--model-path", "HF model directory (default $MODEL_PATH)"),
                       ("--train-files", "training parquet (default $TRAIN_FILES)"),
                       ("--val-files", "validation parquet (default $VAL_FILES)")):
        parser.add_argument(flag, help=text)
    parser.add_argument("--launcher", choices=("local", "ray"), default="local")
    parser.add_argument("--ray-address", help="Ray dashboard address for --launcher ray "
                                              "(default $RAY_ADDRESS or http://127.0.0.1:8265)")
    parser.add_argument("--trainer-command", help="as for tune (default 'python3 -m "
                                                  "verl.trainer.main_ppo')")


def _calibrate_parser(sub) -> None:
    parser = sub.add_parser("calibrate", help="fit efficiency constants from measured trials")
    parser.add_argument("sweep_dir", type=PATH, nargs="?", metavar="SWEEP_DIR",
                        help="a `plan-parallel tune` sweep directory (its sweep.json names the "
                             "study and storage)")
    parser.add_argument("--storage", type=NAME,
                        help="the study's storage URL instead (sqlite:///..., "
                                          "postgresql://..., journal:PATH)")
    parser.add_argument("--study-name", type=NAME,
                        help="which study (default: the sweep's, or the only "
                                             "plan-parallel study in the storage)")
    parser.add_argument("--calibration", type=PATH,
                        help="calibration to start from and compare with "
                                              "(default: the shipped one)")
    parser.add_argument("--output", "-o", type=PATH, help="file to write (default: SWEEP_DIR/"
                                               "calibration.json, else ./calibration.json)")
    parser.add_argument("--force", action="store_true", help="overwrite --output")


def _catalog_parsers(sub) -> None:
    models = sub.add_parser("models", help="list the built-in model catalog")
    output_args(models, ("table", "json"))
    models.add_argument("--supported", action="store_true",
                        help="list the architectures verl runs on Megatron (Megatron-Bridge, "
                             "mbridge, verl's registry), which plan-parallel plans, and the "
                             "use_mbridge/vanilla_mbridge each needs")
    gpus = sub.add_parser("gpus", help="list the GPU catalog")
    output_args(gpus, ("table", "json"))


def _advise_parser(sub) -> None:
    parser = sub.add_parser(
        "advise", help="what to change in the verl job you are running, from its run",
        description="Read a verl run's metrics (file-logger JSONL, console log, wandb or MLflow "
                    "CSV export, or a folder holding one) and its job; print measured vs "
                    "predicted time per phase, this cluster's constants fitted from the run, "
                    "the re-plan at the run's real lengths, the best change and whether the "
                    "lengths drifted enough for a re-plan to pay.  Exit 0: answered; 1: no "
                    "layout fits at the run's lengths; 2: unreadable run or job.")
    parser.add_argument("run", type=PATH, metavar="RUN_DIR_OR_LOG",
                        help="the run's metrics: a .jsonl, a console log, a .csv export, an "
                             "MLflow run folder, or a folder holding one")
    parser.add_argument("--job", type=PATH, metavar="SCRIPT",
                        help="the job's launch script or Hydra YAML (default: the run folder's "
                             "run_grpo.sh when plan-parallel wrote the job there)")
    job_input_args(parser)
    parser.add_argument("--calibration", type=PATH,
                        help="calibration to start from and compare with (default: the "
                             "shipped one)")
    parser.add_argument("--warmup-steps", type=integer(0, 100_000), default=1,
                        help="first steps left out of the medians (default 1)")
    parser.add_argument("--write-calibration", type=PATH, metavar="FILE",
                        help="also write the constants fitted from the run (for --calibration)")
    parser.add_argument("--force", action="store_true",
                        help="let --write-calibration replace an existing file")
    parser.add_argument("--format", choices=("text", "json"), default="text")


SUBCOMMANDS = ("plan", "estimate", "validate", "tune", "calibrate", "profile", "explain", "fix",
               "diff", "report", "models", "gpus", "doctor", "advise")


# the function that adds each subcommand's parser (``models`` and ``gpus`` share one), in the
# order ``--help`` lists them
_ADDERS = {"plan": _plan_parser, "estimate": _estimate_parser, "validate": _validate_parser,
           "tune": _tune_parser, "doctor": _doctor_parser, "calibrate": _calibrate_parser,
           "profile": _profile_parser, "explain": _explain_parser, "fix": _fix_parser,
           "diff": _diff_parser, "report": _report_parser, "models": _catalog_parsers,
           "gpus": _catalog_parsers, "advise": _advise_parser}
assert set(_ADDERS) == set(SUBCOMMANDS)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command`` (one of :data:`SUBCOMMANDS`), its parser
    alone under the top level: the same arguments, defaults and messages for that command, and
    a start that builds one subcommand's arguments instead of the 480 of all (about 15 ms of
    every command's start)."""
    parser = Parser(
        prog="plan-parallel",
        description="Find the best parallel layout for verl GRPO training with Megatron: "
                    "memory and time of every phase for every valid layout, ranked.",
        epilog="Without a subcommand, `plan` runs: plan-parallel --model qwen3-30b --gpus 16")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    adders = _ADDERS.values() if command is None else (_ADDERS[command],)
    for add in dict.fromkeys(adders):
        add(sub)
    return parser
