"""A planned layout as a runnable verl GRPO job for the Megatron backend.

Targets **verl 0.9.1** (the release CI installs, ``requirements-ci.txt``): the backend is chosen
with ``model_engine=megatron`` on verl's ``ppo_trainer`` config, and only keys that release has
are written (no ``grad_offload``; ``num_layers_in_first/last_pipeline_stage`` are new keys of
``override_transformer_config`` and take Hydra's ``+``).

One function, :func:`job_overrides`, turns (model, cluster, workload, layout) into the Hydra
overrides of ``python3 -m verl.trainer.main_ppo``.  The launch script, the Hydra config file,
``plan-parallel validate``'s round trip and the trials package all use that list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from planner.bounds import check_text
from planner.catalog.hardware import ClusterSpec
from planner.catalog.models import ModelSpec
from planner.catalog.workload import GrpoWorkload
from planner.errors import NoFitError, PlanInputError
from planner.extras import available
from planner.plan import candidate_dict
from planner.search.layout import Layout, applicable_modules, module_names
from planner.verl.keys import ACTOR, MEGATRON, MODEL, REF, ROLLOUT, TRANSFORMER, VERL_VERSION

OPTIM = "actor_rollout_ref.actor.optim"
OPTIMIZER_OVERRIDE = f"{OPTIM}.override_optimizer_config"


# Environment for the job: why each helps (written into the script as comments).
ENVIRONMENT = (
    ("CUDA_DEVICE_MAX_CONNECTIONS", "1", False,
     "Megatron overlaps TP/SP communication with compute only with one CUDA connection "
     "(verl sets it too on Hopper/Ampere)"),
    ("NCCL_NVLS_ENABLE", "0", True,
     "NVLink SHARP buffers take GPU memory that the actor and vLLM share"),
    ("TORCH_NCCL_AVOID_RECORD_STREAMS", "1", False,
     "free NCCL tensors when the collective ends, not when the stream next syncs"),
    ("HYDRA_FULL_ERROR", "1", False, "full stack traces from Hydra"),
)


@dataclass(frozen=True)
class Setting:
    """One verl config value; ``new`` when verl's config lacks the key (Hydra needs ``+``)."""

    key: str
    value: Any
    new: bool = False
    quoted: bool = False  # a path: always a Hydra quoted string (see hydra_quoted)

    def override(self) -> str:
        value = hydra_quoted(self.value) if self.quoted else hydra_value(self.value)
        return f"{'+' if self.new else ''}{self.key}={value}"


_PLAIN = re.compile(r"^[A-Za-z0-9_./:@~\-][A-Za-z0-9_./:@~\-+]*$")


