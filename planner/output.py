"""The output boundary: the one place results become numbers people read.

Results (:mod:`planner.results`, :class:`~planner.plan.Plan`, the training modes' plans, the
sizing sweep) stay in bytes and seconds, unrounded, until here.  This module converts units
(bytes to GiB) and rounds -- each quantity to one precision, the helpers below -- and shapes the
JSON of ``--format json`` and ``plan.json``: the contract ``docs/plan.schema.json`` states and
the tests check real output against.  Text renderers (:mod:`planner.report`,
:mod:`planner.diagnose`) read the typed results and round each figure once, at their own
precision (at the JSON's precision they use the same helpers, so a table and its JSON agree; at
fewer decimals they format the exact value, never the JSON's rounded one).  Where a text
renders a JSON section itself (``explain``, ``fix``), the section is a :class:`Summary`: the
JSON's rounded figures, and the exact ones the text rounds once at its own precision (never the
JSON's figure rounded again: 73.551 -> 73.55 -> "73.5" where ``plan`` prints 73.6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from planner.cost.architecture import architecture_summary
from planner.cost.memory import engine_cache
from planner.phases import PHASES
from planner.policy import PEAK_NAME, MemoryPolicy
from planner.results import (
    ROLLOUT_PARTS,
    Candidate,
    ColocatedCandidate,
    Placement,
    SplitCandidate,
    Staleness,
)
from planner.units import GIB, SECONDS_PER_HOUR

if TYPE_CHECKING:
    from planner.placement import ModePlan, SplitEstimate
    from planner.plan import Estimate, Plan
    from planner.sizing.sweep import Blocked, Sizing, SizingRow

# --- units and precision: every figure the JSON reports ---------------------------------------


def gib(nbytes: float) -> float:
    """Bytes as GiB, two decimals (memory)."""
    return round(float(nbytes) / GIB, 2)


def seconds(value: float) -> float:
    """Seconds, three decimals (times)."""
    return round(float(value), 3)


def fraction(value: float) -> float:
    """A fraction, four decimals (memory utilization, shares, MFU, idle)."""
    return round(float(value), 4)


def rate(value: float) -> float:
    """A rate or throughput, one decimal (tokens/s, TFLOP/s)."""
    return round(float(value), 1)


def setting(value: float) -> float:
    """A ``gpu_memory_utilization`` setting, two decimals (what verl takes)."""
    return round(float(value), 2)


def finite(value: float, digits: int = 3) -> float | None:
    """Rounded; None for a time or rate a pool that cannot run has not got (inf, NaN)."""
    value = float(value)
    return round(value, digits) if np.isfinite(value) else None


# --- the parts of a candidate ------------------------------------------------------------------


def over_run_json(c: Candidate) -> dict:
    """Step time at the run's first and last step and expected over it (``step_time_s``):
    the mean response length moves over the run (:mod:`planner.cost.trajectory`)."""
    return {"start": seconds(c.step_time_start_s), "end": seconds(c.step_time_end_s),
            "expected": seconds(c.step_time_s)}


def placement_json(placement: Placement) -> dict:
    out = {"trainer_gpus": placement.trainer_gpus, "rollout_gpus": placement.rollout_gpus,
           "colocated": placement.colocated}
    if placement.trainer_nodes is not None:
        out.update(trainer_nodes=placement.trainer_nodes, rollout_nodes=placement.rollout_nodes)
    return out


def staleness_json(staleness: Staleness) -> dict:
    return {"max_versions_behind": staleness.max_versions_behind,
            "stale_sample_fraction": fraction(staleness.stale_sample_fraction),
            "off_policy": staleness.off_policy}


def band_json(policy: MemoryPolicy) -> dict:
    """The memory policy as the JSON outputs carry it: the band and the quantity it judges."""
    return {"low": policy.low, "high": policy.high, "judges": PEAK_NAME}


def colocated_json(c: ColocatedCandidate) -> dict:
    """One layout on every GPU: ``candidates[i]`` of ``plan --format json`` (without its mode
    and placement), ``estimate`` and ``plan.json``."""
    memory, rollout = c.memory, c.rollout
    # the phases the step runs, and the parts a step without rollout does not hold
    runs, generates = memory.phases, "generate" in memory.phases
    out: dict[str, Any] = {
        "layout": c.layout.to_dict(),
        "fits": c.fits,
        "peak_memory_gib": gib(memory.peak_bytes),
        "peak_phase": memory.peak_phase,
        "peak_stage": memory.peak_stage,
        "memory_utilization": fraction(memory.utilization),
        "memory_gib": {phase: gib(value) for phase, value in memory.phase_bytes.items()
                       if phase in runs},
        "working_set_gib": {phase: gib(value)
                            for phase, value in memory.working_set_bytes.items()
                            if phase in runs},
        "breakdown_gib": {part: gib(value) for part, value in memory.breakdown.items()
                          if generates or part not in ROLLOUT_PARTS},
    }
    if generates:
        out["rollout"] = {"kv_cache_tokens_per_gpu": rollout.kv_tokens_json,
                          **rollout.kv_gib_json(),
                          "concurrent_seqs": rollout.concurrent_seqs,
                          "seqs_per_rank": rollout.seqs_per_rank, "fits": rollout.fits}
    out["flags"] = list(c.flags)
    if c.within_error_of_best is not None:
        out["within_error_of_best"] = c.within_error_of_best
    if c.rank is not None:
        out = {"rank": c.rank, **out}
    if c.fill_gpu is not None:
        # what the band's headroom costs: the same layout with the rollout pool filling the GPU
        fill = c.fill_gpu
        out["fill_gpu"] = {"gpu_memory_utilization": setting(fill.gpu_memory_utilization),
                           "kv_cache_tokens_per_gpu": fill.kv_tokens_json,
                           **fill.kv_gib_json(),
                           "peak_memory_gib": gib(fill.peak_bytes),
                           "generate_s": seconds(fill.generate_s),
                           "step_time_s": seconds(fill.step_time_s)}
    if c.timed:
        step = c.step_time_s
        out["step_time_s"] = seconds(step)
        if c.step_time_start_s is not None:
            out["step_time_over_run_s"] = over_run_json(c)
        if c.times is not None:
            out["time_s"] = {phase: seconds(value) for phase, value in c.times.seconds.items()}
            out["time_share"] = {phase: fraction(value / step)
                                 for phase, value in c.times.seconds.items()}
            out["time_breakdown_s"] = {
                phase: {part[:-2]: seconds(value) for part, value in parts.items()}
                for phase, parts in c.times.parts.items()}
            out["dominant_phase"] = c.times.dominant
        else:
            out["tflops_per_gpu"] = rate(c.tflops_per_gpu)
        out["tokens_per_s_per_gpu"] = rate(c.tokens_per_s_per_gpu)
        out["mfu"] = fraction(c.mfu)
    return out


def placed_json(c: ColocatedCandidate, band: MemoryPolicy | None = None) -> dict:
    """A colocated candidate with its mode and placement (and staleness when the candidate
    states one, as a training mode's plan does; ``band``: its position in the memory band, as
    a plan reports it)."""
    body = colocated_json(c)
    head = {"rank": body.pop("rank")} if "rank" in body else {}
    head.update(mode=c.mode, placement=placement_json(c.placement))
    if c.staleness is not None:
        head["staleness"] = staleness_json(c.staleness)
    out = {**head, **body}
    if band is not None:
        out["band_position"] = band.position(c.memory.utilization)
    return out


def candidate_json(c: Candidate) -> dict:
    """A training mode's candidate in its contract: a split's, or a colocated one placed."""
    if isinstance(c, SplitCandidate):
        return split_json(c)
    return placed_json(c)


def split_json(c: SplitCandidate) -> dict:
    """One split's prediction (a candidate of an asynchronous mode)."""
    feasible = c.feasible
    times, idle = c.times, c.idle
    trainer, rollout = c.trainer_pool, c.rollout_pool
    out: dict[str, Any] = {} if c.rank is None else {"rank": c.rank}
    out.update({
        "mode": c.mode,
        "placement": placement_json(c.placement),
        "layout": c.layout.to_dict(),
        "fits": c.fits,
        "step_time_s": finite(c.step_time_s),
        **({"step_time_over_run_s": over_run_json(c)}
           if feasible and c.step_time_start_s is not None else {}),
        "time_s": {"generate": finite(times.generate), "train": finite(times.train),
                   "param_sync": finite(times.param_sync),
                   "boundary_wait": finite(times.boundary_wait) if feasible else None},
        "param_sync_s": {part: finite(value) for part, value in c.param_sync.items()},
        "bottleneck": c.bottleneck,
        "idle_fraction": {"trainer": finite(idle.trainer, 4) if feasible else None,
                          "rollout": finite(idle.rollout, 4) if feasible else None},
        "staleness": staleness_json(c.staleness),
        "pools": {
            "trainer": {"gpus": trainer.gpus, "peak_memory_gib": gib(trainer.peak_bytes),
                        "memory_utilization": fraction(trainer.utilization),
                        "peak_phase": trainer.peak_phase,
                        "time_s": {**{phase: finite(value)
                                      for phase, value in trainer.phase_s.items()},
                                   "step_fixed": finite(trainer.step_fixed_s)},
                        "fits": trainer.fits},
            "rollout": {"gpus": rollout.gpus, "peak_memory_gib": gib(rollout.peak_bytes),
                        "memory_utilization": fraction(rollout.utilization),
                        "gpu_memory_utilization": setting(rollout.gpu_memory_utilization),
                        "kv_cache_tokens_per_gpu": rollout.kv_tokens_json,
                        "kv_cache_gib": gib(rollout.kv_cache_bytes),
                        "concurrent_seqs": rollout.concurrent_seqs,
                        "generated_tokens_per_s": (None if rollout.generated_tokens_per_s is None
                                                   else finite(rollout.generated_tokens_per_s,
                                                               1)),
                        "fits": rollout.fits},
        },
        "tokens_per_s_per_gpu": (finite(c.tokens_per_s_per_gpu, 1) if feasible else None),
    })
    if c.async_training is not None:
        settings = c.async_training
        out["async_training"] = {"staleness_threshold": settings.staleness_threshold,
                                 "trigger_parameter_sync_step":
                                     settings.trigger_parameter_sync_step,
                                 "require_batches": settings.require_batches,
                                 "partial_rollout": settings.partial_rollout}
    return out


