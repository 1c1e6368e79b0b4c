"""``plan-parallel validate``: a dry run of a verl GRPO job on the Megatron backend.

Input: a verl launch script, a Hydra YAML file, or ``-- key=value ...`` overrides (or a script
or YAML plus overrides, appended the way ``"$@"`` appends them).  The job's config is composed
as verl would compose it, verl's own validation runs, then the checks verl does not make
(:mod:`planner.verl.checks`) and the planner's memory estimate for the layout it reads.
The text report is laid out by :mod:`planner.diagnose.validate_report`.

The report says whether the job would launch (``would_launch``); the CLI maps that to exit
code 0 or 1, and unreadable input (:class:`planner.errors.PlanInputError`) to 2.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from planner.bounds import MAX_JSON_DEPTH, json_depth, shown
from planner.catalog.engines import engine_problem
from planner.catalog.hardware import (
    DEFAULT_GPU,
    ClusterSpec,
    detect_local_gpus,
    get_gpu,
    gpu_from_detected,
)
from planner.catalog.models import (
    ModelSpec,
    builtin_model,
    catalog_name,
    load_model_config_path,
    resolve_model,
)
from planner.catalog.workload import GrpoWorkload
from planner.cost.request import PlanRequest
from planner.diagnose.validate_report import module_rows
from planner.errors import InvalidLayoutError, PlanInputError, ResourceLimitError
from planner.modes import mode_of_config
from planner.output import memory_report_json
from planner.plan import estimate_layout
from planner.policy import DEFAULT_POLICY, PEAK_NAME, MemoryPolicy
from planner.search.layout import Layout
from planner.units import GIB
from planner.verl.checks import (
    backend_findings,
    batch_findings,
    model_findings,
    recompute_findings,
    reference_findings,
    rollout_findings,
)
from planner.verl.config import (
    ComposeError,
    added_keys,
    compose,
    entry_dir,
    installed_verl_version,
    mode_base_config,
    read_yaml_document,
    resolve_config_dir,
    resolve_config_path,
    target_findings,
    to_plain,
    verl_checks,
    verl_config_dir,
)
from planner.verl.findings import Finding
from planner.verl.job import layout_of, read_job, workload_of
from planner.verl.keys import (
    MEGATRON,
    MODE_CONFIG,
    MODE_ENTRY,
    REF,
    ROLLOUT,
    ROOT_CONFIG,
    VERL_VERSION,
    get,
)
from planner.verl.pools import PACKAGE_SEARCHPATH, pool_memory, pools_of
from planner.verl.script import expand_override, read_launch_script

YAML_SUFFIXES = (".yaml", ".yml")


# --- input ----------------------------------------------------------------------------------


def _settings(items) -> dict[str, str]:
    out = {}
    for item in items:
        name, equals, value = item.partition("=")
        if not equals or not name.isidentifier():
            raise PlanInputError(f"--set {item!r} is not VAR=VALUE")
        out[name] = value
    return out


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """``--set`` values visible to OmegaConf's ${oc.env:...} while the config resolves."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _is_path(item: str) -> bool:
    try:
        return "=" not in item or Path(item).is_file()
    except OSError:  # a name longer than the file system takes: an override, if anything
        return False


def _inside_verl_experimental(config_dir: Path) -> bool:
    """A config folder of the installed verl's ``verl/experimental`` (the asynchronous modes)."""
    experimental = verl_config_dir().parents[1] / "experimental"
    return Path(config_dir).resolve().is_relative_to(experimental.resolve())


def _check_override(item: str) -> str:
    """An override's nesting is bounded before Hydra's parser (which recurses) sees it."""
    depth = json_depth(item)
    if depth > MAX_JSON_DEPTH:
        raise ResourceLimitError(f"override {shown(item)} is nested {depth} levels deep; the "
                                 f"bound is {MAX_JSON_DEPTH}")
    return item


