"""What ``plan-parallel validate`` prints: the per-module summary and the text report.

The report itself is a dict (:func:`planner.diagnose.validate.dry_run`, also the ``--format json``
output); this module only lays it out for people.
"""

from __future__ import annotations

from planner.output import exact_of, fraction, gib
from planner.policy import PEAK_NAME, WORKING_SET_NAME
from planner.report.text import format_table
from planner.units import GIB


def module_rows(job, layout, estimate) -> dict[str, dict]:
    """Actor, reference (None without a KL loss) and rollout: sizes, micro-batch, offload and
    the predicted peak of the phases each one runs."""

    capacity = estimate.cluster.gpu.memory_bytes / GIB if estimate else None

    def memory(*phases):
        if estimate is None:
            return None, None
        peak = max(estimate.candidate.memory.phase_bytes.of_phase(phase) for phase in phases)
        return gib(peak), fraction(peak / GIB / capacity)

    actor_peak = memory("update_actor", "old_log_prob", "weight_sync")
    ref_peak = memory("ref")
    rollout_peak = memory("generate")
    a, r, ro = job.actor, job.ref, job.rollout

    def ref_dp():
        size = (r["tp"] or 1) * (r["pp"] or 1) * (r["cp"] or 1)
        return job.world // size if size and job.world % size == 0 else None

    offload = "+".join(name for name, on in (("param", job.param_offload),
                                              ("optimizer", job.optimizer_offload)) if on)
    return {
        "actor": {"tp": a["tp"], "pp": a["pp"], "vpp": a["vpp"] or 1, "cp": a["cp"],
                  "ep": a["ep"], "etp": layout.etp if layout else a["etp"], "dp": job.dp,
                  "micro_batch": "dynamic" if job.dynamic_batch else job.micro_batch,
                  "offload": offload or "-", "peak_memory_gib": actor_peak[0],
                  "memory_utilization": actor_peak[1]},
        "reference": {"tp": r["tp"], "pp": r["pp"], "vpp": r["vpp"] or 1, "cp": r["cp"],
                      "ep": r["ep"], "etp": r["etp"] if r["etp"] is not None else
                      (layout.etp if layout else None), "dp": ref_dp(),
                      "micro_batch": "dynamic" if job.dynamic_batch else job.ref_micro_batch,
                      "offload": "param" if job.ref_param_offload else "-",
                      "peak_memory_gib": ref_peak[0], "memory_utilization": ref_peak[1]}
        if job.use_kl else None,
        "rollout": {"tp": ro["tp"], "pp": ro["pp"], "vpp": None, "cp": None, "ep": ro["ep"],
                    "etp": None, "dp": ro["dp"],
                    "micro_batch": "dynamic" if job.dynamic_batch else ro["micro"],
                    "offload": "sleep" if ro["free_cache_engine"] else "-",
                    "peak_memory_gib": rollout_peak[0], "memory_utilization": rollout_peak[1]},
    }


def summary_table(modules: dict) -> str:
    rows = []
    for name, module in modules.items():
        if module is None:
            continue
        cells = {key: "-" if value is None else value for key, value in module.items()}
        cells["module"] = name
        cells["peak"] = "-" if module["peak_memory_gib"] is None else \
            f"{module['peak_memory_gib']:.1f}"
        cells["util"] = "-" if module["memory_utilization"] is None else \
            f"{100 * module['memory_utilization']:.0f}%"
        rows.append(cells)
    columns = [("module", "module"), ("TP", "tp"), ("PP", "pp"), ("VPP", "vpp"), ("CP", "cp"),
               ("EP", "ep"), ("ETP", "etp"), ("DP", "dp"), ("micro", "micro_batch"),
               ("offload", "offload"), (f"{PEAK_NAME} GiB", "peak"), ("util", "util")]
    return format_table(rows, columns)


def render_text(report: dict) -> str:
    lines = [f"validate {report['source']} ({report['input']}): verl "
             f"{report['verl']['installed']} (checks target {report['verl']['targeted']}), "
             f"config {report['config']}"]
    if report["cluster"]:
        cluster = report["cluster"]
        lines.append(f"{report['model']} on {cluster['num_gpus']} x {cluster['gpu_type']} "
                     f"({cluster['num_nodes']} node(s) x {cluster['gpus_per_node']})")
    if report["modules"]:
        lines += ["", summary_table(report["modules"])]
    placement = report.get("placement")
    if placement:
        lines.append(f"mode {report.get('mode')}: trainer pool {placement['trainer_gpus']} GPUs "
                     f"(the cluster above), rollout pool {placement['rollout_gpus']} GPUs")
    memory = report["memory"]
    if memory and placement:
        trainer, rollout = memory["trainer"], memory["rollout"]
        lines += ["", f"trainer pool: predicted peak {trainer['peak_memory_gib']:.2f} GiB "
                      f"({100 * trainer['memory_utilization']:.0f}%) in {trainer['peak_phase']}; "
                      f"phases (GiB): " + "  ".join(f"{phase} {gib:.1f}" for phase, gib
                                                    in trainer["memory_gib"].items()),
                  f"rollout pool: vLLM alone at gpu_memory_utilization "
                  f"{rollout['gpu_memory_utilization']}: peak {rollout['peak_memory_gib']:.2f} "
                  f"GiB ({100 * rollout['memory_utilization']:.0f}%), "
                  + (f"{rollout['kv_cache_gib']:.2f} GiB KV cache per GPU"
                     if rollout["kv_cache_tokens_per_gpu"] is None
                     else f"{rollout['kv_cache_tokens_per_gpu']:,} KV tokens per GPU")]
    elif memory:
        band, memory = memory["memory_band"], exact_of(memory)  # each figure rounded once
        lines += ["", f"predicted {PEAK_NAME} {memory['peak_memory_gib']:.2f} GiB "
                      f"({100 * memory['memory_utilization']:.0f}%, {band['position']} the "
                      f"{100 * band['low']:.0f}-{100 * band['high']:.0f}% band) in "
                      f"{memory['peak_phase']} ({memory['peak_stage']} pipeline stage)",
                  f"{PEAK_NAME} per phase (GiB):       "
                  + "  ".join(f"{phase} {gib:.1f}" for phase, gib in memory["memory_gib"].items()),
                  f"{WORKING_SET_NAME} per phase (GiB): "
                  + "  ".join(f"{phase} {gib:.1f}"
                              for phase, gib in memory["working_set_gib"].items())]
    findings = report["findings"]
    if findings:
        lines.append("")
    for finding in findings:
        lines.append(f"{finding['level']}: [{finding['check']}] {finding['message']}")
    lines += [f"note: {note}" for note in report["notes"]]
    errors = sum(f["level"] == "error" for f in findings)
    warnings = len(findings) - errors
    lines += ["", (f"would launch ({warnings} warning(s))" if report["would_launch"]
                   else f"would NOT launch: {errors} error(s), {warnings} warning(s)")]
    return "\n".join(lines)