def hydra_value(value: Any) -> str:
    """A Python value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in ("null", "true", "false"):
        return text
    if "${" in text and "'" not in text:
        return text  # an interpolation Hydra resolves itself
    return hydra_quoted(text)


# Hydra's quoted strings (hydra.cc, "Escaped characters in quoted values"): a quote is
# escaped with a backslash, backslashes are escaped (doubled) only right before a quote or at
# the end of the string; any other backslash is literal.
_BACKSLASHES_BEFORE_QUOTE_OR_END = re.compile(r"(\\+)(?='|$)")


def hydra_quoted(text: str) -> str:
    """``text`` as a single-quoted string of Hydra's override grammar: spaces, commas, ``=``,
    brackets and non-ASCII characters are all kept as they are (``${...}`` still
    interpolates, as anywhere in OmegaConf)."""
    body = _BACKSLASHES_BEFORE_QUOTE_OR_END.sub(lambda m: m.group(1) * 2, str(text))
    return "'" + body.replace("'", "\\'") + "'"


def _unquoted(text: str) -> str:
    """The inverse of :func:`hydra_quoted` for a ``'...'`` or ``"..."`` string."""
    quote, body = text[0], text[1:-1]
    return re.sub(r"(\\+)(" + quote + "|$)",
                  lambda m: "\\" * (len(m.group(1)) // 2) + m.group(2), body)


_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$|^[+-]?(inf|nan)$", re.IGNORECASE)


def _split_top_level(text: str) -> list[str]:
    """Comma-separated items of a Hydra list body, commas inside quotes or brackets kept."""
    items, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            if char == quote and text[i - 1] != "\\":
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def override_value(text: str) -> Any:
    """A Hydra override's value as Python data: Hydra's own parser when it is installed, else
    the same reading of the grammar's common forms (null, booleans, numbers, quoted strings,
    lists) -- the inverse of :func:`hydra_value`, so exports need no Hydra."""
    if available("hydra"):
        from hydra.core.override_parser.overrides_parser import OverridesParser

        return OverridesParser.create().parse_override(f"key={text}").value()
    text = text.strip()
    if text.lower() == "null":
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return _unquoted(text)
    if text.startswith("[") and text.endswith("]"):
        return [override_value(item) for item in _split_top_level(text[1:-1])]
    return text


def recompute_settings(model: ModelSpec, layout: Layout) -> list[Setting]:
    if layout.recompute == "full":
        return [Setting(f"{TRANSFORMER}.recompute_granularity", "full"),
                Setting(f"{TRANSFORMER}.recompute_method",
                        "block" if layout.recompute_block else "uniform"),
                Setting(f"{TRANSFORMER}.recompute_num_layers", layout.recompute_num_layers)]
    if layout.recompute == "selective":
        modules = list(module_names(applicable_modules(layout.recompute_modules, model.is_moe,
                                                       model.is_mla)))
        out = [Setting(f"{TRANSFORMER}.recompute_granularity", "selective"),
               Setting(f"{TRANSFORMER}.recompute_modules", modules)]
        if model.is_moe and "moe_act" in modules:  # megatron-core: needs grouped GEMM experts
            out.append(Setting(f"{TRANSFORMER}.moe_grouped_gemm", True, new=True))
        return out
    return []


def stage_settings(layout: Layout) -> list[Setting]:
    """How the layers split over pipeline stages: a layout string, the embedding/loss counted
    as layers, or uneven first/last stages -- only what the layout sets."""
    if layout.pp == 1:
        return []
    if layout.pipeline_layout:
        return [Setting(f"{TRANSFORMER}.pipeline_model_parallel_layout", layout.pipeline_layout,
                        new=True)]
    out = []
    if layout.account_embedding:
        out.append(Setting(f"{TRANSFORMER}.account_for_embedding_in_pipeline_split", True,
                           new=True))
    if layout.account_loss:
        out.append(Setting(f"{TRANSFORMER}.account_for_loss_in_pipeline_split", True, new=True))
    if layout.first_stage_layers:
        out.append(Setting(f"{TRANSFORMER}.num_layers_in_first_pipeline_stage",
                           layout.first_stage_layers, new=True))
    if layout.last_stage_layers:
        out.append(Setting(f"{TRANSFORMER}.num_layers_in_last_pipeline_stage",
                           layout.last_stage_layers, new=True))
    return out


def optimizer_settings(workload, layout: Layout) -> list[Setting]:
    """Megatron's CPU optimizer (verl's examples: the precision-aware optimizer, the fraction,
    overlapped D2H/H2D copies) and lower-precision Adam moments."""
    out = []
    precision_aware = layout.optimizer_cpu_fraction > 0 or workload.adam_moment_bytes == 2
    if precision_aware:
        out.append(Setting(f"{OPTIM}.use_precision_aware_optimizer", True))
    if workload.adam_moment_bytes == 2:
        out += [Setting(f"{OPTIM}.exp_avg_dtype", "bf16"),
                Setting(f"{OPTIM}.exp_avg_sq_dtype", "bf16")]
    if layout.optimizer_cpu_fraction > 0:
        out += [Setting(f"{OPTIMIZER_OVERRIDE}.optimizer_cpu_offload", True, new=True),
                Setting(f"{OPTIMIZER_OVERRIDE}.optimizer_offload_fraction",
                        round(float(layout.optimizer_cpu_fraction), 4), new=True),
                Setting(f"{OPTIMIZER_OVERRIDE}.overlap_cpu_optimizer_d2h_h2d", True, new=True)]
    return out + ddp_settings(workload)


def ddp_settings(workload) -> list[Setting]:
    """Megatron DDP options verl takes from ``megatron.override_ddp_config`` (an empty mapping
    in verl 0.9.1, so each key is new): only those that differ from verl's defaults."""
    ddp = f"{MEGATRON}.override_ddp_config"
    out = []
    if not workload.grad_reduce_in_fp32:
        out.append(Setting(f"{ddp}.grad_reduce_in_fp32", False, new=True))
    if workload.overlap_grad_reduce:
        out.append(Setting(f"{ddp}.overlap_grad_reduce", True, new=True))
    return out


