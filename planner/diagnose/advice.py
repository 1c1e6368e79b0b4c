"""``plan-parallel advise RUN [--job SCRIPT]``: what to change in the verl job you are running.

Reads the run's per-step metrics (:func:`trials.runs.read_run`: the file logger's JSONL, the
console log, a wandb or MLflow export) and the job's settings (its launch script or Hydra YAML,
read as ``validate`` reads it), then:

1. **measured vs predicted, per phase** -- the medians of the steady steps (the first
   ``warmup_steps`` left out) against the time model at the run's own mean lengths, with the
   shipped (or ``--calibration``) constants; the phase with the largest gap in seconds is
   named.  verl 0.9.1's timers map to the model's phases: ``timing_s/gen`` -> generate,
   ``timing_s/old_log_prob``, ``timing_s/ref``, ``timing_s/update_actor``; the rest of
   ``timing_s/step`` (``update_weights``, reward, advantages, data movement) -> weight_sync,
   where the model books the sync and the fixed per-step costs.  A run without
   ``timing_s/update_weights`` timed the sync inside ``gen`` (verl before 0.6): its generation
   is compared with predicted generation + sync, and its step as a whole.
2. **this cluster's constants** -- :func:`trials.calibration_fit.calibrate_run`: the same
   least-squares fit ``calibrate`` runs on trials, on the run's steps cut into
   ``windows`` windows (each at its own mean length), moving only the constants a run's phases
   tell apart (:data:`trials.calibration_fit.RUN_CONSTANTS`).  The result is a new calibration;
   the one it started from, and the shipped file, stay as they were.
3. **the re-plan** -- every layout ranked at the run's latest mean length (the last window)
   with the fitted constants, and the job's own layout scored the same way.
4. **the best change** -- the fastest of the re-plan's best layout and single changes to the
   job's layout (micro-batch or dynamic-batch budget, rollout TP or pool size, recompute,
   offload, TP/PP/CP; the mitigations ``fix`` scores), each with its predicted gain, the Hydra
   overrides that make it and where its nvidia-smi peak sits against the memory band.
   Changes that do not fit are never offered; those above the band only after those inside.
5. **drift** -- the run's latest mean response length against the one the job was planned for
   (``plan.json`` beside the job when plan-parallel wrote it, else the documented default for
   the model's kind of job, :func:`planner.catalog.lengths.default_lengths`).  A re-plan pays
   when the layout that is best at the real lengths is predicted faster than the job's by more
   than the model's ranking uncertainty (the calibration's ``ranking_uncertainty``, 16% for the
   shipped one): below that the model cannot tell the two apart.

Exit codes (the CLI): 0 answered; 1 no layout, the job's included, fits at the run's lengths;
2 bad input (unreadable run or job, a run without verl's metrics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from planner.bounds import MAX_JSON_BYTES, load_json
from planner.catalog.hardware import ClusterSpec
from planner.catalog.lengths import ResponseLengths, default_lengths
from planner.catalog.models import ModelSpec
from planner.catalog.workload import GrpoWorkload
from planner.cost.calibration import PhaseMeasurement, predict_phases
from planner.cost.efficiency import CostModel, shipped_cost_model
from planner.cost.provenance import calibration_summary, cost_model_label, version_notes
from planner.cost.request import PlanRequest
from planner.cost.trajectory import workload_at
from planner.diagnose.fix import candidate_changes, layout_overrides, score
from planner.diagnose.validate import JobContext
from planner.errors import InvalidLayoutError, NoFitError, PlanInputError
from planner.modes import get_mode
from planner.output import run_advice_json
from planner.plan import make_plan
from planner.policy import DEFAULT_POLICY, PEAK_NAME, MemoryPolicy
from planner.results import ColocatedCandidate
from planner.search.layout import Layout
from planner.units import GIB
from trials.calibration_fit import calibrate_run
from trials.runs import RESPONSE_MEAN, STEP_TIME, RunRecord, RunWindow

# verl 0.9.1 timers (RayPPOTrainer.fit) -> the time model's phases
TIMERS = {"generate": "timing_s/gen", "old_log_prob": "timing_s/old_log_prob",
          "ref": "timing_s/ref", "update_actor": "timing_s/update_actor"}
SYNC_TIMER = "timing_s/update_weights"
PROMPT_MEAN = "prompt_length/mean"
# A change is offered only when predicted at least this much faster: single knobs are scored
# by the same model on the same job, but a change of a percent or two is within the spread of
# a run's own steps.
MIN_GAIN = 0.02
@dataclass(frozen=True)
class JobSetting:
    """What advise knows of the job: the planner's reading of it, the composed config (for
    the overrides of a change) and the mean response length it was planned for."""

    model: ModelSpec
    cluster: ClusterSpec
    workload: GrpoWorkload
    layout: Layout
    config: dict = field(default_factory=dict)
    source: str = ""
    planned_tokens: float | None = None  # plan.json's mean response length, when present
    planned_source: str = ""

    def request(self, workload: GrpoWorkload, cost: CostModel,
                policy: MemoryPolicy) -> PlanRequest:
        """The job at ``workload`` (its lengths at some point of the run) as a plan request."""
        return PlanRequest(self.model, self.cluster, workload, cost=cost, policy=policy)

    def job(self, workload: GrpoWorkload) -> JobContext:
        """The job read, at ``workload``: what ``fix`` writes a layout's overrides for."""
        return JobContext(self.model, self.cluster, workload, self.layout, dict(self.config),
                          ())