def prediction_json(c: Candidate) -> dict:
    """What ``plan.json`` records of the exported candidate: a colocated layout's prediction,
    or a split's with the trainer pool's memory as the job's (the job's cluster is the trainer
    pool) and without the layout (``plan.json`` states it apart)."""
    if not isinstance(c, SplitCandidate):
        return colocated_json(c)
    out = split_json(c)
    trainer = out["pools"]["trainer"]
    out.update(peak_memory_gib=trainer["peak_memory_gib"],
               memory_utilization=trainer["memory_utilization"],
               peak_phase=trainer["peak_phase"])
    out.pop("layout", None)
    return out


# --- plans and estimates --------------------------------------------------------------------

TIE_ORDER = ("no unwise flags", "peak inside the memory band", "no offload",
             "fewer parallel dimensions", "smaller TP x PP x CP", "predicted step time")


def lengths_json(workload) -> dict | None:
    """The response lengths the answer's time rests on (start/end/p90 tokens, their source and
    kind of job; :class:`planner.catalog.lengths.ResponseLengths`); None: no responses."""
    lengths = getattr(workload, "lengths", None)
    return None if lengths is None else lengths.to_dict()


def calibration_json(cost, workload) -> dict:
    """Which calibration the answer used (:mod:`planner.cost.provenance`): its source, the
    one-line summary every text answer prints, and a note for each installed verl or vLLM
    release the RL constants were not measured with (none for a step without rollout: a
    pretraining step's time uses the training constants alone)."""
    from planner.cost.provenance import cost_model_summary, version_notes

    return {"source": cost.source, "summary": cost_model_summary(cost),
            "version_notes": version_notes(dict(cost.calibration))
            if workload.has_rollout else []}


