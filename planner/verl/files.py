"""The three files of an exported verl job: launch script, Hydra config, plan.json.

All three render :meth:`ExportedJob.overrides` (one list, from
:func:`planner.verl.export.job_overrides`), so they say the same thing.  They are deterministic
(no timestamps, rounded predictions) so the configs library can be checked against the planner.

* ``run_grpo.sh`` in the style of verl's examples: ``python3 -m verl.trainer.main_ppo`` with one
  Hydra override per line; model path, data files and node counts come from the environment
  (``$MODEL_PATH``, ``$TRAIN_FILES``, ``$VAL_FILES``, ``$NNODES``, ``$GPUS_PER_NODE``) with the
  planned values as defaults; extra arguments are appended as overrides.
* ``grpo.yaml``: the same settings on top of verl's ``ppo_trainer`` (found through
  ``hydra.searchpath``), for ``--config-path=<absolute dir> --config-name=grpo``.
* ``plan.json``: layout, predictions, planner and verl versions.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Sequence

from planner.errors import PlanInputError
from planner.extras import require
from planner.search.pipeline import pipeline_split
from planner.verl.export import (
    ENVIRONMENT,
    ExportedJob,
    hydra_quoted,
    job_from_plan,
    override_key,
    override_value,
)
from planner.verl.keys import (
    CONFIG_FILE,
    EXPORTED_FILES,
    LAUNCH_VARIABLES,
    MODE_CONFIG_KEYS,
    MODE_ENTRY,
    PATH_VARIABLES,
    SCRIPT_FILE,
    VERL_VERSION,
)
from planner.versions import planner_version

LAUNCH_KEYS = {key: name for name, key in LAUNCH_VARIABLES}


def _sentinel(name: str) -> str:
    return f"${{{name}}}"


def launch_overrides(job: ExportedJob) -> list[tuple[str, str | None, str]]:
    """``(override, launch variable or None, variable default)`` for the job's overrides.

    A path variable's default is the path itself (``~/<path>`` under the user's home), the
    other variables' defaults are Hydra value text.  An ``--override`` that sets a path key
    gives that variable its default; one that sets it to a list (``data.train_files=[a,b]``)
    is written as it is, without a variable."""
    sentinels = {name: _sentinel(name) for name in PATH_VARIABLES}
    overrides = job.overrides(sentinels)
    defaults = {
        "MODEL_PATH": job.model_path or f"~/models/{job.model.name}",
        "TRAIN_FILES": job.train_files or "~/data/gsm8k/train.parquet",
        "VAL_FILES": job.val_files or "~/data/gsm8k/test.parquet",
    }
    out = []
    for override in overrides:
        name = LAUNCH_KEYS.get(override_key(override))
        if name is None or override.startswith("~"):
            out.append((override, None, ""))
            continue
        value = override.split("=", 1)[1]
        if name not in PATH_VARIABLES:
            out.append((override, name, value))
        elif value == hydra_quoted(sentinels[name]):
            out.append((override, name, defaults[name]))
        elif isinstance(override_value(value), str):
            out.append((override, name, override_value(value)))
        else:
            out.append((override, None, ""))
    return out


def stages_text(job: ExportedJob) -> str:
    """The transformer layers on each pipeline stage (first/middle/../last), as megatron-core
    splits them; the layout string where one is set; nothing without a pipeline."""
    lay = job.layout
    if lay.pp < 2:
        return ""
    if lay.pipeline_layout:
        return f", pipeline layout {lay.pipeline_layout}"
    first, middle, last, _ = (int(part[0]) for part in pipeline_split(
        job.model.num_layers, [lay.pp], [lay.first_stage_layers], [lay.last_stage_layers],
        [lay.account_embedding], [lay.account_loss]))
    inner = {2: "", 3: f"{middle}/"}.get(lay.pp, f"{middle}/../")
    return f", layers per stage {first}/{inner}{last}"


def describe(job: ExportedJob) -> list[str]:

    lay, cluster, pred = job.layout, job.cluster, job.prediction
    replica = lay.rollout_tp * lay.rollout_dp
    placement = pred.get("placement", {})
    rollout_gpus = placement.get("rollout_gpus", cluster.num_gpus)
    lines = [
        f"GRPO with verl {VERL_VERSION} (Megatron backend): {job.model.name} on "
        f"{cluster.num_gpus} x {cluster.gpu.name} ({cluster.num_nodes} node(s) x "
        f"{min(cluster.gpus_per_node, cluster.num_gpus)} GPUs)",
        f"Planned by plan-parallel {planner_version()} (layout rank {job.rank}); plan.json holds "
        f"the layout and every prediction.",
        f"Workload:  {job.workload.describe()}",
        f"Actor:     {lay.actor_text()}" + stages_text(job),
        f"Reference: the actor's parallel sizes, param offload "
        f"{'yes' if lay.ref_param_offload else 'no'}",
        f"Rollout:   vLLM TP{lay.rollout_tp} DP{lay.rollout_dp} EP{lay.rollout_ep} "
        f"({rollout_gpus // replica} replica(s) of {replica} GPUs), "
        f"gpu_memory_utilization {lay.gpu_memory_utilization:.2f}",
        f"Predicted: peak {pred['peak_memory_gib']:.2f} GiB of {cluster.gpu.memory_gib:.1f} GiB "
        f"({100 * pred['memory_utilization']:.0f}%) in {pred['peak_phase']}"
        + (f"; step {pred['step_time_s']:.1f} s, {pred['tokens_per_s_per_gpu']:.0f} "
           f"tokens/s/GPU" if "step_time_s" in pred else ""),
    ]
    if job.mode != "sync":
        lines[0] = (f"GRPO with verl {VERL_VERSION} (Megatron backend), {job.mode} "
                    f"({MODE_ENTRY[job.mode]}): {job.model.name}; trainer pool "
                    f"{cluster.num_gpus} x {cluster.gpu.name} ({cluster.num_nodes} node(s) x "
                    f"{min(cluster.gpus_per_node, cluster.num_gpus)}), rollout pool "
                    f"{rollout_gpus} GPUs")
        lines[-1] = lines[-1].replace("Predicted: peak", "Predicted: trainer peak")
        lines.append(f"Off-policy: samples lag the policy by up to "
                     f"{pred.get('staleness', {}).get('max_versions_behind', 1)} parameter "
                     f"version(s); the algorithm differs from synchronous GRPO")
    return lines


def _double_quoted(text: str) -> str:
    """Text for inside "..." in bash, a ``~/`` prefix becoming ``$HOME/``."""
    home = text.startswith("~/")
    body = text[2:] if home else text
    for char in ("\\", '"', "$", "`"):
        body = body.replace(char, "\\" + char)
    return ("$HOME/" if home else "") + body


def path_check(names) -> list[str]:
    """Script lines that stop, before verl starts, on a path Hydra cannot take inside '...'.

    The script hands each path to Hydra as ``key='$PATH'``: spaces, commas, ``=``, brackets
    and any UTF-8 pass as they are, but a single quote, or a backslash at the end, would end
    the quoted string early.  Escaping them would need bash's ``${VAR//.../...}``, whose
    quoting rules differ between bash releases, so such a path is refused with its name."""
    words = " ".join(f'"${name}"' for name in names)
    if not words:
        return []
    return [
        "",
        "# Each path below reaches Hydra as key='PATH': any character but a single quote (or a "
        "final",
        "# backslash) passes as it is; a list of data files goes as an argument, "
        "data.train_files=[a,b]",
        f"for path in {words}; do",
        "  case \"$path\" in",
        f"    *\\'* | *\\\\) echo \"{SCRIPT_FILE}: path '$path' holds a single quote or ends "
        f"with a backslash, which Hydra's override parser cannot take inside '...'; rename "
        f"it or link it from a plain path\" >&2; exit 2 ;;",
        "  esac",
        "done",
    ]


def render_script(job: ExportedJob) -> str:
    items = launch_overrides(job)
    cluster = job.cluster
    lines = ["#!/usr/bin/env bash"]
    lines += [f"# {line}" for line in describe(job)]
    lines += [
        "#",
        f"# Usage: MODEL_PATH=... TRAIN_FILES=... VAL_FILES=... bash {SCRIPT_FILE} [key=value ...]",
        "#   Extra arguments are Hydra overrides appended to the command (the last one wins).",
        "#   Multi-node: start a Ray cluster first (`ray start --head` on the head node, "
        "`ray start",
        "#   --address=HEAD:6379` on the others) and run this script on the head node.",
        f"# Check before launching: plan-parallel validate {SCRIPT_FILE} --gpu-type "
        f"{cluster.gpu.name}",
        "set -xeuo pipefail",
        "",
    ]
    defaults = {name: default for _, name, default in items if name}
    for name, _ in LAUNCH_VARIABLES:
        if name in defaults:
            lines.append(f'{name}="${{{name}:-{_double_quoted(defaults[name])}}}"')
    lines.append("")
    for name, value, overridable, why in ENVIRONMENT:
        lines.append(f"# {why}")
        lines.append(f'export {name}="${{{name}:-{value}}}"' if overridable
                     else f"export {name}={value}")
    lines += path_check(name for name in PATH_VARIABLES if name in defaults)
    lines += ["", f"python3 -m {MODE_ENTRY[job.mode]} \\"]
    for override, name, _ in items:
        if name in PATH_VARIABLES:  # a Hydra quoted string around the path (hydra_quoted)
            key_part = override.split("=", 1)[0]
            lines.append(f'    "{key_part}=\'${{{name}}}\'" \\')
        elif name:
            key_part = override.split("=", 1)[0]
            lines.append(f'    {key_part}="${{{name}}}" \\')
        else:
            lines.append(f"    {shlex.quote(override)} \\")
    lines.append('    "$@"')
    return "\n".join(lines) + "\n"


def _oc_default(default: str) -> str:
    """A path variable's default as an ``oc.env`` default argument: a quoted string
    (OmegaConf's grammar quotes as Hydra's does), ``~/`` becoming ``${oc.env:HOME}/``."""
    if default.startswith("~/"):
        return hydra_quoted("${oc.env:HOME}/" + default[2:])
    return hydra_quoted(default)


def config_body(job: ExportedJob) -> dict:
    """The YAML body: the overrides as a nested mapping (``model_engine`` goes to defaults)."""
    body: dict = {}
    # an asynchronous mode's root-config keys first (keys.MODE_CONFIG_KEYS); overrides win
    for key, value in MODE_CONFIG_KEYS.get(job.mode, {}).items():
        node = body
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    for override, name, default in launch_overrides(job):
        key = override_key(override)
        if key == "model_engine" or key.startswith("hydra."):  # the head says those
            continue
        if override.startswith("~"):
            raise PlanInputError(f"--override {override!r} deletes a key; a deletion cannot be "
                                 f"written into {CONFIG_FILE}, pass it at launch")
        if name in PATH_VARIABLES:
            value = f"${{oc.env:{name},{_oc_default(default)}}}"
        else:
            value = override_value(override.split("=", 1)[1])
        node = body
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return body


def render_config(job: ExportedJob) -> str:
    yaml = require("yaml", "writing grpo.yaml")

    header = [f"# {line}" for line in describe(job)]
    header += [
        "#",
        "# Launch (Hydra wants an absolute --config-path):",
        f"#   python3 -m {MODE_ENTRY[job.mode]} --config-path=\"$(pwd)/DIR\" "
        f"--config-name={CONFIG_FILE[:-5]} [key=value ...]",
        "# Paths come from $MODEL_PATH, $TRAIN_FILES and $VAL_FILES when set.",
    ]
    head = {"hydra": {"searchpath": ["pkg://verl.trainer.config"]},
            "defaults": ["ppo_trainer", {"override model_engine": "megatron"}, "_self_"]}
    text = yaml.safe_dump(head, sort_keys=False, default_flow_style=False)
    body = yaml.safe_dump(config_body(job), sort_keys=False, default_flow_style=False,
                          width=100)
    return "\n".join(header) + "\n" + text + "\n" + body


def plan_json_data(job: ExportedJob) -> dict:

    prediction = {key: value for key, value in job.prediction.items()
                  if key not in ("rank", "layout")}
    return {
        "planner_version": planner_version(),
        "verl_version": VERL_VERSION,
        "backend": "megatron",
        "model": job.model.name,
        "cluster": job.cluster.to_dict(),
        "workload": job.workload.to_dict(),
        "rank": job.rank,
        **({"mode": job.mode} if job.mode != "sync" else {}),
        "layout": job.layout.to_dict(),
        "prediction": prediction,
        "files": {"script": SCRIPT_FILE, "config": CONFIG_FILE},
        "overrides": [override for override, _, _ in launch_overrides(job)],
    }


def render_plan_json(job: ExportedJob) -> str:
    return json.dumps(plan_json_data(job), indent=2) + "\n"


def write_job(job: ExportedJob, directory: Path, force: bool = False) -> list[Path]:
    """Write the launch script, the Hydra config and plan.json; never overwrite without
    ``force``."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise PlanInputError(f"--write {str(directory)!r} is a file, not a directory")
    paths = [directory / name for name in EXPORTED_FILES]
    existing = [str(path) for path in paths if path.exists()]
    if existing and not force:
        raise PlanInputError(f"{existing[0]} exists; pass --force to overwrite "
                             f"({', '.join(EXPORTED_FILES)} in {directory})")
    texts = (render_script(job), render_config(job), render_plan_json(job))
    directory.mkdir(parents=True, exist_ok=True)
    for path, text in zip(paths, texts):
        path.write_text(text)
    paths[0].chmod(0o755)
    return paths


def write_plan_job(plan, *, rank: int = 1, directory: Path, force: bool = False,
                   model_path: str | None = None, train_files: str | None = None,
                   val_files: str | None = None,
                   extra_overrides: Sequence[str] = ()) -> list[Path]:
    """``plan-parallel ... --write DIR``: the layout ranked ``rank`` as a runnable verl job."""
    job = job_from_plan(plan, rank, model_path=model_path, train_files=train_files,
                        val_files=val_files, extra_overrides=extra_overrides)
    return write_job(job, directory, force)