def batch_settings(layout: Layout) -> list[Setting]:
    """Micro-batches of the update and the log-prob passes: fixed sizes, or verl's dynamic
    batches with a token budget per GPU."""
    log_prob_micro = layout.log_prob_micro_batch or layout.micro_batch
    out = [Setting(f"{ACTOR}.ppo_micro_batch_size_per_gpu", layout.micro_batch),
           Setting(f"{ACTOR}.use_dynamic_bsz", layout.dynamic_batch)]
    if layout.dynamic_batch:
        budget = layout.log_prob_max_token_len or layout.max_token_len
        out += [Setting(f"{ACTOR}.ppo_max_token_len_per_gpu", layout.max_token_len),
                Setting(f"{ROLLOUT}.log_prob_max_token_len_per_gpu", budget),
                Setting(f"{REF}.log_prob_max_token_len_per_gpu", budget)]
    out += [Setting(f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", log_prob_micro),
            Setting(f"{REF}.log_prob_micro_batch_size_per_gpu", log_prob_micro)]
    return out


def rollout_settings(workload, layout: Layout) -> list[Setting]:
    out = [
        Setting(f"{ROLLOUT}.name", workload.rollout_engine),
        Setting(f"{ROLLOUT}.tensor_model_parallel_size", layout.rollout_tp),
        Setting(f"{ROLLOUT}.data_parallel_size", layout.rollout_dp),
        Setting(f"{ROLLOUT}.expert_parallel_size", layout.rollout_ep),
        Setting(f"{ROLLOUT}.gpu_memory_utilization", round(float(layout.gpu_memory_utilization),
                                                           2)),
        Setting(f"{ROLLOUT}.n", workload.rollout_n),
        Setting(f"{ROLLOUT}.max_num_seqs", workload.max_num_seqs),
        Setting(f"{ROLLOUT}.max_num_batched_tokens", workload.max_num_batched_tokens),
        Setting(f"{ROLLOUT}.enable_chunked_prefill", True),
        Setting(f"{ROLLOUT}.enable_prefix_caching", workload.prefix_caching),
        Setting(f"{ROLLOUT}.enforce_eager", workload.enforce_eager),
        Setting(f"{ROLLOUT}.free_cache_engine", workload.free_cache_engine),
    ]
    if workload.precision == "fp16":  # the engine samples in the actor's dtype (no BF16: V100)
        out.append(Setting(f"{ROLLOUT}.dtype", "float16"))
    if workload.rollout_precision == "fp8":
        out += [Setting(f"{ROLLOUT}.quantization", "fp8"),
                Setting(f"{ROLLOUT}.engine_kwargs.{workload.rollout_engine}.kv_cache_dtype",
                        "fp8" if workload.rollout_engine == "vllm" else "fp8_e5m2", new=True)]
    return out


def job_settings(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
                 layout: Layout, *, model_path: str, train_files: str,
                 val_files: str) -> list[Setting]:
    """Every verl setting of the GRPO job, in the order the launch script lists them."""
    if getattr(workload, "kind", "grpo") != "grpo":
        raise PlanInputError("a verl job needs a GRPO workload, not --workload "
                             f"{workload.kind}")
    if workload.precision not in ("bf16", "fp16"):
        raise PlanInputError(f"--precision {workload.precision} cannot be exported: verl "
                             f"{VERL_VERSION}'s Megatron engine trains in bf16 or fp16 "
                             f"(megatron.dtype)")
    dtype = "bfloat16" if workload.precision == "bf16" else "float16"
    moe = model.is_moe
    s = [
        Setting("algorithm.adv_estimator", "grpo"),
        Setting("algorithm.use_kl_in_reward", workload.use_kl_in_reward),
    ]
    if workload.bypass_old_log_prob:
        s.append(Setting("algorithm.rollout_correction.bypass_mode", True))
    s += [
        Setting("data.train_files", train_files, quoted=True),
        Setting("data.val_files", val_files, quoted=True),
        Setting("data.train_batch_size", workload.train_batch_size),
        Setting("data.max_prompt_length", workload.prompt_length),
        Setting("data.max_response_length", workload.response_length),
        Setting("data.filter_overlong_prompts", True),
        Setting("data.truncation", "error"),
        Setting(f"{MODEL}.path", model_path, quoted=True),
        Setting(f"{MODEL}.use_fused_kernels", workload.fused_kernels),
        Setting(f"{OPTIM}.lr", 1e-6),
        Setting(f"{ACTOR}.ppo_mini_batch_size", workload.mini_batch_size),
        *batch_settings(layout),
        Setting(f"{ACTOR}.ppo_epochs", workload.ppo_epochs),
        Setting(f"{ACTOR}.use_kl_loss", workload.use_kl_loss),
        Setting(f"{ACTOR}.kl_loss_coef", 0.001),
        Setting(f"{ACTOR}.kl_loss_type", "low_var_kl"),
        Setting(f"{ACTOR}.entropy_coeff", 0),
    ]
    if workload.entropy_chunk_tokens:
        s += [Setting(f"{ACTOR}.entropy_from_logits_with_chunking", True),
              Setting(f"{ACTOR}.entropy_from_logits_chunk_size", workload.entropy_chunk_tokens)]
    s += [
        Setting(f"{MEGATRON}.tensor_model_parallel_size", layout.tp),
        Setting(f"{MEGATRON}.pipeline_model_parallel_size", layout.pp),
        Setting(f"{MEGATRON}.virtual_pipeline_model_parallel_size",
                layout.vpp if layout.vpp > 1 else None),
        Setting(f"{MEGATRON}.context_parallel_size", layout.cp),
        Setting(f"{MEGATRON}.expert_model_parallel_size", layout.ep),
        # megatron-core defaults ETP to TP, not 1: always say it
        Setting(f"{MEGATRON}.expert_tensor_parallel_size", layout.etp),
        Setting(f"{MEGATRON}.sequence_parallel", bool(layout.sequence_parallel and layout.tp > 1)),
        Setting(f"{MEGATRON}.use_distributed_optimizer", layout.distributed_optimizer),
        Setting(f"{MEGATRON}.param_offload", layout.param_offload),
        Setting(f"{MEGATRON}.optimizer_offload", layout.optimizer_offload),
    ]
    if dtype != "bfloat16":
        s.append(Setting(f"{MEGATRON}.dtype", dtype))
    s += optimizer_settings(workload, layout)
    s += recompute_settings(model, layout)
    s += stage_settings(layout)
    if moe and layout.etp > 1:  # megatron-core: "Bias in Moe is only supported when ETP==1"
        s.append(Setting(f"{TRANSFORMER}.add_bias_linear", False, new=True))
    # The reference model follows the actor's parallel sizes (verl interpolates them); only its
    # offload is its own.
    s.append(Setting(f"{REF}.megatron.param_offload", layout.ref_param_offload))
    if dtype != "bfloat16":
        s.append(Setting(f"{REF}.megatron.dtype", dtype))
    s += rollout_settings(workload, layout)
    s += [
        Setting("trainer.critic_warmup", 0),
        Setting("trainer.logger", ["console"]),
        Setting("trainer.project_name", "verl_grpo"),
        Setting("trainer.experiment_name", experiment_name(model, cluster)),
        Setting("trainer.n_gpus_per_node", min(cluster.gpus_per_node, cluster.num_gpus)),
        Setting("trainer.nnodes", cluster.num_nodes),
        Setting("trainer.save_freq", 20),
        Setting("trainer.test_freq", 5),
        Setting("trainer.total_epochs", 15),
    ]
    return s


def experiment_name(model: ModelSpec, cluster: ClusterSpec) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", f"{model.name}_{cluster.num_gpus}x{cluster.gpu.name}")


def override_key(override: str) -> str:
    """The config key an override sets (``+a.b=1`` -> ``a.b``)."""
    text = override.lstrip("+~")
    return text.split("=", 1)[0].strip()


def check_overrides(overrides: Sequence[str]) -> list[str]:
    """``--override`` values: KEY=VALUE, and (Hydra installed) each one parsed by Hydra's own
    override parser, so a value verl's command line would refuse (``$(oops)``, unbalanced
    quotes) is refused here, before any planning or trial -- every bad one named."""
    for item in overrides:  # a newline would end the launch script's line: its own message
        check_text("--override", item, max_chars=1 << 16, what="KEY=VALUE")
    bad = [item for item in overrides
           if not re.match(r"^(\+{0,2}|~)[A-Za-z_][\w.@/\-]*(=|$)", item)
           or (not item.startswith("~") and "=" not in item)]
    if bad:
        raise PlanInputError(f"--override {bad[0]!r} is not KEY=VALUE (Hydra override syntax, "
                             f"e.g. trainer.total_epochs=5 or +key.new=1)")
    problems = hydra_syntax_problems(overrides)
    if problems:
        raise PlanInputError("; ".join(problems) + " (quote values with spaces or shell "
                                                   "characters: key='a b')")
    return list(overrides)


def hydra_syntax_problems(overrides: Sequence[str]) -> list[str]:
    """One message per override Hydra's parser refuses (none without Hydra installed)."""
    if not available("hydra"):
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, out = OverridesParser.create(), []
    for item in overrides:
        try:
            parser.parse_override(item)
        except Exception as error:  # noqa: BLE001 - Hydra's parse errors vary in type
            text = str(error).strip().splitlines()
            out.append(f"--override {item[:120]!r} is not valid Hydra syntax "
                       f"({text[0][:120] if text else type(error).__name__})")
    return out


def merge_overrides(base: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``base`` with ``extra`` applied: an extra override of a key already set replaces it in
    place (Hydra would take the last one anyway); new keys are appended."""
    out = list(base)
    index = {override_key(item): i for i, item in enumerate(out)}
    for item in check_overrides(extra):
        key = override_key(item)
        if key in index:
            out[index[key]] = item
        else:
            index[key] = len(out)
            out.append(item)
    return out


def job_overrides(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
                  layout: Layout, *, model_path: str, train_files: str, val_files: str,
                  extra: Sequence[str] = ()) -> list[str]:
    """The Hydra overrides of ``python3 -m verl.trainer.main_ppo`` for this layout (verl 0.9.1,
    Megatron backend), ``extra`` applied last."""
    settings = job_settings(model, cluster, workload, layout, model_path=model_path,
                            train_files=train_files, val_files=val_files)
    return merge_overrides(["model_engine=megatron", *(s.override() for s in settings)], extra)


# --- the exported job ---------------------------------------------------------------------


@dataclass(frozen=True)
class ExportedJob:
    """Everything the three exported files say, from one planned layout."""

    model: ModelSpec
    cluster: ClusterSpec
    workload: GrpoWorkload
    layout: Layout
    prediction: dict  # report.candidate_dict of the layout's row
    rank: int = 1
    model_path: str | None = None  # None: $MODEL_PATH, default $HOME/models/<model>
    train_files: str | None = None
    val_files: str | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)
    # training mode (planner/placement.py): "sync" is verl.trainer.main_ppo; the asynchronous
    # modes run on the trainer pool (``cluster``) with ``mode_overrides`` (pools, async keys)
    mode: str = "sync"
    mode_overrides: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        # Every name written into run_grpo.sh (also in its comments) and grpo.yaml: a newline
        # or other control character would become a live line of the script.  Refused here,
        # whatever the value came from (a flag, $MODEL_PATH, a job's model.path).
        check_text("the model name", self.model.name, what="a model name")
        for flag, value in (("--model-path", self.model_path),
                            ("--train-files", self.train_files),
                            ("--val-files", self.val_files)):
            if value is not None:
                check_text(flag, value, what="a path")
        for item in self.extra:
            check_text("--override", item, max_chars=1 << 16, what="KEY=VALUE")

    def overrides(self, values: dict[str, str]) -> list[str]:
        """The job's overrides with ``values`` for MODEL_PATH, TRAIN_FILES and VAL_FILES."""
        return job_overrides(self.model, self.cluster, self.workload, self.layout,
                             model_path=values["MODEL_PATH"], train_files=values["TRAIN_FILES"],
                             val_files=values["VAL_FILES"],
                             extra=(*self.mode_overrides, *self.extra))


def job_from_plan(plan, rank: int = 1, *, model_path: str | None = None,
                  train_files: str | None = None, val_files: str | None = None,
                  extra_overrides: Sequence[str] = ()) -> ExportedJob:
    fitting = int(plan.candidates["fits"].sum())
    if not fitting:
        raise NoFitError("no layout fits in GPU memory; nothing to export")
    if not 1 <= rank <= fitting:
        raise PlanInputError(f"--rank {rank} is outside the {fitting} layouts that fit "
                             f"(valid: 1..{fitting})")
    row = plan.candidates.iloc[rank - 1].to_dict()
    return ExportedJob(model=plan.model, cluster=plan.cluster, workload=plan.workload,
                       layout=Layout.from_row(row), prediction=candidate_dict(row), rank=rank,
                       model_path=model_path, train_files=train_files, val_files=val_files,
                       extra=tuple(check_overrides(extra_overrides)))