def answer_json(workload, cost) -> dict:
    """What every plan, estimate and sizing JSON states its answer rests on."""
    return {"lengths": lengths_json(workload), "calibration": calibration_json(cost, workload)}


def _model_json(model) -> dict:
    return {**model.to_dict(), "params": model.params.to_dict()}


def architecture_json(model, workload) -> dict:
    """The ``architecture`` object (issue 22): parameters, layer counts by kind, the rollout
    cache of one whole sequence of the workload's prompt + response length at its KV dtype (on
    one engine rank without TP, so the whole model's cache), and the training FLOPs of such a
    sequence in verl ``FlopsCounter``'s convention."""
    summary = architecture_summary(model, 0, workload.sequence_length,
                                   engine_cache(model, workload, 1))
    return {"family": summary.family, "verl_route": summary.verl_route,
            "total_params": summary.total_params, "active_params": summary.active_params,
            "vision_params": summary.vision_params, "mtp_params": summary.mtp_params,
            "layer_counts": summary.layer_counts, "mlp_counts": summary.mlp_counts,
            "kv_cache_bytes_per_token": summary.kv_cache_bytes_per_token,
            "kv_cache_bytes_per_sequence": summary.kv_cache_bytes_per_sequence,
            "sequence_tokens": summary.sequence_tokens, "kv_dtype": summary.kv_dtype,
            "train_tflops_per_sequence": round(summary.train_tflops_per_sequence, 3),
            "verl_reports_mfu": summary.verl_reports_mfu}


