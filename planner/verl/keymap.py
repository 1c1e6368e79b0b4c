"""The one map between the planner's fields and verl's config keys.

Each row of :data:`KEYS` is one verl config key (its dotted path in the composed config) with

* ``kind`` and ``default``: the type of its value and what verl does when a config leaves it
  out -- verl 0.9.1's YAML value (``origin="verl"``), megatron-core's dataclass default for a
  key verl passes through (``"megatron-core"``), or what verl's code assumes (a note naming the
  file).  :class:`Follows` marks a YAML value that interpolates another key and
  :class:`Computed` a default that depends on other keys.
  ``tests/verl_adapter/test_verl_keymap.py`` composes verl's config and compares;
* ``field``: the planner field it carries (``layout.tp``, ``workload.rollout_n``,
  ``cluster.num_nodes``, ``paths.model_path``, ``pool.rollout_nodes``,
  ``async_training.require_batches``); empty for a constant or a key only read;
* ``write``/``when``: the value an export writes from that field and whether it writes the key
  at all (``new``: verl's config lacks the key, so Hydra needs ``+``);
* ``read``: the field value a job's config gives back, from this key and the keys already read.
  Exactly one row reads each field (a field written to several keys, e.g. the CPU optimizer's
  three, is read from one of them).  A value that cannot be read raises :class:`BadValue`;
* ``required``: the reader needs the key: absent, null (unless ``nullable``), not of ``kind``,
  or an integer below 1 is a finding;
* ``modes``: ``None`` for the job every training mode runs (in the order the launch script
  lists it), else the asynchronous modes whose entry point takes the key on top of it;
  ``mode_default``: what each mode's own root config sets it to (restated in ``grpo.yaml``).

The exporter (:func:`planner.verl.export.job_settings`, the split modes'
:meth:`planner.modes.split.SplitMode.job_overrides`) and the reader
(:func:`planner.verl.job.read_job`) are loops over this table and spell no key themselves, so a
layout written out reads back as itself (a property test).  No verl import: the table is data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from planner.catalog.support import ROUTE_SETTINGS, route_of
from planner.errors import PlanInputError
from planner.search.layout import applicable_modules, module_names, modules_mask

# --- sections of verl's config ----------------------------------------------------------------
ACTOR = "actor_rollout_ref.actor"
MEGATRON = f"{ACTOR}.megatron"
TRANSFORMER_CONFIG_KEY = "override_transformer_config"
TRANSFORMER = f"{MEGATRON}.{TRANSFORMER_CONFIG_KEY}"
OPTIM = f"{ACTOR}.optim"
OPTIMIZER_OVERRIDE = f"{OPTIM}.override_optimizer_config"
DDP = f"{MEGATRON}.override_ddp_config"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
MODEL = "actor_rollout_ref.model"
ASYNC_TRAINING = "async_training"
POOL = "rollout"  # the asynchronous modes' rollout pool (rollout.nnodes, ...)

# verl's asynchronous trainers (verl.experimental; planner/modes names them too), spelled once
ONE_STEP_OFF, FULLY_ASYNC_MODE = "one-step-off", "fully-async"
ASYNC_MODES = frozenset({ONE_STEP_OFF, FULLY_ASYNC_MODE})
VERL, MEGATRON_CORE = "verl", "megatron-core"

_MISSING = object()


class _Absent:
    """The default of a key verl's ppo_trainer config does not have."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


def get(config: dict, key: str, default: Any = _MISSING) -> Any:
    """The value at a dotted ``key`` of a plain config dict, ``default`` when absent."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


class BadValue(Exception):
    """A key's value the reader cannot turn into its field: ``text`` follows ``key`` in the
    finding (``=3.5 is not an integer``), ``check`` names it."""

    def __init__(self, text: str, check: str = "bad_value"):
        super().__init__(text)
        self.text, self.check = text, check


@dataclass(frozen=True)
class Follows:
    """verl's YAML interpolates another key (``${oc.select:<key>,...}``): absent, the key has
    that key's value."""

    row: "VerlKey"


@dataclass(frozen=True)
class Computed:
    """A default verl's code derives from other keys (``why`` names where)."""

    value: Callable[["Reading"], Any]
    why: str


@dataclass(frozen=True, eq=False)
class VerlKey:
    """One row of the table (see the module docstring for the columns)."""

    key: str
    kind: type
    default: Any = None
    origin: str = VERL
    field: str = ""
    write: Callable[[Any, Any], Any] | None = None
    when: Callable[[Any, Any], bool] | None = None
    read: Callable[[Any, "Reading"], Any] | None = None
    new: bool = False
    quoted: bool = False  # a path: always a Hydra quoted string
    required: bool = False
    nullable: bool = False
    modes: frozenset | None = None
    mode_default: Mapping[str, Any] | None = None

    @property
    def written(self) -> bool:
        """Whether an export writes the key at all (a row without a field or a writer is one
        the planner only reads, or a mode's root config sets)."""
        return bool(self.field or self.write)

    def value_of(self, source) -> tuple[bool, Any]:
        """``(written, verl value)`` of this key for ``source`` (:class:`Source`)."""
        value = None
        if self.field:
            target, name = self.field.split(".", 1)
            holder = getattr(source, target)
            value = holder[name] if isinstance(holder, Mapping) else getattr(holder, name)
        if self.when is not None and not self.when(value, source):
            return False, None
        return True, value if self.write is None else self.write(value, source)


@dataclass(frozen=True)
class Paths:
    model_path: str
    train_files: str
    val_files: str