def read_input(inputs: list[str], environ: dict[str, str]):
    """``(kind, source, config_dir, config_name, overrides, notes, problems, extra_dirs)`` for
    the inputs (``problems``: errors found in reading them, e.g. a CRLF launch script;
    ``extra_dirs``: a script's ``--config-dir``, searched before ``config_dir``)."""
    if not inputs:
        raise PlanInputError("validate needs a launch script, a Hydra YAML or `-- key=value` "
                             "overrides")
    path = Path(inputs[0]) if _is_path(inputs[0]) else None
    extra = [expand_override(_check_override(item), environ)
             for item in inputs[1 if path else 0:]]
    if path is None:
        return "overrides", "overrides", verl_config_dir(), ROOT_CONFIG, extra, [], (), ()
    if not path.is_file():
        raise PlanInputError(f"{str(path)!r} is not a file (a launch script or Hydra YAML), nor "
                             f"a key=value override")
    if path.suffix in YAML_SUFFIXES:
        read_yaml_document(path)  # size, encoding, document shape, nesting: before Hydra
        return "yaml", str(path), path.resolve().parent, path.stem, extra, [], (), ()
    command = read_launch_script(path, environ)
    notes = list(command.notes)
    where = f"{path.name} line {command.line}"
    config_dir = resolve_config_path(command.mode, command.config_path)
    if not config_dir.is_dir():
        raise PlanInputError(
            f"{where}: --config-path {command.config_path} is not a directory (Hydra resolves a "
            f"relative path against the folder of {MODE_ENTRY[command.mode]}, "
            f"{entry_dir(command.mode)}; valid: an existing folder, relative to it or absolute)")
    extra_dirs: tuple[Path, ...] = ()
    if command.config_dir is not None:
        searched = resolve_config_dir(command.config_dir)
        if not searched.is_dir():
            raise PlanInputError(f"{where}: --config-dir {command.config_dir} is not a directory "
                                 f"(Hydra: \"Additional config directory '{searched}' not "
                                 f"found\"; a relative one is taken from the current folder)")
        extra_dirs = (searched,)
        notes.append(f"--config-dir {command.config_dir}: {searched} searched before "
                     f"{config_dir}")
    name = command.config_name or MODE_CONFIG[command.mode][1]
    for suffix in YAML_SUFFIXES:
        name = name[:-len(suffix)] if name.endswith(suffix) else name
    return ("script", str(path), config_dir, name, [*command.overrides, *extra], notes,
            command.problems, extra_dirs)


# --- model and cluster ----------------------------------------------------------------------


def resolve_job_model(model_path, model_flag: str | None):
    """The model: model.path's config.json, else --model, else a catalog name matching the path.
    Returns ``(spec, note)``."""
    problem = ""
    if isinstance(model_path, str) and model_path:
        path = Path(model_path).expanduser()
        config = path / "config.json" if path.is_dir() else path
        if config.is_file():
            try:
                return load_model_config_path(path), f"model from {config}"
            except PlanInputError as error:
                problem = f" ({error})"
    if model_flag:
        return resolve_model(model_flag), f"model {model_flag} (--model)"
    found = None
    name = Path(str(model_path or "")).name
    while name and not found:  # "DeepSeek-V3-0324", "Qwen2.5-7B-Instruct-AWQ"
        found = catalog_name(name)
        shorter = re.sub(r"[-_.](\d{4}|instruct|base|chat|hf|fp8|bf16|awq|gptq|int4|int8)$", "",
                         name, flags=re.IGNORECASE)
        name = "" if shorter == name else shorter
    if found:
        return builtin_model(found), (f"model {found} from the catalog (matched the name of "
                                      f"actor_rollout_ref.model.path {model_path}, which has no "
                                      f"readable config.json{problem})")
    raise PlanInputError(f"cannot tell the model: actor_rollout_ref.model.path {model_path!r} has"
                         f" no readable config.json{problem}; pass --model (a catalog name or a "
                         f"config.json)")


def resolve_gpu(gpu_type: str | None):
    if gpu_type:
        return get_gpu(gpu_type), None
    detected = detect_local_gpus()
    if detected is None:
        return get_gpu(DEFAULT_GPU), (f"no GPU visible through NVML; memory checked for "
                                      f"{DEFAULT_GPU} (pass --gpu-type to choose)")
    return gpu_from_detected(detected), None