def ranking_json(plan: "Plan") -> dict:
    """How the plan ranks: the tolerance within which layouts are ties and its source."""
    return {"tie_tolerance": fraction(plan.tie_tolerance), "source": plan.tie_source,
            "ties": plan.ties, "tie_order": list(TIE_ORDER)}


def plan_json(plan: "Plan", top: int | None) -> dict:
    """``plan --format json``."""
    return {
        "model": _model_json(plan.model),
        "architecture": architecture_json(plan.model, plan.workload),
        "cluster": plan.cluster.to_dict(),
        "workload": plan.workload.to_dict(),
        "enumerated": int(plan.enumerated),
        "valid": int(plan.valid),
        "candidates_scored": int(plan.scored or len(plan.candidates)),
        "equivalent_merged": int(plan.merged),
        "fitting": plan.fitting_count,
        "rejected": dict(sorted(plan.rejected.items(), key=lambda item: -item[1])),
        "ranking": ranking_json(plan),
        "memory_band": band_json(plan.policy),
        **answer_json(plan.workload, plan.request.cost),
        "fastest_in_band": (None if plan.fastest_in_band is None
                            else placed_json(plan.fastest_in_band, plan.policy)),
        "candidates": [placed_json(c, plan.policy) for c in plan.top(top)],
    }


def estimate_json(estimate: "Estimate") -> dict:
    """``estimate --format json`` (without ``valid``)."""
    c = estimate.candidate
    return {"model": estimate.model.name,
            "architecture": architecture_json(estimate.model, estimate.workload),
            "cluster": estimate.cluster.to_dict(),
            "workload": estimate.workload.to_dict(), "memory_band": band_json(estimate.policy),
            **answer_json(estimate.workload, estimate.request.cost), **colocated_json(c),
            "band_position": estimate.policy.position(c.memory.utilization),
            # null where the pipeline has a micro-batch per stage (rules.PipelineStarvation)
            "pipeline_starved": None if estimate.pipeline_starvation is None
            else estimate.pipeline_starvation.to_dict(estimate.workload.has_rollout)}


def memory_report_json(c: ColocatedCandidate, policy: MemoryPolicy) -> "Summary":
    """The memory section of ``validate --format json`` for a colocated job, with the figures
    its text and ``diff`` print unrounded in ``exact`` (each printed figure rounded once)."""
    full = colocated_json(c)
    out = {key: full[key] for key in ("fits", "peak_memory_gib", "peak_phase", "peak_stage",
                                      "memory_utilization", "memory_gib", "working_set_gib",
                                      "breakdown_gib", "rollout")}
    out["memory_band"] = {**band_json(policy), "position": policy.position(
        full["memory_utilization"])}
    for key in ("step_time_s", "time_s", "tokens_per_s_per_gpu"):
        if key in full:
            out[key] = full[key]
    memory = c.memory
    exact = {**out, "peak_memory_gib": float(memory.peak_bytes) / GIB,
             "memory_utilization": float(memory.utilization),
             "memory_gib": {phase: memory.phase_bytes.of_phase(phase) / GIB
                            for phase in out["memory_gib"]},
             "working_set_gib": {phase: memory.working_set_bytes.of_phase(phase) / GIB
                                 for phase in out["working_set_gib"]}}
    if "step_time_s" in out:
        exact["step_time_s"] = float(c.step_time_s)
    if "tokens_per_s_per_gpu" in out:
        exact["tokens_per_s_per_gpu"] = float(c.tokens_per_s_per_gpu)
    return Summary(out, exact)