@dataclass(frozen=True)
class Source:
    """What an export writes from: the planned job, and for an asynchronous mode its rollout
    pool (``rollout_nodes``, ``rollout_gpus_per_node``) and ``async_training`` settings."""

    model: Any = None
    cluster: Any = None
    workload: Any = None
    layout: Any = None
    paths: Paths | None = None
    pool: Mapping[str, Any] | None = None
    async_training: Mapping[str, Any] | None = None


class Reading:
    """A config's value of each row: the config's own, else the row's default (a followed
    key's value, a computed default); ``read`` functions look up the keys they need here."""

    def __init__(self, config: dict):
        self.config = config
        self._values: dict[VerlKey, Any] = {}

    def present(self, row: VerlKey) -> bool:
        return get(self.config, row.key, _MISSING) is not _MISSING

    def __setitem__(self, row: VerlKey, value: Any) -> None:
        self._values[row] = value

    def __getitem__(self, row: VerlKey) -> Any:
        if row not in self._values:
            value = get(self.config, row.key, _MISSING)
            if value is _MISSING:
                default = row.default
                if isinstance(default, Follows):
                    value = self[default.row]
                elif isinstance(default, Computed):
                    value = default.value(self)
                else:
                    value = None if default is ABSENT else default
            self._values[row] = value
        return self._values[row]


# --- conversions ----------------------------------------------------------------------------


def const(value: Any) -> Callable[[Any, Any], Any]:
    return lambda _field, _source: value


def is_set(value: Any, _source=None) -> bool:
    return bool(value)


def as_bool(value: Any, _got=None) -> bool:
    return bool(value)


def same(value: Any, _got=None) -> Any:
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_or_zero(value: Any) -> int:
    return value if _is_int(value) and value > 0 else 0


def _strict_int(value: Any) -> int:
    """A value the reader requires as an integer >= 1 (the message of a required key)."""
    if not _is_int(value):
        raise BadValue(f"={value!r} is not an integer")
    if value < 1:
        raise BadValue(f"={value} must be >= 1")
    return value


def _stage_layers(value: Any, _got=None) -> int:
    layers = value or 0
    if not _is_int(layers) or layers < 0:
        raise BadValue(f"={layers!r} is not a positive integer")
    return layers


PRECISION_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # workload.precision -> megatron.dtype


def _dtype(precision: str, _source=None) -> str:
    return PRECISION_DTYPES[precision]  # planner.verl.export refuses other precisions first


def _precision(dtype: Any, _got=None) -> str:
    for precision, name in PRECISION_DTYPES.items():
        if dtype == name:
            return precision
    raise BadValue(f"={dtype!r}: verl's Megatron engine trains in bfloat16 or float16")


def _modules(mask: int, source) -> list[str]:
    model = source.model
    return list(module_names(applicable_modules(mask, model.is_moe, model.is_mla)))


def _modules_mask(modules: Any, _got=None) -> int:
    modules = modules or []
    try:
        return modules_mask(modules if isinstance(modules, list) else [modules])
    except PlanInputError as error:
        raise BadValue(f": {error}", "recompute") from None


def _dynamic(source) -> bool:
    return source.layout.dynamic_batch


def _uneven_split(value: Any, source) -> bool:
    """A pipeline split setting is written only with PP > 1 and no explicit layout string."""
    return bool(value) and source.layout.pp > 1 and not source.layout.pipeline_layout


def _precision_aware(got: Reading) -> bool:
    return bool(got[PRECISION_AWARE]) or bool(got[PRECISION_AWARE_OVERRIDE])


# --- the table, in the order the launch script lists the keys -------------------------------

MODEL_ENGINE = VerlKey("model_engine", str, "dp", write=const("megatron"))
ADV_ESTIMATOR = VerlKey("algorithm.adv_estimator", str, "gae", write=const("grpo"))
USE_KL_IN_REWARD = VerlKey("algorithm.use_kl_in_reward", bool, False,
                           field="workload.use_kl_in_reward", read=as_bool)
BYPASS_MODE = VerlKey("algorithm.rollout_correction.bypass_mode", bool, False,
                      field="workload.bypass_old_log_prob", when=is_set, write=const(True),
                      read=as_bool, mode_default={ONE_STEP_OFF: True, FULLY_ASYNC_MODE: True})
TRAIN_FILES = VerlKey("data.train_files", str, "~/data/rlhf/gsm8k/train.parquet",
                      field="paths.train_files", quoted=True)
VAL_FILES = VerlKey("data.val_files", str, "~/data/rlhf/gsm8k/test.parquet",
                    field="paths.val_files", quoted=True)
TRAIN_BATCH_SIZE = VerlKey("data.train_batch_size", int, 1024, field="workload.train_batch_size",
                           required=True, read=same)
MAX_PROMPT_LENGTH = VerlKey("data.max_prompt_length", int, 512, field="workload.prompt_length",
                            required=True, read=same)
MAX_RESPONSE_LENGTH = VerlKey("data.max_response_length", int, 512,
                              field="workload.response_length", required=True, read=same)
FILTER_OVERLONG_PROMPTS = VerlKey("data.filter_overlong_prompts", bool, False, write=const(True))
TRUNCATION = VerlKey("data.truncation", str, "error", write=const("error"))
MODEL_PATH = VerlKey(f"{MODEL}.path", str, "~/models/deepseek-llm-7b-chat",
                     field="paths.model_path", quoted=True)
FUSED_KERNELS = VerlKey(f"{MODEL}.use_fused_kernels", bool, False, field="workload.fused_kernels",
                        read=as_bool)
LR = VerlKey(f"{OPTIM}.lr", float, 1e-6, write=const(1e-6))
MINI_BATCH = VerlKey(f"{ACTOR}.ppo_mini_batch_size", int, 256, field="workload.mini_batch_size",
                     required=True, read=same)