def gpu_findings(config: dict, gpu) -> list[Finding]:
    """What the card itself rules out: BF16 on a part without it (V100: torch and vLLM stop at
    "Bfloat16 is only supported on GPUs with compute capability of at least 8.0"), and a rollout
    engine whose pinned build does not run on it (planner/catalog/engines.py)."""
    out = []
    if not gpu.bf16:
        keys = [key for key in (f"{MEGATRON}.dtype", f"{REF}.megatron.dtype", f"{ROLLOUT}.dtype")
                if get(config, key, "bfloat16") in ("bfloat16", "bf16")]
        if keys:
            fix = ", ".join(f"{key}=float16" for key in keys)
            out.append(Finding("precision", f"{gpu.name} has no BF16 tensor cores (BF16 needs "
                                            f"sm_80+): set {fix}", tuple(keys)))
    engine = get(config, f"{ROLLOUT}.name", "vllm")
    problem = engine_problem(gpu, engine) if isinstance(engine, str) else None
    if problem:
        out.append(Finding("rollout_engine", problem, (f"{ROLLOUT}.name",), level="warning"))
    return out


# --- memory -----------------------------------------------------------------------------------

PHASE_ADVICE = {
    "update_actor": "recompute (override_transformer_config.recompute_granularity), a smaller "
                    "ppo_micro_batch_size_per_gpu, more TP/PP, or optimizer_offload",
    "old_log_prob": "a smaller rollout.log_prob_micro_batch_size_per_gpu or more TP/PP",
    "ref": "a smaller ref.log_prob_micro_batch_size_per_gpu or more TP/PP",
    "generate": "a lower rollout.gpu_memory_utilization, or offloading the actor "
                "(megatron.param_offload/optimizer_offload) and the reference "
                "(ref.megatron.param_offload) during generation",
    "weight_sync": "actor param_offload or a lower rollout.gpu_memory_utilization",
}


def memory_findings(estimate, policy: MemoryPolicy = DEFAULT_POLICY) -> list:
    """Memory errors and warnings: the job does not fit, or its :data:`PEAK_NAME` sits outside
    the policy's band (``fix`` judges the same quantity against the same band)."""
    c, gpu = estimate.candidate, estimate.cluster.gpu
    capacity = gpu.memory_bytes / GIB
    peak = c.memory.peak_bytes / GIB
    phase, stage = c.memory.peak_phase, c.memory.peak_stage
    share = c.memory.utilization
    out = []
    # one whole sequence: its growing K/V plus what it keeps beside them (window pages,
    # Gated DeltaNet/Mamba state pages, in K/V-token units: planner.cost.memory; in bytes for
    # a model with no growing K/V, whose pool counts bytes too)
    state = int(round(float(estimate.row.get("kv_state_tokens_per_seq", 0.0))))
    if c.rollout.kv_in_bytes:
        holds = f"{c.rollout.kv_cache_tokens_per_gpu / GIB:.2f} GiB per GPU"
        needs = f"one sequence's {state / GIB:.2f} GiB of pages"
        short = c.rollout.kv_cache_tokens_per_gpu < state
    else:
        seq = estimate.workload.sequence_length + state
        holds = f"{c.rollout.kv_cache_tokens_per_gpu} tokens per GPU"
        needs = f"one {seq}-token sequence" + (f" (with its {state}-token fixed state)"
                                               if state else "")
        short = c.rollout.kv_cache_tokens_per_gpu < seq
    if short:
        out.append(Finding("memory", f"rollout KV cache holds {holds}, less than {needs}"
                           + ": raise "
                           f"actor_rollout_ref.rollout.gpu_memory_utilization "
                           f"({estimate.layout.gpu_memory_utilization}) or the rollout TP",
                           ("actor_rollout_ref.rollout.gpu_memory_utilization",)))
    where = (f"predicted {PEAK_NAME} {peak:.1f} GiB ({100 * share:.0f}% of {capacity:.1f} GiB) "
             f"in {phase} ({stage} pipeline stage)")
    if peak > capacity:
        out.append(Finding("memory", f"will not fit: {where} exceeds the GPU; try "
                           f"{PHASE_ADVICE[phase]}, or a layout from "
                           f"`plan-parallel --model {estimate.model.name} --gpus "
                           f"{estimate.cluster.num_gpus} --gpu-type {gpu.name}`"))
    elif policy.position(share) == "above":
        out.append(Finding("memory", f"{where} is above the {policy.band_text} band: a longer "
                           f"response or fragmentation may run it out of memory; try "
                           f"{PHASE_ADVICE[phase]} (`plan-parallel fix` scores each)", (),
                           "warning"))
    elif policy.position(share) == "below":
        out.append(Finding("memory", f"GPUs underused: {where} is below the "
                           f"{policy.band_text} band; less model "
                           f"parallelism or offload, larger micro-batches or a higher "
                           f"gpu_memory_utilization would use them", (), "warning"))
    domain = estimate.cluster.fast_domain_gpus
    lay = estimate.layout
    for flag, key, size in (("tp_across_nodes", "actor.megatron.tensor_model_parallel_size",
                             lay.tp),
                            ("expert_tp_across_nodes", "actor.megatron.expert_tensor_parallel_size",
                             lay.etp),
                            ("rollout_tp_across_nodes", "rollout.tensor_model_parallel_size",
                             lay.rollout_tp)):
        if flag in c.flags:
            out.append(Finding(flag, f"actor_rollout_ref.{key}={size} spans more GPUs than one "
                               f"NVLink domain ({domain}): its all-reduces cross the network",
                               (f"actor_rollout_ref.{key}",), "warning"))
    if "pipeline_starved" in c.flags:
        out.append(Finding("pipeline_starved", f"fewer micro-batches per mini-batch than "
                           f"pipeline stages ({lay.pp}): the pipeline idles most of the update",
                           ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"),
                           "warning"))
    return out