class Summary(dict):
    """A JSON section whose figures are rounded for the contract, with the same keys unrounded
    in ``exact`` for the text renderers.

    A text that prints a figure at one decimal must round the exact value once: printing the
    JSON's two-decimal figure at one decimal rounds twice (73.551 -> 73.55 -> "73.5" where
    ``plan`` shows 73.6).  The dict itself is the JSON (``json.dumps`` writes its keys, not
    ``exact``), so ``--format json`` is unchanged; renderers read ``exact_of(section)``.
    """

    def __init__(self, rounded: dict, exact: dict):
        super().__init__(rounded)
        self.exact = exact

    def framed(self, before: dict, after: dict | None = None) -> "Summary":
        """The section between other keys (``before`` first, ``after`` last), in both forms."""
        after = after or {}
        return Summary({**before, **self, **after}, {**before, **self.exact, **after})


def exact_of(section: dict) -> dict:
    """A section's unrounded figures (a :class:`Summary`), else the section itself."""
    return getattr(section, "exact", section)


def _summary(exact: dict, digits: dict[str, int]) -> Summary:
    """``exact`` as a :class:`Summary`, each key in ``digits`` rounded to its decimals (a dict
    value: each of its values)."""
    def rounded(key, value):
        if key not in digits:
            return value
        if isinstance(value, dict):
            return {k: round(v, digits[key]) for k, v in value.items()}
        return round(value, digits[key])
    return Summary({key: rounded(key, value) for key, value in exact.items()}, exact)


def layout_summary_json(c: ColocatedCandidate) -> Summary:
    """A layout as ``explain`` compares it: two decimals of seconds, one of GiB; the actor
    update's compute, pipeline bubble and exposed communication beside its phase times.  The
    text prints the unrounded figures (``exact``) at its own precision."""
    exact = {"layout": c.layout.to_dict(),
             "step_time_s": float(c.step_time_s),
             "tokens_per_s_per_gpu": float(c.tokens_per_s_per_gpu),
             "peak_memory_gib": c.memory.peak_bytes / GIB,
             "time_s": {phase: value for phase, value in c.times.seconds.items()},
             "update_compute_s": c.times.parts["update_actor"].compute_s
             if "update_actor" in c.times.parts else 0.0,
             "update_bubble_s": c.update_bubble_s or 0.0,
             "update_comm_s": c.update_comm_s or 0.0,
             "within_error_of_best": bool(c.within_error_of_best)}
    return _summary(exact, {"step_time_s": 2, "tokens_per_s_per_gpu": 1, "peak_memory_gib": 1,
                            "time_s": 2, "update_compute_s": 2, "update_bubble_s": 2,
                            "update_comm_s": 2})


def run_advice_json(c: ColocatedCandidate, policy: MemoryPolicy) -> dict:
    """A layout as ``advise --format json`` reports it: step time (two decimals), whether it
    fits, the peak and where it sits against the memory band."""
    share = c.memory.utilization
    return {"step_time_s": round(float(c.step_time_s), 2), "fits": bool(c.fits),
            "peak_memory_gib": gib(c.memory.peak_bytes), "memory_utilization": fraction(share),
            "band_position": policy.position(share)}


# --- training modes ---------------------------------------------------------------------------


def reported_step(c: Candidate) -> float | None:
    """A candidate's step time as its JSON reports it (None: not timed, or cannot run)."""
    return finite(c.step_time_s) if c.timed else None


def mode_bests(plans: Sequence["ModePlan"]) -> list[tuple["ModePlan", Candidate | None,
                                                           float | None]]:
    """Per mode plan: its best candidate (None: nothing fits) and its speed-up over the first
    plan's best (the baseline, ``sync``), from the step times the JSON reports."""
    base = plans[0].best if plans else None
    base_step = None if base is None else reported_step(base)
    out = []
    for plan in plans:
        best = plan.best
        step = None if best is None else reported_step(best)
        speedup = (round(base_step / step, 3) if base_step is not None and step is not None
                   else None)
        out.append((plan, best, speedup))
    return out