def _micro_batch(value: Any, got: Reading) -> int:
    """verl ignores the fixed micro-batch size with dynamic batches (the token budget rules)."""
    if got[DYNAMIC_BATCH]:
        return value or 1
    if value is None:
        raise BadValue(f"={value!r} is not an integer")
    return value


MICRO_BATCH = VerlKey(f"{ACTOR}.ppo_micro_batch_size_per_gpu", int, None,
                      field="layout.micro_batch", required=True, nullable=True, read=_micro_batch)
DYNAMIC_BATCH = VerlKey(f"{ACTOR}.use_dynamic_bsz", bool, False, field="layout.dynamic_batch",
                        required=True, read=as_bool)
# dynamic batches: a token budget per GPU; verl packs micro-batches of up to budget x CP tokens
# (workers/engine/utils.py prepare_micro_batches), the log-prob passes with their own budgets
TOKEN_BUDGET = VerlKey(f"{ACTOR}.ppo_max_token_len_per_gpu", int, 16384,
                       field="layout.max_token_len", when=lambda _, s: _dynamic(s),
                       read=lambda v, got: _strict_int(v) if got[DYNAMIC_BATCH] else 0)


def _log_prob_budget(_value, source) -> int:
    return source.layout.log_prob_max_token_len or source.layout.max_token_len


def _log_prob_micro(_value, source) -> int:
    return source.layout.log_prob_micro_batch or source.layout.micro_batch


ROLLOUT_TOKEN_BUDGET = VerlKey(
    f"{ROLLOUT}.log_prob_max_token_len_per_gpu", int, Follows(TOKEN_BUDGET),
    field="layout.log_prob_max_token_len", when=lambda _, s: _dynamic(s), write=_log_prob_budget,
    read=lambda v, got: _positive_or_zero(v) if got[DYNAMIC_BATCH] else 0)
REF_TOKEN_BUDGET = VerlKey(f"{REF}.log_prob_max_token_len_per_gpu", int, Follows(TOKEN_BUDGET),
                           field="layout.log_prob_max_token_len",
                           when=lambda _, s: _dynamic(s), write=_log_prob_budget)
ROLLOUT_LOG_PROB_MICRO = VerlKey(
    f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", int, None, field="layout.log_prob_micro_batch",
    write=_log_prob_micro, read=lambda v, got: 0 if got[DYNAMIC_BATCH] else _positive_or_zero(v))
REF_LOG_PROB_MICRO = VerlKey(f"{REF}.log_prob_micro_batch_size_per_gpu", int, None,
                             field="layout.log_prob_micro_batch", write=_log_prob_micro)
PPO_EPOCHS = VerlKey(f"{ACTOR}.ppo_epochs", int, 1, field="workload.ppo_epochs", required=True,
                     read=same)
USE_KL_LOSS = VerlKey(f"{ACTOR}.use_kl_loss", bool, False, field="workload.use_kl_loss",
                      read=as_bool)
KL_LOSS_COEF = VerlKey(f"{ACTOR}.kl_loss_coef", float, 0.001, write=const(0.001))
KL_LOSS_TYPE = VerlKey(f"{ACTOR}.kl_loss_type", str, "low_var_kl", write=const("low_var_kl"))
ENTROPY_COEFF = VerlKey(f"{ACTOR}.entropy_coeff", int, 0, write=const(0))
ENTROPY_CHUNKING = VerlKey(f"{ACTOR}.entropy_from_logits_with_chunking", bool, False,
                           field="workload.entropy_chunk_tokens", when=is_set, write=const(True))
ENTROPY_CHUNK = VerlKey(
    f"{ACTOR}.entropy_from_logits_chunk_size", int, 2048, field="workload.entropy_chunk_tokens",
    when=is_set,
    read=lambda v, got: int(v) if got[ENTROPY_CHUNKING] and isinstance(v, int) else 0)

# the actor's Megatron parallel sizes (the reference follows them through verl's interpolation)
TP = VerlKey(f"{MEGATRON}.tensor_model_parallel_size", int, 1, field="layout.tp", required=True,
             read=same)
PP = VerlKey(f"{MEGATRON}.pipeline_model_parallel_size", int, 1, field="layout.pp",
             required=True, read=same)
VPP = VerlKey(f"{MEGATRON}.virtual_pipeline_model_parallel_size", int, None, field="layout.vpp",
              write=lambda v, _: v if v > 1 else None, read=lambda v, _: v or 1, required=True,
              nullable=True)
CP = VerlKey(f"{MEGATRON}.context_parallel_size", int, 1, field="layout.cp", required=True,
             read=same)
EP = VerlKey(f"{MEGATRON}.expert_model_parallel_size", int, 1, field="layout.ep", required=True,
             read=same)
# megatron-core defaults ETP to TP, not 1: always written; read as it is (null: TP, for an MoE
# model -- planner.verl.job.layout_of)
ETP = VerlKey(f"{MEGATRON}.expert_tensor_parallel_size", int, None, field="layout.etp",
              required=True, nullable=True, read=same)
SEQUENCE_PARALLEL = VerlKey(f"{MEGATRON}.sequence_parallel", bool, True,
                            field="layout.sequence_parallel",
                            write=lambda v, s: bool(v and s.layout.tp > 1),
                            read=lambda v, got: bool(v) and got[TP] > 1)
DISTRIBUTED_OPTIMIZER = VerlKey(f"{MEGATRON}.use_distributed_optimizer", bool, True,
                                field="layout.distributed_optimizer", read=as_bool)
PARAM_OFFLOAD = VerlKey(f"{MEGATRON}.param_offload", bool, False, field="layout.param_offload",
                        read=as_bool)
OPTIMIZER_OFFLOAD = VerlKey(f"{MEGATRON}.optimizer_offload", bool, False,
                            field="layout.optimizer_offload", read=as_bool)