@dataclass(frozen=True)
class RunWindows:
    """How advise reads a run's steps: the first ``warmup_steps`` left out, the rest cut into
    ``count`` windows (each fitted at its own mean length)."""

    warmup_steps: int = 1
    count: int = 3


def planned_from(job_path: str | None) -> tuple[float | None, str]:
    """The mean response length ``plan.json`` beside the job records (plan-parallel wrote the
    job), or ``(None, "")``."""
    if not job_path:
        return None, ""
    path = Path(job_path).parent / "plan.json"
    if not path.is_file():
        return None, ""
    data = load_json(path, "plan.json", MAX_JSON_BYTES)
    mean = (data.get("workload") or {}).get("mean_response_length")
    if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not math.isfinite(mean) \
            or mean <= 0:
        return None, ""
    return float(mean), str(path)


def job_setting(job_input) -> JobSetting:
    """The job read as ``validate`` reads it (``job_input``: a
    :class:`planner.diagnose.validate.JobInput`)."""
    from planner.diagnose.validate import dry_run

    run = dry_run(job_input)
    report, job = run.report, run.job
    if job is None:
        errors = [f["message"] for f in report["findings"] if f.get("level") == "error"]
        raise PlanInputError("cannot read a layout from the job: "
                             + ("; ".join(errors[:2]) or "see `plan-parallel validate`"))
    if not get_mode(report["mode"]).colocated:
        raise PlanInputError(f"advise reads colocated (sync) jobs; this one runs "
                             f"{report['mode']} (separate rollout and trainer pools)")
    planned, where = planned_from(job_input.inputs[0] if job_input.inputs else None)
    return JobSetting(job.model, job.cluster, job.workload, job.layout, job.config or {},
                      report["source"], planned, where)


# --- measured phases -------------------------------------------------------------------------


def measured_seconds(medians: dict) -> tuple[dict[str, float], bool]:
    """The phases a window measured (``medians``: its metric medians) as the time model's
    phases, and whether its generation includes the weight sync."""
    seconds = {phase: medians[key] for phase, key in TIMERS.items() if key in medians}
    step = medians[STEP_TIME]
    sync_in_generate = SYNC_TIMER not in medians
    if sync_in_generate:
        seconds["step"] = step
    else:
        seconds["weight_sync"] = max(step - sum(seconds.values()), 1e-3)
    return seconds, sync_in_generate


def window_workload(workload: GrpoWorkload, medians: dict) -> GrpoWorkload:
    """The job's workload at a window's own mean response (and prompt) length."""
    at = workload_at(workload, medians[RESPONSE_MEAN])
    prompt = medians.get(PROMPT_MEAN)
    if prompt is not None and prompt >= 1:
        at = replace(at, mean_prompt_length=int(min(round(prompt), workload.prompt_length)))
    return at


def measurement(setting: JobSetting, window: RunWindow) -> PhaseMeasurement:
    seconds, inside = measured_seconds(window.medians)
    return PhaseMeasurement(setting.model, setting.cluster,
                            window_workload(setting.workload, window.medians), setting.layout,
                            seconds, sync_in_generate=inside)


@dataclass(frozen=True)
class PhaseGap:
    phase: str
    measured_s: float
    predicted_s: float

    @property
    def gap_s(self) -> float:
        return self.measured_s - self.predicted_s

    @property
    def relative(self) -> float:
        return self.measured_s / self.predicted_s - 1 if self.predicted_s > 0 else math.inf

    def to_dict(self) -> dict:
        return {"phase": self.phase, "measured_s": round(self.measured_s, 2),
                "predicted_s": round(self.predicted_s, 2), "gap_s": round(self.gap_s, 2),
                "relative": round(self.relative, 4) if math.isfinite(self.relative) else None}