def mode_plan_json(plan: "ModePlan", top: int | None) -> dict:
    """``plan --mode M --format json``."""
    shown = plan.candidates if top is None else plan.candidates[:top]
    return {"model": _model_json(plan.model),
            "architecture": architecture_json(plan.model, plan.workload),
            "cluster": plan.cluster.to_dict(),
            "workload": plan.workload.to_dict(), "mode": plan.mode,
            **answer_json(plan.workload, plan.request.cost),
            "splits_tried": plan.splits_tried, "notes": plan.notes,
            "candidates": [candidate_json(c) for c in shown]}


def best_json(plans: Sequence["ModePlan"], note: str) -> dict:
    """``plan --mode best --format json``: each mode's best plan side by side (``note``: the
    off-policy caveat)."""
    first = plans[0]
    rows = mode_bests(plans)
    return {"model": _model_json(first.model),
            "architecture": architecture_json(first.model, first.workload),
            "cluster": first.cluster.to_dict(),
            "workload": first.workload.to_dict(), "mode": "best", "note": note,
            **answer_json(first.workload, first.request.cost),
            "modes": [{"mode": plan.mode, "speedup_vs_sync": speedup,
                       "best": None if best is None else candidate_json(best)}
                      for plan, best, speedup in rows],
            "candidates": [candidate_json(best) for _, best, _ in rows if best is not None]}


def split_summary_json(c: SplitCandidate) -> dict:
    """One split an ``estimate --mode`` scored, in its ``splits`` list."""
    return {"trainer_gpus": c.placement.trainer_gpus, "rollout_gpus": c.placement.rollout_gpus,
            "fits": c.fits, "step_time_s": finite(c.step_time_s),
            **({"step_time_over_run_s": over_run_json(c)}
               if c.feasible and c.step_time_start_s is not None else {}),
            "bottleneck": c.bottleneck,
            "rollout": {"rollout_tp": c.layout.rollout_tp, "rollout_dp": c.layout.rollout_dp,
                        "rollout_ep": c.layout.rollout_ep}}


def split_estimate_json(estimate: "SplitEstimate", note: str) -> dict:
    """``estimate --mode`` of a split mode: the reported split in the contract of a plan
    candidate of the mode, ``valid``, and every split scored (``splits``, the reported one
    first)."""
    return {"valid": True, "model": estimate.model.name,
            "architecture": architecture_json(estimate.model, estimate.workload),
            "cluster": estimate.cluster.to_dict(),
            "workload": estimate.workload.to_dict(),
            **answer_json(estimate.workload, estimate.request.cost),
            **split_json(estimate.candidate),
            "splits": [split_summary_json(c) for c in estimate.splits],
            "notes": list(estimate.notes), "note": note}


def fix_summary_json(c: ColocatedCandidate, policy: MemoryPolicy) -> Summary:
    """A job's prediction, or a mitigation's, as ``fix --format json`` reports it (memory
    in GiB to two decimals, times to two); the text prints ``exact`` at its own precision."""
    phase = c.memory.peak_phase
    exact = {"fits": c.fits, "peak_memory_gib": float(c.memory.peak_bytes) / GIB,
             "memory_utilization": float(c.memory.utilization),
             "band_position": policy.position(c.memory.utilization),
             "peak_phase": phase,
             "working_set_gib": float(c.memory.working_set_bytes.of_phase(phase)) / GIB,
             "gpu_memory_utilization": setting(c.layout.gpu_memory_utilization),
             "kv_cache_tokens_per_gpu": c.rollout.kv_tokens_json,
             **c.rollout.kv_gib_json(),
             "generate_s": c.times.seconds.generate,
             "step_time_s": float(c.step_time_s),
             "tokens_per_s_per_gpu": float(c.tokens_per_s_per_gpu)}
    return _summary(exact, {"peak_memory_gib": 2, "memory_utilization": 4,
                            "working_set_gib": 2, "generate_s": 2, "step_time_s": 2,
                            "tokens_per_s_per_gpu": 1})


# --- sizing ---------------------------------------------------------------------------------
# Sizing's figures are not rounded (``cost == gpu_hours * price_per_gpu_hour`` holds exactly);
# only memory converts to GiB.