DTYPE = VerlKey(f"{MEGATRON}.dtype", str, "bfloat16", field="workload.precision",
                when=lambda v, _: v != "bf16", write=_dtype, read=_precision)

# Megatron's optimizer (verl's examples: the precision-aware optimizer, the CPU fraction with
# overlapped D2H/H2D copies) and lower-precision Adam moments
PRECISION_AWARE = VerlKey(
    f"{OPTIM}.use_precision_aware_optimizer", bool, False, write=const(True),
    when=lambda _, s: s.layout.optimizer_cpu_fraction > 0 or s.workload.adam_moment_bytes == 2)
EXP_AVG_DTYPE = VerlKey(
    f"{OPTIM}.exp_avg_dtype", str, "fp32", field="workload.adam_moment_bytes",
    when=lambda v, _: v == 2, write=const("bf16"),
    read=lambda v, got: 2 if _precision_aware(got) and str(v) in ("bf16", "fp16") else 4)
EXP_AVG_SQ_DTYPE = VerlKey(f"{OPTIM}.exp_avg_sq_dtype", str, "fp32",
                           field="workload.adam_moment_bytes", when=lambda v, _: v == 2,
                           write=const("bf16"))
MAIN_GRADS_DTYPE = VerlKey(f"{OPTIM}.main_grads_dtype", str, "fp32")
PRECISION_AWARE_OVERRIDE = VerlKey(f"{OPTIMIZER_OVERRIDE}.use_precision_aware_optimizer", bool,
                                   False, origin=MEGATRON_CORE, new=True)
CPU_OPTIMIZER = VerlKey(f"{OPTIMIZER_OVERRIDE}.optimizer_cpu_offload", bool, False,
                        origin=MEGATRON_CORE, field="layout.optimizer_cpu_fraction", new=True,
                        when=is_set, write=const(True))


def _cpu_fraction(value: Any, got: Reading) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        raise BadValue(f"={value!r} is not a number in 0..1")
    return float(value) if got[CPU_OPTIMIZER] else 0.0


CPU_FRACTION = VerlKey(f"{OPTIMIZER_OVERRIDE}.optimizer_offload_fraction", float, 0.0,
                       origin=MEGATRON_CORE, field="layout.optimizer_cpu_fraction", new=True,
                       when=is_set, write=lambda v, _: round(float(v), 4), read=_cpu_fraction)
CPU_OPTIMIZER_OVERLAP = VerlKey(f"{OPTIMIZER_OVERRIDE}.overlap_cpu_optimizer_d2h_h2d", bool,
                                False, origin=MEGATRON_CORE, field="layout.optimizer_cpu_fraction",
                                new=True, when=is_set, write=const(True))
# Megatron DDP options verl takes from megatron.override_ddp_config (an empty mapping in verl
# 0.9.1, so each key is new): written only where they differ from verl's defaults
GRAD_REDUCE_IN_FP32 = VerlKey(
    f"{DDP}.grad_reduce_in_fp32", bool,
    Computed(lambda got: not (_precision_aware(got) and str(got[MAIN_GRADS_DTYPE]) != "fp32"),
             "fp32 unless the precision-aware optimizer keeps lower-precision grads "
             "(verl workers/engine/megatron/transformer_impl.py)"),
    origin="verl code", field="workload.grad_reduce_in_fp32", new=True,
    when=lambda v, _: not v, write=const(False), read=as_bool)
# off unless set (verl utils/megatron_utils.py): the update's DP gradient reduce is exposed
OVERLAP_GRAD_REDUCE = VerlKey(f"{DDP}.overlap_grad_reduce", bool, False,
                              origin="verl code", field="workload.overlap_grad_reduce", new=True,
                              when=is_set, write=const(True), read=as_bool)

# megatron-core recomputation
RECOMPUTE = VerlKey(f"{TRANSFORMER}.recompute_granularity", str, None, field="layout.recompute",
                    when=lambda v, _: v != "none",
                    read=lambda v, _: v if v in ("full", "selective") else "none")
RECOMPUTE_METHOD = VerlKey(f"{TRANSFORMER}.recompute_method", str, None,
                           field="layout.recompute_block",
                           when=lambda _, s: s.layout.recompute == "full",
                           write=lambda v, _: "block" if v else "uniform",
                           read=lambda v, _: v == "block")
RECOMPUTE_NUM_LAYERS = VerlKey(f"{TRANSFORMER}.recompute_num_layers", int, None,
                               field="layout.recompute_num_layers",
                               when=lambda _, s: s.layout.recompute == "full",
                               read=lambda v, _: v if isinstance(v, int) and v > 0 else 1)
RECOMPUTE_MODULES = VerlKey(f"{TRANSFORMER}.recompute_modules", list, ["core_attn"],
                            field="layout.recompute_modules",
                            when=lambda _, s: s.layout.recompute == "selective",
                            write=_modules, read=_modules_mask)
# megatron-core: moe_act recomputation needs grouped-GEMM experts
GROUPED_GEMM = VerlKey(
    f"{TRANSFORMER}.moe_grouped_gemm", bool, False, origin=MEGATRON_CORE, new=True,
    write=const(True),
    when=lambda _, s: s.layout.recompute == "selective" and s.model.is_moe
    and "moe_act" in _modules(s.layout.recompute_modules, s))

# how the layers split over pipeline stages: a layout string, the embedding/loss counted as
# layers, or uneven first/last stages -- only what the layout sets
PIPELINE_LAYOUT = VerlKey(f"{TRANSFORMER}.pipeline_model_parallel_layout", str, None,
                          origin=MEGATRON_CORE, field="layout.pipeline_layout", new=True,
                          when=lambda v, s: bool(v) and s.layout.pp > 1,
                          read=lambda v, _: str(v) if v else "")


