"""The planner's reading of a composed verl config: cluster size, workload, layout.

Input is the resolved config as plain data (:func:`planner.verl.config.to_plain`).  Each field
is read from its row of the key map (:mod:`planner.verl.keymap`), the table the export writes
from.  Values that are missing or of the wrong type become findings that name the key, so a dry
run reports them instead of failing on them; with several, they come in the table's order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.catalog.workload import GrpoWorkload
from planner.search.layout import Layout
from planner.verl.findings import Finding
from planner.verl.keymap import (
    _MISSING,
    ACTOR_PARALLEL,
    FREE_CACHE_ENGINE,
    GPU_MEMORY_UTILIZATION,
    GPUS_PER_NODE,
    NNODES,
    READ_KEYS,
    REF_LOG_PROB_MICRO,
    REF_PARALLEL,
    ROLLOUT_DP,
    ROLLOUT_EP,
    ROLLOUT_LOG_PROB_MICRO,
    ROLLOUT_NAME,
    ROLLOUT_PP,
    ROLLOUT_TP,
    SEQUENCE_PARALLEL,
    TRANSFORMER,
    BadValue,
    Reading,
    VerlKey,
    get,
)


@dataclass(frozen=True)
class JobReading:
    """The values the planner needs, each from its verl key; ``None`` where unreadable."""

    world: int
    nnodes: int
    gpus_per_node: int
    actor: dict[str, int | None]  # tp, pp, vpp (None = 1), cp, ep, etp (None = TP)
    ref: dict[str, int | None]
    sequence_parallel: bool
    distributed_optimizer: bool
    param_offload: bool
    optimizer_offload: bool
    ref_param_offload: bool
    recompute: str
    first_stage_layers: int  # 0: not set
    last_stage_layers: int
    dynamic_batch: bool
    micro_batch: int  # actor ppo_micro_batch_size_per_gpu, or tokens-equivalent when dynamic
    rollout: dict[str, Any]  # tp, dp, ep, pp, name, gpu_memory_utilization, micro
    ref_micro_batch: int | None
    train_batch_size: int
    rollout_n: int
    prompt_length: int
    response_length: int
    mini_batch_size: int
    ppo_epochs: int
    precision: str
    use_kl: bool  # a reference model is built (KL loss or KL in the reward)
    use_kl_loss: bool
    max_num_seqs: int
    transformer: dict = field(default_factory=dict)  # override_transformer_config
    # every layout and workload field, read from its key (planner.verl.keymap); the layout's
    # ETP as the config says it (None: unset), see layout_of
    layout_fields: dict = field(default_factory=dict)
    workload_fields: dict = field(default_factory=dict)

    @property
    def dp(self) -> int:
        size = self.actor["tp"] * self.actor["pp"] * self.actor["cp"]
        return max(self.world // size, 1)

    @property
    def sequence_length(self) -> int:
        return self.prompt_length + self.response_length


_KINDS = {int: "an integer", bool: "True or False", float: "a number", str: "a string"}


def _required(row: VerlKey, got: Reading) -> Finding | None:
    """A key the reader needs: present, of its kind (null only where ``nullable``), an integer
    at least 1.  The checked value (an integer given for a float, as a float) is kept."""
    value = get(got.config, row.key, _MISSING)
    if value is _MISSING:
        return Finding("missing_key", f"{row.key} is not set", (row.key,))
    if value is None and row.nullable:
        return None
    ok = isinstance(value, row.kind) and not (row.kind is int and isinstance(value, bool))
    if row.kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        return Finding("bad_value", f"{row.key}={value!r} is not {_KINDS[row.kind]}", (row.key,))
    if row.kind is int and value < 1:
        return Finding("bad_value", f"{row.key}={value} must be >= 1", (row.key,))
    got[row] = value
    return None


@dataclass
class FieldValues:
    """The planner fields a config's keys give, by the key map's target (a row's ``field`` is
    ``target.name``): the reader's mirror of the exporter's
    :class:`~planner.verl.keymap.Source`."""

    layout: dict = field(default_factory=dict)
    workload: dict = field(default_factory=dict)
    cluster: dict = field(default_factory=dict)


def read_fields(config: dict) -> tuple[Reading, FieldValues, list[Finding]]:
    """Every planner field the key map reads from ``config``, by target (``layout``,
    ``workload``, ``cluster``): the required keys checked first, then each field converted
    from its row (:data:`planner.verl.keymap.READ_KEYS`, in the table's order)."""
    got = Reading(config)
    fields = FieldValues()
    findings = [finding for row in READ_KEYS if row.required
                for finding in [_required(row, got)] if finding]
    if findings:
        return got, fields, findings
    for row in READ_KEYS:
        if row.read is None:
            continue
        try:
            value = row.read(got[row], got)
        except BadValue as error:
            findings.append(Finding(error.check, f"{row.key}{error.text}", (row.key,)))
            continue
        target, name = row.field.split(".", 1)
        getattr(fields, target)[name] = value
    return got, fields, findings


def read_job(config: dict) -> tuple[JobReading | None, list[Finding]]:
    """The reading, or ``None`` with the findings that prevented it."""
    got, fields, findings = read_fields(config)
    if findings:
        return None, findings
    layout, workload = fields.layout, fields.workload
    rollout = {"name": got[ROLLOUT_NAME] if got.present(ROLLOUT_NAME) else None,
               "tp": got[ROLLOUT_TP], "dp": got[ROLLOUT_DP], "ep": got[ROLLOUT_EP],
               "pp": got[ROLLOUT_PP], "gpu_memory_utilization": got[GPU_MEMORY_UTILIZATION],
               "micro": got[ROLLOUT_LOG_PROB_MICRO],
               "free_cache_engine": bool(got[FREE_CACHE_ENGINE])}
    reading = JobReading(
        world=got[NNODES] * got[GPUS_PER_NODE], nnodes=got[NNODES],
        gpus_per_node=got[GPUS_PER_NODE],
        actor={name: got[row] for name, row in ACTOR_PARALLEL.items()},
        ref={name: got[row] for name, row in REF_PARALLEL.items()},
        sequence_parallel=bool(got[SEQUENCE_PARALLEL]),
        distributed_optimizer=layout["distributed_optimizer"],
        param_offload=layout["param_offload"], optimizer_offload=layout["optimizer_offload"],
        ref_param_offload=layout["ref_param_offload"], recompute=layout["recompute"],
        first_stage_layers=layout["first_stage_layers"],
        last_stage_layers=layout["last_stage_layers"], dynamic_batch=layout["dynamic_batch"],
        micro_batch=layout["micro_batch"], rollout=rollout,
        ref_micro_batch=got[REF_LOG_PROB_MICRO],
        train_batch_size=workload["train_batch_size"], rollout_n=workload["rollout_n"],
        prompt_length=workload["prompt_length"], response_length=workload["response_length"],
        mini_batch_size=workload["mini_batch_size"], ppo_epochs=workload["ppo_epochs"],
        precision=workload["precision"],
        use_kl=workload["use_kl_loss"] or workload["use_kl_in_reward"],
        use_kl_loss=workload["use_kl_loss"], max_num_seqs=workload["max_num_seqs"],
        transformer=get(config, TRANSFORMER, {}) or {}, layout_fields=layout,
        workload_fields=workload)
    return reading, []


def workload_of(job: JobReading, model_name: str = ""):
    """The GRPO workload the config describes (raises PlanInputError when inconsistent).  verl's
    config states no mean response length: the time model runs over the published lengths for
    the kind of job ``model_name`` does, as a plan with none given
    (:func:`planner.catalog.lengths.default_lengths`)."""
    from planner.catalog.lengths import default_lengths

    fields = dict(job.workload_fields)
    if fields.get("lengths") is None and not fields.get("mean_response_length"):
        fields["lengths"] = default_lengths(int(fields["response_length"]), model_name)
    return GrpoWorkload(**fields)


def layout_of(job: JobReading, is_moe: bool):
    """The planner's layout for the job.  ETP unset means TP for an MoE model (megatron-core's
    default); a dense model has no experts, so its ETP reads as 1.  Raises PlanInputError on
    out-of-range values."""
    fields = dict(job.layout_fields)
    etp = fields["etp"]
    fields["etp"] = (fields["tp"] if etp is None else etp) if is_moe else 1
    return Layout(dp=job.dp, **fields)