def blocked_json(blocked: "Blocked") -> dict:
    return {"phase": blocked.phase,
            "peak_gib": None if blocked.peak_bytes is None else gib(blocked.peak_bytes),
            "capacity_gib": gib(blocked.capacity_bytes), "reason": blocked.reason}


def sizing_row_json(row: "SizingRow") -> dict:
    return {"gpu": row.gpu, "num_gpus": row.num_gpus, "num_nodes": row.num_nodes,
            "valid": row.valid, "fits": row.fits, "step_time_s": row.step_time_s,
            "step_time_start_s": row.step_time_start_s, "step_time_end_s": row.step_time_end_s,
            "tokens_per_s_per_gpu": row.tokens_per_s_per_gpu, "run_time_s": row.run_time_s,
            "gpu_hours": row.gpu_hours, "price_per_gpu_hour": row.price_per_gpu_hour,
            "cost": row.cost, "layout": None if row.layout is None else row.layout.to_dict(),
            "peak_memory_gib": None if row.peak_bytes is None else row.peak_bytes / GIB,
            "peak_phase": row.peak_phase, "dominant_phase": row.dominant_phase,
            "blocked": None if row.blocked is None else blocked_json(row.blocked),
            "marks": list(row.marks),
            "run_hours": None if row.run_time_s is None else row.run_time_s / SECONDS_PER_HOUR}


def _where(row: "SizingRow | None") -> dict | None:
    return None if row is None else {"gpu": row.gpu, "num_gpus": row.num_gpus}


def sizing_json(sizing: "Sizing") -> dict:
    """``plan --gpus A-B|auto --format json``: one row per GPU type x count, one summary per
    type, the fastest and cheapest run."""
    return {
        "model": sizing.model.name,
        "workload": sizing.workload.to_dict(),
        **answer_json(sizing.workload, sizing.cost),
        "gpus_per_node": sizing.gpus_per_node,
        "run": {"steps": sizing.run.steps, "text": sizing.run.text},
        "prices": None if sizing.prices is None else sizing.prices.to_dict(),
        "min_scaling": sizing.min_scaling,
        "layouts_scored": sizing.scored,
        "rows": [sizing_row_json(row) for row in sizing.rows],
        "types": [{"gpu": t.gpu, "capacity_gib": gib(t.capacity_bytes),
                   "smallest_fit": t.smallest_fit,
                   "blocked_below": None if t.blocked_below is None else
                   {"num_gpus": t.blocked_below.num_gpus,
                    **blocked_json(t.blocked_below.blocked)},
                   "knee": t.knee, "knee_gain": t.knee_gain, "fastest": t.fastest,
                   "cheapest": t.cheapest} for t in sizing.types],
        "fastest": _where(sizing.fastest),
        "cheapest": _where(sizing.cheapest),
        "unpriced": list(sizing.unpriced),
    }


def study_prediction_json(c: SplitCandidate) -> dict:
    """What a ``tune`` study records as a split's prediction (the shape of a colocated
    candidate's, plus what only a split has): per-phase memory is the pool's peak -- the
    trainer pool's for the training phases, the rollout pool's for ``generate`` less its KV
    cache (vLLM sizes the KV cache to what ``gpu_memory_utilization`` leaves)."""
    data = split_json(c)
    trainer, rollout = data["pools"]["trainer"], data["pools"]["rollout"]
    trainer_gib, rollout_gib = trainer["peak_memory_gib"], rollout["peak_memory_gib"]
    rollout_sized_gib = rollout_gib - rollout["kv_cache_gib"]
    return {"tokens_per_s_per_gpu": float(data["tokens_per_s_per_gpu"]),
            "step_time_s": float(data["step_time_s"]),
            "peak_gib": max(trainer_gib, rollout_gib),
            "peak_phase": (trainer["peak_phase"] if trainer_gib >= rollout_gib
                           else "generate"),
            "mfu": None,
            "memory_gib": {phase: (rollout_sized_gib if phase == "generate" else trainer_gib)
                           for phase in PHASES},
            "time_s": dict(data["time_s"]), "mode": data["mode"],
            "placement": dict(data["placement"]), "bottleneck": data["bottleneck"],
            "idle_fraction": dict(data["idle_fraction"]), "staleness": dict(data["staleness"]),
            **({"async_training": dict(data["async_training"])}
               if "async_training" in data else {})}