def _split_key(name: str, kind: type, default: Any, field: str, read) -> VerlKey:
    """A megatron-core pipeline-split setting: written with PP > 1 and no layout string."""
    return VerlKey(f"{TRANSFORMER}.{name}", kind, default, origin=MEGATRON_CORE,
                   field=f"layout.{field}", new=True, when=_uneven_split, read=read)


ACCOUNT_EMBEDDING = _split_key("account_for_embedding_in_pipeline_split", bool, False,
                               "account_embedding", as_bool)
ACCOUNT_LOSS = _split_key("account_for_loss_in_pipeline_split", bool, False, "account_loss",
                          as_bool)
FIRST_STAGE = _split_key("num_layers_in_first_pipeline_stage", int, None, "first_stage_layers",
                         _stage_layers)
LAST_STAGE = _split_key("num_layers_in_last_pipeline_stage", int, None, "last_stage_layers",
                        _stage_layers)
# megatron-core: "Bias in Moe is only supported when ETP==1"; a model whose checkpoint has
# linear biases (gpt-oss) keeps them, and the search gives it ETP 1 (rule etp_moe_bias)
ADD_BIAS_LINEAR = VerlKey(f"{TRANSFORMER}.add_bias_linear", bool, True, origin=MEGATRON_CORE,
                          new=True, write=const(False),
                          when=lambda _, s: (s.model.is_moe and s.layout.etp > 1
                                             and not s.model.linear_bias))



def _bridge_setting(name: str) -> Callable[[Any, Any], Any]:
    """``use_mbridge`` / ``vanilla_mbridge`` the model's route needs
    (:data:`planner.catalog.support.ROUTE_SETTINGS`: Megatron-Bridge's AutoBridge by default,
    the legacy mbridge for the families only it registers, e.g. Mixtral)."""
    def value(_field, source) -> bool:
        model = source.model
        route = route_of(model.architecture, model.model_type)
        return ROUTE_SETTINGS[route][name] if route else None
    return value


# verl builds the model through a bridge (verl/workers/config/engine.py McoreEngineConfig);
# written only where the model's route needs other than verl's defaults (the ref follows).
USE_MBRIDGE = VerlKey(f"{MEGATRON}.use_mbridge", bool, True, write=_bridge_setting("use_mbridge"),
                      when=lambda _, s: _bridge_setting("use_mbridge")(None, s) is False)
VANILLA_MBRIDGE = VerlKey(f"{MEGATRON}.vanilla_mbridge", bool, False,
                          write=_bridge_setting("vanilla_mbridge"),
                          when=lambda _, s: bool(_bridge_setting("vanilla_mbridge")(None, s)))

# the reference model: the actor's parallel sizes (verl interpolates them), its own offload
REF_PARAM_OFFLOAD = VerlKey(f"{REF}.megatron.param_offload", bool, Follows(PARAM_OFFLOAD),
                            field="layout.ref_param_offload", read=as_bool)
REF_DTYPE = VerlKey(f"{REF}.megatron.dtype", str, "bfloat16", field="workload.precision",
                    when=lambda v, _: v != "bf16", write=_dtype)
ACTOR_PARALLEL = {"tp": TP, "pp": PP, "vpp": VPP, "cp": CP, "ep": EP, "etp": ETP}
REF_PARALLEL = {name: VerlKey(f"{REF}.megatron.{row.key.rsplit('.', 1)[1]}", int, Follows(row))
                for name, row in ACTOR_PARALLEL.items()}

# the rollout engine
ROLLOUT_NAME = VerlKey(f"{ROLLOUT}.name", str, "???", field="workload.rollout_engine",
                       read=lambda v, _: v if v in ("vllm", "sglang") else "vllm")
ROLLOUT_TP = VerlKey(f"{ROLLOUT}.tensor_model_parallel_size", int, 2, field="layout.rollout_tp",
                     required=True, read=same)
ROLLOUT_DP = VerlKey(f"{ROLLOUT}.data_parallel_size", int, 1, field="layout.rollout_dp",
                     required=True, read=same)
ROLLOUT_EP = VerlKey(f"{ROLLOUT}.expert_parallel_size", int, 1, field="layout.rollout_ep",
                     required=True, read=same)
ROLLOUT_PP = VerlKey(f"{ROLLOUT}.pipeline_model_parallel_size", int, 1, required=True)
GPU_MEMORY_UTILIZATION = VerlKey(f"{ROLLOUT}.gpu_memory_utilization", float, 0.5,
                                 field="layout.gpu_memory_utilization", required=True,
                                 write=lambda v, _: round(float(v), 2), read=same)
ROLLOUT_N = VerlKey(f"{ROLLOUT}.n", int, 1, field="workload.rollout_n", required=True,
                    read=same)
MAX_NUM_SEQS = VerlKey(f"{ROLLOUT}.max_num_seqs", int, 256, field="workload.max_num_seqs",
                       required=True, read=same)


def _batched_tokens(value: Any, _got=None) -> int:
    if value and not isinstance(value, (int, float)):
        raise BadValue(f"={value!r} is not an integer")
    return int(value or MAX_NUM_BATCHED_TOKENS.default)


MAX_NUM_BATCHED_TOKENS = VerlKey(f"{ROLLOUT}.max_num_batched_tokens", int, 8192,
                                 field="workload.max_num_batched_tokens", read=_batched_tokens)
CHUNKED_PREFILL = VerlKey(f"{ROLLOUT}.enable_chunked_prefill", bool, True, write=const(True))
PREFIX_CACHING = VerlKey(f"{ROLLOUT}.enable_prefix_caching", bool, True,
                         field="workload.prefix_caching", read=as_bool)