# --- the dry run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobInput:
    """What validate, fix and diff read a job from: a launch script, a Hydra YAML and/or
    overrides (``inputs``), ``VAR=VALUE`` settings for the script's variables, and the model
    and GPU when the job does not say."""

    inputs: tuple[str, ...]
    sets: tuple[str, ...] = ()
    model: str | None = None
    gpu_type: str | None = None
    policy: MemoryPolicy = DEFAULT_POLICY
    gpus: int | None = None  # the cluster an asynchronous job's pools must add up to


@dataclass(frozen=True)
class JobContext:
    """What a dry run read from a job, for the commands that go on from there (``fix``,
    ``diff``): the model, cluster, workload and layout, the composed config (plain dicts) and
    the overrides it was composed with."""

    model: ModelSpec
    cluster: ClusterSpec
    workload: GrpoWorkload
    layout: Layout
    config: dict
    overrides: tuple[str, ...]

    def request(self, policy: MemoryPolicy) -> PlanRequest:
        """The job as a plan request under ``policy``."""
        return PlanRequest(self.model, self.cluster, self.workload, policy=policy)


@dataclass(frozen=True)
class DryRun:
    """A dry run: ``report``, everything validate reports (the ``--format json`` output), and
    ``job``, what it read (None when the config gave no model, cluster, workload and layout)."""

    report: dict
    job: JobContext | None = None

    @property
    def would_launch(self) -> bool:
        return bool(self.report["would_launch"])