def phase_gaps(item: PhaseMeasurement, cost: CostModel) -> list[PhaseGap]:
    predicted = predict_phases([item], cost)[0]
    return [PhaseGap(phase, seconds, predicted[phase]) for phase, seconds in item.seconds.items()]


# --- changes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """A change to the job, scored at the run's latest lengths with the fitted constants."""

    name: str
    kind: str  # layout (the re-plan's best), batch, rollout, offload, recompute, parallel
    layout: Layout
    candidate: ColocatedCandidate
    overrides: tuple[str, ...]

    @property
    def step_time_s(self) -> float:
        return float(self.candidate.step_time_s)


def _rollout_changes(layout: Layout) -> list[tuple[str, Layout, str]]:
    out = []
    for size in (layout.rollout_tp * 2, layout.rollout_tp // 2):
        if size >= 1 and size != layout.rollout_tp:
            out.append((f"rollout TP {layout.rollout_tp} -> {size}",
                        replace(layout, rollout_tp=size), "rollout"))
    return out


def _band_order(c: ColocatedCandidate, policy: MemoryPolicy) -> tuple:
    return (policy.position(c.memory.utilization) == "above", float(c.step_time_s))


def best_changes(setting: JobSetting, request: PlanRequest, current: ColocatedCandidate,
                 replanned: tuple[Layout, ...] = ()) -> list[Change]:
    """Every change that fits and is predicted at least :data:`MIN_GAIN` faster than the job,
    those inside (or below) the memory band first, then by step time (``request``: the job at
    the run's lengths, with the fitted constants).  ``replanned``: layouts of the re-plan to
    weigh beside the single changes."""
    layout, job = setting.layout, setting.job(request.workload)
    before = set(layout_overrides(job, layout))
    proposals = [(name, changed, kind) for over in (True, False)
                 for name, changed, kind in candidate_changes(
                     layout, setting.model, setting.cluster, over,
                     request.workload.needs_reference)]
    proposals += _rollout_changes(layout)
    for other in replanned:
        if other != layout:
            proposals.append((f"re-planned layout: {other.actor_text(setting.model.is_moe)}; "
                              f"{other.rollout_text()}", other, "layout"))
    seen, found = set(), []
    for name, changed, kind in proposals:
        if changed in seen:
            continue
        seen.add(changed)
        scored = score(request, changed)
        if scored is None or not scored.fits or not math.isfinite(scored.step_time_s) \
                or scored.step_time_s > current.step_time_s * (1 - MIN_GAIN):
            continue
        after = layout_overrides(job, changed)
        found.append(Change(name, kind, changed, scored,
                            tuple(item for item in after if item not in before)))
    found.sort(key=lambda change: _band_order(change.candidate, request.policy))
    return found


# --- the answer --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Advice:
    run: RunRecord
    setting: JobSetting
    lengths: ResponseLengths  # the run's trajectory
    now_tokens: float  # mean response length of the run's last window
    gaps: tuple[PhaseGap, ...]
    largest: PhaseGap
    fit: Any  # trials.calibration_fit.CalibrationResult
    current: ColocatedCandidate  # the job's layout at now_tokens, fitted constants
    replanned: ColocatedCandidate | None  # the re-plan's best layout
    changes: tuple[Change, ...]
    planned_tokens: float
    planned_source: str
    uncertainty: float  # the ranking uncertainty: the re-plan threshold
    policy: MemoryPolicy
    calibration_line: str
    notes: tuple[str, ...] = ()

    @property
    def replan_gain(self) -> float:
        """Fraction of the job's step time the re-plan's best layout saves."""
        if self.replanned is None:
            return 0.0
        return 1 - float(self.replanned.step_time_s) / float(self.current.step_time_s)

    @property
    def replan_pays(self) -> bool:
        return self.replan_gain > self.uncertainty

    @property
    def drift(self) -> float:
        return self.now_tokens / self.planned_tokens - 1

    def to_dict(self) -> dict:
        best = self.changes[0] if self.changes else None
        return {
            "run": {"path": self.run.path, "format": self.run.format,
                    "steps": len(self.run.steps), "first_step": int(self.run.steps.index[0]),
                    "last_step": int(self.run.steps.index[-1]),
                    "bad_lines": self.run.bad_lines},
            "job": self.setting.source, "model": self.setting.model.name,
            "cluster": self.setting.cluster.to_dict(), "layout": self.setting.layout.to_dict(),
            "lengths": self.lengths.to_dict(), "now_mean_response_tokens": self.now_tokens,
            "phases": [gap.to_dict() for gap in self.gaps],
            "largest_gap": self.largest.to_dict(),
            "fit": {"windows": self.fit.measurements,
                    "mape_before": round(self.fit.mape_before, 4),
                    "mape_after": round(self.fit.mape_after, 4),
                    "constants": self.fit.calibration["run_fit"]["constants"]},
            "current": run_advice_json(self.current, self.policy),
            "replanned": None if self.replanned is None else {
                "layout": self.replanned.layout.to_dict(),
                **run_advice_json(self.replanned, self.policy),
                "gain": round(self.replan_gain, 4)},
            "best_change": None if best is None else {
                "change": best.name, "kind": best.kind, "layout": best.layout.to_dict(),
                "overrides": list(best.overrides),
                **run_advice_json(best.candidate, self.policy),
                "gain": round(1 - best.step_time_s / float(self.current.step_time_s), 4)},
            "drift": {"planned_mean_response_tokens": round(self.planned_tokens, 1),
                      "planned_from": self.planned_source, "relative": round(self.drift, 4),
                      "replan_gain": round(self.replan_gain, 4),
                      "threshold": round(self.uncertainty, 4), "replan_pays": self.replan_pays},
            "calibration": self.calibration_line, "notes": list(self.notes),
        }


def check_run(run: RunRecord) -> None:
    """The metrics advise cannot do without (checked before the job is read)."""
    run.require(STEP_TIME, TIMERS["generate"], TIMERS["update_actor"], RESPONSE_MEAN)


def advise(run: RunRecord, setting: JobSetting, cost: CostModel | None = None,
           policy: MemoryPolicy = DEFAULT_POLICY, windows: RunWindows = RunWindows()) -> Advice:
    """Everything ``advise`` answers (module docstring), for a run of the job ``setting``
    (``cost``: the calibration it starts from, loaded; None: the shipped one)."""
    check_run(run)
    cost = cost if cost is not None else shipped_cost_model()
    base = cost.calibration
    lengths = run.response_lengths(setting.workload.response_length)
    steady = _measured(run.windows(1, windows.warmup_steps), run)[0]
    overall = measurement(setting, steady)
    gaps = phase_gaps(overall, cost)
    phases = [gap for gap in gaps if gap.phase != "step"]
    if not phases:
        raise PlanInputError(f"run {run.path!r}: its steady steps time no phase "
                             f"({', '.join(TIMERS.values())})")
    largest = max(phases, key=lambda gap: abs(gap.gap_s))
    parts = _measured(run.windows(windows.count, windows.warmup_steps), run)
    source = f"plan-parallel advise: {run.path} ({run.format})"
    fit = calibrate_run([measurement(setting, part) for part in parts], base, source=source)
    now = parts[-1].medians[RESPONSE_MEAN]
    request = setting.request(window_workload(setting.workload, parts[-1].medians),
                              CostModel.load(fit.calibration, source), policy)
    current = score(request, setting.layout)
    if current is None:
        raise InvalidLayoutError([("job", "the job's layout breaks a layout rule; run "
                                          "`plan-parallel validate` on it")])
    plan = make_plan(request)
    replanned = plan.candidate(0, fitting=True) if plan.fitting_count else None
    if replanned is None and not current.fits:
        raise NoFitError(f"no layout of {setting.model.name} fits on "
                         f"{setting.cluster.num_gpus} x {setting.cluster.gpu.name} at the "
                         f"run's mean response length ({now:.0f} tokens), the job's included")
    fastest = None if replanned is None else plan.candidate(
        int(plan.fitting["step_time_s"].to_numpy().argmin()), fitting=True)
    changes = best_changes(setting, request, current,
                           tuple(c.layout for c in (replanned, fastest) if c is not None))
    if setting.planned_tokens:
        planned, planned_source = setting.planned_tokens, setting.planned_source
    else:
        default = default_lengths(setting.workload.response_length, setting.model.name)
        planned = default.mean_tokens
        planned_source = f"the documented default for {default.kind} ({default.basis})"
    notes = [f"note: {run.bad_lines} line(s) of {run.name} skipped as unreadable or impossible"
             ] if run.bad_lines else []
    notes += version_notes(base)
    return Advice(run=run, setting=setting, lengths=lengths, now_tokens=float(now),
                  gaps=tuple(gaps), largest=largest, fit=fit, current=current,
                  replanned=replanned, changes=tuple(changes), planned_tokens=float(planned),
                  planned_source=planned_source, uncertainty=request.cost.uncertainty,
                  policy=policy,
                  calibration_line=calibration_summary(base, cost_model_label(cost)),
                  notes=tuple(notes))


def _measured(parts: list[RunWindow], run: RunRecord) -> list[RunWindow]:
    """The windows that logged a step time and a mean response length (a window of steps that
    logged neither says nothing to compare)."""
    kept = [part for part in parts if STEP_TIME in part.medians and RESPONSE_MEAN in part.medians]
    if not kept:
        raise PlanInputError(f"run {run.path!r}: no steady step logs both {STEP_TIME} and "
                             f"{RESPONSE_MEAN} (--warmup-steps leaves out the first)")
    return kept


def _signed(value: float) -> str:
    """A signed whole percentage; what rounds to zero is "+0%", never "-0%"."""
    return f"{round(value, 2) + 0.0:+.0%}" if math.isfinite(value) else "n/a"


def advise_text(advice: Advice) -> str:
    setting, policy = advice.setting, advice.policy
    run = advice.run
    lines = [f"advise {run.name} ({run.format}, steps {int(run.steps.index[0])}-"
             f"{int(run.steps.index[-1])}) for {setting.model.name} on "
             f"{setting.cluster.num_gpus} x {setting.cluster.gpu.name}"
             + (f", job {setting.source}" if setting.source else ""),
             f"layout: {setting.layout.actor_text(setting.model.is_moe)}; "
             f"{setting.layout.rollout_text()}",
             f"lengths: {advice.lengths.sentence()}",
             "",
             f"{'phase':<14}{'measured s':>12}{'predicted s':>13}{'gap s':>10}{'gap':>7}"]
    for gap in advice.gaps:
        mark = "  <- largest gap" if gap is advice.largest else ""
        lines.append(f"{gap.phase:<14}{gap.measured_s:>12.1f}{gap.predicted_s:>13.1f}"
                     f"{gap.gap_s:>+10.1f}{_signed(gap.relative):>7}{mark}")
    largest = advice.largest
    direction = "slower" if largest.gap_s > 0 else "faster"
    lines += ["", f"largest gap: {largest.phase}, {abs(largest.gap_s):.1f} s {direction} than "
                  f"predicted ({_signed(largest.relative)})"]
    fit = advice.fit
    constants = ", ".join(f"{name} {value:g}" for name, value in
                          fit.calibration["run_fit"]["constants"].items())
    lines.append(f"fitted from the run ({fit.measurements} window(s) of steps): {constants}; "
                 f"phase error (MAPE) {fit.mape_before:.0%} -> {fit.mape_after:.0%}; the "
                 f"calibration it started from is unchanged")
    current = advice.current
    lines.append(f"re-planned at {advice.now_tokens:.0f} tokens (the run's latest mean response) "
                 f"with the fitted constants: this job {float(current.step_time_s):.1f} s per "
                 f"step, {PEAK_NAME} {current.memory.peak_bytes / GIB:.1f} GiB "
                 f"({policy.position(current.memory.utilization)} the "
                 f"{policy.band_text} band)")
    if advice.replanned is not None:
        best = advice.replanned.layout
        lines.append(f"  best layout: {best.actor_text(setting.model.is_moe)}; "
                     f"{best.rollout_text()}: {float(advice.replanned.step_time_s):.1f} s per "
                     f"step ({_signed(-advice.replan_gain)})")
    if advice.changes:
        change = advice.changes[0]
        memory = change.candidate.memory
        gain = 1 - change.step_time_s / float(current.step_time_s)
        lines.append(f"best change: {change.name}: {float(current.step_time_s):.1f} -> "
                     f"{change.step_time_s:.1f} s per step ({_signed(-gain)}); {PEAK_NAME} "
                     f"{memory.peak_bytes / GIB:.1f} GiB "
                     f"({100 * memory.utilization:.0f}%, "
                     f"{policy.position(memory.utilization)} the "
                     f"{policy.band_text} band)")
        lines += [f"    {override}" for override in change.overrides]
    else:
        lines.append(f"best change: none predicted at least {MIN_GAIN:.0%} faster than the "
                     f"job's layout at the run's lengths")
    gain = advice.replan_gain
    versus = f"{gain:.0%} faster than" if gain > 0 else "no faster than"
    verdict = (f"above the {advice.uncertainty:.0%} the model can resolve: a re-plan pays"
               if advice.replan_pays else
               f"within the {advice.uncertainty:.0%} the model can resolve: not worth a re-plan")
    lines.append(f"drift: mean response {advice.now_tokens:.0f} tokens now vs "
                 f"{advice.planned_tokens:.0f} planned ({_signed(advice.drift)}; "
                 f"{advice.planned_source}); the re-plan's best layout is {versus} the job's, "
                 f"{verdict}")
    lines.append(advice.calibration_line)
    lines += list(advice.notes)
    return "\n".join(lines)