ENFORCE_EAGER = VerlKey(f"{ROLLOUT}.enforce_eager", bool, False, field="workload.enforce_eager",
                        read=as_bool)
FREE_CACHE_ENGINE = VerlKey(f"{ROLLOUT}.free_cache_engine", bool, True,
                            field="workload.free_cache_engine", read=as_bool,
                            mode_default={ONE_STEP_OFF: False})
# the engine samples in the actor's dtype: FP16 where the GPU has no BF16 (V100)
ROLLOUT_DTYPE = VerlKey(f"{ROLLOUT}.dtype", str, "bfloat16", field="workload.precision",
                        when=lambda v, _: v != "bf16", write=_dtype)
QUANTIZATION = VerlKey(f"{ROLLOUT}.quantization", str, None, field="workload.rollout_precision",
                       when=lambda v, _: v == "fp8",
                       read=lambda v, _: "fp8" if v == "fp8" else "bf16")
# fp8 KV cache: each engine's own spelling, under engine_kwargs.<engine> (empty in verl's YAML)
KV_CACHE_DTYPE = {engine: VerlKey(f"{ROLLOUT}.engine_kwargs.{engine}.kv_cache_dtype", str, None,
                                  origin=f"{engine}'s engine arguments", new=True,
                                  field="workload.rollout_precision", write=const(dtype),
                                  when=lambda v, s, e=engine: v == "fp8"
                                  and s.workload.rollout_engine == e)
                  for engine, dtype in (("vllm", "fp8"), ("sglang", "fp8_e5m2"))}

# MTP (verl workers/config/model.py MtpConfig; the rollout follows actor_rollout_ref.model.mtp):
# enable builds the MTP layers (speculation or training), enable_rollout speculates with them,
# enable_train trains them.  vLLM takes num_speculative_tokens; SGLang takes EAGLE's steps and
# draft tokens (async_sglang_server.py), k and k + 1 with top-1 drafting.
MTP = f"{MODEL}.mtp"


def _speculating(engine: str | None = None) -> Callable[[Any, Any], bool]:
    def when(_value, source) -> bool:
        workload = source.workload
        return getattr(workload, "speculative", "off") == "mtp" and (
            engine is None or workload.rollout_engine == engine)
    return when


def _mtp_tokens(value: Any, got: Reading) -> int:
    """Tokens drafted per step: the engine's own key; 1 when the rollout does not speculate."""
    if not (got[MTP_ENABLE] and got[MTP_ENABLE_ROLLOUT]):
        return 1
    return _strict_int(got[SGLANG_STEPS] if got[ROLLOUT_NAME] == "sglang" else value)


MTP_ENABLE = VerlKey(f"{MTP}.enable", bool, False, write=const(True),
                     when=lambda _, s: bool(getattr(s.workload, "mtp_enabled", False)))
MTP_ENABLE_ROLLOUT = VerlKey(f"{MTP}.enable_rollout", bool, False, field="workload.speculative",
                             when=_speculating(), write=const(True),
                             read=lambda v, got: "mtp" if v and got[MTP_ENABLE] else "off")
MTP_ENABLE_TRAIN = VerlKey(f"{MTP}.enable_train", bool, False, field="workload.train_mtp",
                           when=is_set, write=const(True),
                           read=lambda v, got: bool(v) and bool(got[MTP_ENABLE]))
MTP_TOKENS = VerlKey(f"{MTP}.num_speculative_tokens", int, 1,
                     field="workload.speculative_tokens", when=_speculating("vllm"),
                     read=_mtp_tokens)
SGLANG_STEPS = VerlKey(f"{MTP}.speculative_num_steps", int, 3, when=_speculating("sglang"),
                       write=lambda _, s: s.workload.speculative_tokens)
SGLANG_DRAFT_TOKENS = VerlKey(f"{MTP}.speculative_num_draft_tokens", int, 4,
                              when=_speculating("sglang"),
                              write=lambda _, s: s.workload.speculative_tokens + 1)
MTP_KEYS = (MTP_ENABLE, MTP_ENABLE_ROLLOUT, MTP_ENABLE_TRAIN, MTP_TOKENS, SGLANG_STEPS,
            SGLANG_DRAFT_TOKENS)

# the trainer
CRITIC_WARMUP = VerlKey("trainer.critic_warmup", int, 0, write=const(0))
LOGGER = VerlKey("trainer.logger", list, ["console", "wandb"], write=const(["console"]))
PROJECT_NAME = VerlKey("trainer.project_name", str, "verl_examples", write=const("verl_grpo"))
EXPERIMENT_NAME = VerlKey("trainer.experiment_name", str, "gsm8k",
                          write=lambda _, s: experiment_name(s.model, s.cluster))
GPUS_PER_NODE = VerlKey("trainer.n_gpus_per_node", int, 8, field="cluster.gpus_per_node",
                        write=lambda v, s: min(v, s.cluster.num_gpus), required=True,
                        read=same)
NNODES = VerlKey("trainer.nnodes", int, 1, field="cluster.num_nodes", required=True, read=same)
SAVE_FREQ = VerlKey("trainer.save_freq", int, -1, write=const(20))
TEST_FREQ = VerlKey("trainer.test_freq", int, -1, write=const(5))
TOTAL_EPOCHS = VerlKey("trainer.total_epochs", int, 30, write=const(15))


def experiment_name(model, cluster) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", f"{model.name}_{cluster.num_gpus}x{cluster.gpu.name}")


# --- what the asynchronous modes add (planner/placement.py; verl.experimental) ---------------
# Their trainers need separate pools (hybrid_engine off), the rollout's log-probs, parameters
# synced into a running engine; fully-async streams prompts one at a time.  A key the job above
# also writes appears again with the mode's value (``in_mode``), spelled once.