def dry_run(job_input: JobInput) -> DryRun:
    """Everything validate reports about a job, and what it read (:class:`DryRun`)."""
    reading: JobContext | None = None
    sets = _settings(job_input.sets)
    environ = {**os.environ, **sets}
    kind, source, config_dir, config_name, overrides, notes, problems, extra_dirs = read_input(
        list(job_input.inputs), environ)
    report = {"source": source, "input": kind, "config": f"{config_dir}/{config_name}",
              "verl": {"installed": installed_verl_version(), "targeted": VERL_VERSION},
              "overrides": overrides, "notes": notes, "findings": [], "modules": None,
              "model": None, "cluster": None, "workload": None, "layout": None, "memory": None}
    findings: list[Finding] = [Finding("launch_script", problem) for problem in problems]
    if report["verl"]["installed"] != VERL_VERSION:
        notes.append(f"installed verl is {report['verl']['installed']}; the checks target "
                     f"{VERL_VERSION}")

    def finish():
        report["findings"] = [finding.to_dict() for finding in findings]
        report["would_launch"] = not any(f.level == "error" for f in findings)
        return DryRun(report, reading)

    if (_inside_verl_experimental(config_dir)
            and not any(item.startswith("hydra.searchpath") for item in overrides)):
        # the asynchronous trainers' configs find ppo_trainer through file://verl/trainer/config
        # (a path relative to a verl checkout); the installed package is found from anywhere
        overrides = [*overrides, PACKAGE_SEARCHPATH]
    with _environment(sets):
        try:
            config, unknown = compose(overrides, config_dir, config_name, extra_dirs)
        except ComposeError as error:
            findings.append(Finding("compose", f"verl's Hydra config does not compose: {error}"))
            return finish()
        findings += unknown
        plain = to_plain(config)
        engine = get(plain, "model_engine", "megatron")
        reported = {key for finding in unknown for key in finding.keys}
        findings += [f for f in added_keys(config, mode_base_config(engine,
                                                                    mode_of_config(plain).name))
                     if not set(f.keys) & reported]
        unknown_names = {key.rsplit(".", 1)[-1] for f in findings if f.check == "unknown_key"
                         for key in f.keys}
        unsafe = target_findings(plain)
        findings += unsafe
        if unsafe:  # verl's checks instantiate _target_ nodes: never run them on these
            return finish()
        findings += [f for f in verl_checks(config)
                     if not any(f"argument '{name}'" in f.message for name in unknown_names)]
    findings += backend_findings(plain)
    if engine != "megatron":
        return finish()
    mode = mode_of_config(plain)
    report["mode"] = mode.name
    original = plain
    # a streaming mode's data.train_batch_size is 0: a step is what one parameter version trains
    plain = mode.step_config(plain)
    job, problems = read_job(plain)
    findings += problems
    if job is None:
        return finish()
    findings += reference_findings(job) + rollout_findings(job) + batch_findings(plain, job)
    model, note = resolve_job_model(get(plain, "actor_rollout_ref.model.path", None),
                                    job_input.model)
    notes.append(note)
    findings += recompute_findings(job, model)
    gpu, gpu_note = resolve_gpu(job_input.gpu_type)
    if gpu_note:
        notes.append(gpu_note)
    cluster = ClusterSpec(gpu, job.world, job.gpus_per_node)
    report["model"], report["cluster"] = model.name, cluster.to_dict()
    findings += gpu_findings(plain, gpu)
    pools = None
    if not mode.colocated:
        pools = pools_of(plain, cluster)
        findings += mode.job_findings(original, pools, job_input.gpus)
        report["placement"] = {"trainer_gpus": pools.trainer.num_gpus,
                               "rollout_gpus": pools.rollout.num_gpus, "colocated": False}
    estimate, layout = None, None
    try:
        workload = workload_of(job, model.name)
        layout = layout_of(job, model.is_moe)
    except PlanInputError as error:
        findings.append(Finding("bad_value", str(error)))
    else:
        report["workload"], report["layout"] = workload.to_dict(), layout.to_dict()
        if workload.lengths is not None:  # the lengths the times rest on: verl states none
            notes.append(workload.lengths.sentence(flags=False) + ", as verl's config states no "
                         "mean; `plan-parallel estimate` takes --response-lengths")
        reading = JobContext(model=model, cluster=cluster, workload=workload, layout=layout,
                             config=plain, overrides=tuple(overrides))
        shape = model_findings(plain, job, reading.request(job_input.policy), layout)
        if pools is not None:  # the rollout lives on its own pool: its rules are checked there
            shape = [f for f in shape if not f.check.startswith("rollout")]
        findings += shape
        if pools is not None:
            if not any(f.level == "error" for f in findings):
                memory, pool_problems = pool_memory(reading.request(job_input.policy), pools,
                                                    layout)
                findings += pool_problems
                report["memory"] = memory
            report["modules"] = module_rows(job, layout, None)
            return finish()
        if not any(f.level == "error" for f in shape):
            try:
                estimate = estimate_layout(reading.request(job_input.policy), layout)
            except InvalidLayoutError:  # a rule validate reports per verl key (CHECKED_PER_KEY)
                estimate = None
        if estimate is not None:
            report["layout"] = estimate.layout.to_dict()  # with the pipeline split resolved
            findings += memory_findings(estimate, job_input.policy)
            report["memory"] = memory_report_json(estimate.candidate, job_input.policy)
        else:
            notes.append("memory not estimated: the layout breaks the rules above")
    report["modules"] = module_rows(job, layout, estimate)
    return finish()