def in_mode(row: VerlKey, modes, value: Any) -> VerlKey:
    """``row`` as the asynchronous ``modes`` write it: the constant ``value``."""
    return replace(row, modes=frozenset(modes), field="", write=const(value), when=None,
                   read=None, required=False)


FULLY_ASYNC = frozenset({FULLY_ASYNC_MODE})
HYBRID_ENGINE = VerlKey("actor_rollout_ref.hybrid_engine", bool, True, modes=ASYNC_MODES,
                        write=const(False))
POOL_NNODES = VerlKey(f"{POOL}.nnodes", int, ABSENT, field="pool.rollout_nodes",
                      modes=ASYNC_MODES, mode_default={ONE_STEP_OFF: 1, FULLY_ASYNC_MODE: 1})
POOL_GPUS_PER_NODE = VerlKey(f"{POOL}.n_gpus_per_node", int, ABSENT,
                             field="pool.rollout_gpus_per_node", modes=ASYNC_MODES,
                             mode_default={ONE_STEP_OFF: 8, FULLY_ASYNC_MODE: 8})
CALCULATE_LOG_PROBS = VerlKey(f"{ROLLOUT}.calculate_log_probs", bool, True, modes=ASYNC_MODES,
                              write=const(True),
                              mode_default={ONE_STEP_OFF: True, FULLY_ASYNC_MODE: True})
# one-step-off's root config finds ppo_trainer through file://verl/trainer/config, which
# resolves only inside a verl checkout; the installed package works from anywhere
HYDRA_SEARCHPATH = VerlKey("hydra.searchpath", list, ABSENT, origin="Hydra",
                           modes=frozenset({ONE_STEP_OFF}),
                           write=const(["pkg://verl.trainer.config"]))
GEN_BATCH_SIZE = VerlKey("data.gen_batch_size", int, None, modes=FULLY_ASYNC, write=const(1),
                         mode_default={FULLY_ASYNC_MODE: 1})
# the recipe config's 100 would stop after 100 prompts; null: the dataset's length
TOTAL_ROLLOUT_STEPS = VerlKey(f"{POOL}.total_rollout_steps", int, ABSENT, modes=FULLY_ASYNC,
                              write=const(None), mode_default={FULLY_ASYNC_MODE: 100})
STALENESS = VerlKey(f"{ASYNC_TRAINING}.staleness_threshold", float, ABSENT, modes=FULLY_ASYNC,
                    field="async_training.staleness_threshold",
                    mode_default={FULLY_ASYNC_MODE: 0.1})
TRIGGER_SYNC = VerlKey(f"{ASYNC_TRAINING}.trigger_parameter_sync_step", int, ABSENT,
                       modes=FULLY_ASYNC, field="async_training.trigger_parameter_sync_step",
                       mode_default={FULLY_ASYNC_MODE: 4})
REQUIRE_BATCHES = VerlKey(f"{ASYNC_TRAINING}.require_batches", int, ABSENT, modes=FULLY_ASYNC,
                          field="async_training.require_batches",
                          mode_default={FULLY_ASYNC_MODE: 1})
PARTIAL_ROLLOUT = VerlKey(f"{ASYNC_TRAINING}.partial_rollout", bool, ABSENT, modes=FULLY_ASYNC,
                          field="async_training.partial_rollout",
                          mode_default={FULLY_ASYNC_MODE: True})
# what the modes' root configs set that the planner leaves as they are
CHECKPOINT_BACKEND = VerlKey(f"{ROLLOUT}.checkpoint_engine.backend", str, "naive",
                             mode_default={ONE_STEP_OFF: "nccl", FULLY_ASYNC_MODE: "nccl"})
USE_ROLLOUT_LOG_PROBS = VerlKey(f"{ACTOR}.use_rollout_log_probs", bool, ABSENT,
                                mode_default={FULLY_ASYNC_MODE: True})
STANDALONE_MEMORY = VerlKey(f"{ROLLOUT}.standalone_gpu_memory_utilization", float, ABSENT,
                            mode_default={FULLY_ASYNC_MODE: None})
REMOVE_PADDING = VerlKey(f"{MODEL}.use_remove_padding", bool, True,
                         mode_default={FULLY_ASYNC_MODE: True})
POOL_N = VerlKey(f"{POOL}.n", int, ABSENT, mode_default={FULLY_ASYNC_MODE: 4})
ASYNC_DEFAULTS = {name: VerlKey(f"{ASYNC_TRAINING}.{name}", type(value), ABSENT,
                                mode_default={FULLY_ASYNC_MODE: value})
                  for name, value in (("use_trainer_do_validate", False),
                                      ("use_dynamic_resource_scheduling", False),
                                      ("dynamic_schedule_policy", "default"),
                                      ("dynamic_schedule_deactivate_ratio", 0.3),
                                      ("dynamic_schedule_enable_rebalance", True),
                                      ("concurrent_samples_per_replica", 16))}

# --- the table ----------------------------------------------------------------------------------

KEYS: tuple[VerlKey, ...] = (
    MODEL_ENGINE, ADV_ESTIMATOR, USE_KL_IN_REWARD, BYPASS_MODE,
    TRAIN_FILES, VAL_FILES, TRAIN_BATCH_SIZE, MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH,
    FILTER_OVERLONG_PROMPTS, TRUNCATION, MODEL_PATH, FUSED_KERNELS, LR, MINI_BATCH,
    MICRO_BATCH, DYNAMIC_BATCH, TOKEN_BUDGET, ROLLOUT_TOKEN_BUDGET, REF_TOKEN_BUDGET,
    ROLLOUT_LOG_PROB_MICRO, REF_LOG_PROB_MICRO,
    PPO_EPOCHS, USE_KL_LOSS, KL_LOSS_COEF, KL_LOSS_TYPE, ENTROPY_COEFF, ENTROPY_CHUNKING,
    ENTROPY_CHUNK,
    TP, PP, VPP, CP, EP, ETP, SEQUENCE_PARALLEL, DISTRIBUTED_OPTIMIZER, PARAM_OFFLOAD,
    OPTIMIZER_OFFLOAD, DTYPE,
    PRECISION_AWARE, EXP_AVG_DTYPE, EXP_AVG_SQ_DTYPE, MAIN_GRADS_DTYPE, PRECISION_AWARE_OVERRIDE,
    CPU_OPTIMIZER, CPU_FRACTION, CPU_OPTIMIZER_OVERLAP, GRAD_REDUCE_IN_FP32, OVERLAP_GRAD_REDUCE,
    RECOMPUTE, RECOMPUTE_METHOD, RECOMPUTE_NUM_LAYERS, RECOMPUTE_MODULES, GROUPED_GEMM,
    PIPELINE_LAYOUT, ACCOUNT_EMBEDDING, ACCOUNT_LOSS, FIRST_STAGE, LAST_STAGE, ADD_BIAS_LINEAR,
    USE_MBRIDGE, VANILLA_MBRIDGE,
    REF_PARAM_OFFLOAD, REF_DTYPE, *REF_PARALLEL.values(),
    ROLLOUT_NAME, ROLLOUT_TP, ROLLOUT_DP, ROLLOUT_EP, ROLLOUT_PP, GPU_MEMORY_UTILIZATION,
    ROLLOUT_N, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, CHUNKED_PREFILL, PREFIX_CACHING,
    ENFORCE_EAGER, FREE_CACHE_ENGINE, ROLLOUT_DTYPE, QUANTIZATION, *KV_CACHE_DTYPE.values(),
    *MTP_KEYS,
    CRITIC_WARMUP, LOGGER, PROJECT_NAME, EXPERIMENT_NAME, GPUS_PER_NODE, NNODES, SAVE_FREQ,
    TEST_FREQ, TOTAL_EPOCHS,
    # the asynchronous modes, in the order their overrides follow the job's
    HYBRID_ENGINE, POOL_NNODES, POOL_GPUS_PER_NODE, in_mode(FREE_CACHE_ENGINE, ASYNC_MODES, False),
    CALCULATE_LOG_PROBS, in_mode(BYPASS_MODE, ASYNC_MODES, True), HYDRA_SEARCHPATH,
    in_mode(TRAIN_BATCH_SIZE, FULLY_ASYNC, 0), GEN_BATCH_SIZE, TOTAL_ROLLOUT_STEPS, STALENESS,
    TRIGGER_SYNC, REQUIRE_BATCHES, PARTIAL_ROLLOUT,
    # only what the modes' root configs set
    CHECKPOINT_BACKEND, USE_ROLLOUT_LOG_PROBS, STANDALONE_MEMORY, REMOVE_PADDING, POOL_N,
    *ASYNC_DEFAULTS.values(),
)

JOB_KEYS = tuple(row for row in KEYS if row.modes is None and row.written)
READ_KEYS = tuple(row for row in KEYS if row.modes is None and (row.read or row.required))


def mode_keys(mode: str) -> tuple[VerlKey, ...]:
    """The rows an asynchronous mode writes on top of the job, in order."""
    return tuple(row for row in KEYS if row.modes and mode in row.modes)


def written(rows, source: Source) -> list[tuple[VerlKey, Any]]:
    """``(row, verl value)`` of each row the export writes for ``source``, in order."""
    out = []
    for row in rows:
        write, value = row.value_of(source)
        if write:
            out.append((row, value))
    return out


# What each asynchronous mode's root config sets on top of ppo_trainer (verl 0.9.1's
# one_step_off_ppo_trainer.yaml / fully_async_ppo_trainer.yaml).  An exported grpo.yaml cannot
# take those files as defaults (they set hydra.searchpath, which Hydra allows only in the
# primary config), so it carries these keys itself, in this order.
_MODE_ROOT_ORDER = {
    ONE_STEP_OFF: (FREE_CACHE_ENGINE, CALCULATE_LOG_PROBS, CHECKPOINT_BACKEND, BYPASS_MODE,
                     POOL_NNODES, POOL_GPUS_PER_NODE),
    FULLY_ASYNC_MODE: (USE_ROLLOUT_LOG_PROBS, CALCULATE_LOG_PROBS, CHECKPOINT_BACKEND,
                    STANDALONE_MEMORY, REMOVE_PADDING, GEN_BATCH_SIZE, BYPASS_MODE, STALENESS,
                    TRIGGER_SYNC, REQUIRE_BATCHES, PARTIAL_ROLLOUT, *ASYNC_DEFAULTS.values(),
                    POOL_NNODES, POOL_GPUS_PER_NODE, POOL_N, TOTAL_ROLLOUT_STEPS),
}
MODE_CONFIG_KEYS = {mode: {row.key: row.mode_default[mode] for row in rows}
                    for mode, rows in _MODE_ROOT_ORDER.items()}

# planner layout field -> key under ``actor_rollout_ref.actor.megatron``
PARALLEL_KEYS = {name: row.key[len(MEGATRON) + 1:] for name, row in ACTOR_PARALLEL.items()}

# What a user supplies at launch: (environment variable, override key).  The script reads each
# from the environment with the planned value as default; the YAML through ${oc.env:...}.
LAUNCH_VARIABLES = (("MODEL_PATH", MODEL_PATH.key), ("TRAIN_FILES", TRAIN_FILES.key),
                    ("VAL_FILES", VAL_FILES.key), ("NNODES", NNODES.key),
                    ("GPUS_PER_NODE", GPUS_PER_NODE.key))
