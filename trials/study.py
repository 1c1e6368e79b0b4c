"""An Optuna study of real trials: the tuner behind ``plan-parallel tune``.

One tuner process runs one trial at a time; any number of them (on any nodes) can share a
study through its storage.  What they agree on lives in the storage (:mod:`trials.study_state`):

* the study first runs ``--top-k`` of the cost model's tied best candidates (enqueued one at a
  time, so a retried trial goes first): the simplest, or one of each TP/EP/PP family
  (``--first-trials``, :mod:`trials.proposals`), then the sampler proposes the remaining
  allowed layouts: by default :class:`~trials.guided.GuidedSampler` (the prediction corrected
  by the measured trials, the highest upper bound next), or Optuna's TPE or random sampler
  over the layout fields (:class:`~trials.sampler.LayoutSampler`, ``--sampler``);
* a trial claims its layout (the ``layout_key`` attribute) before launching and runs only if no
  other RUNNING trial claimed it and it was not measured before — two tuners never run one
  layout at once, and a finished layout is never run again;
* a measured OOM raises that phase's memory margin for the rest of the study, by a bounded step
  that the OOM's own figures support (:func:`~trials.candidates.memory_margins`), and the next
  trial is the nearest layout that relieves the failing phase (smaller micro-batch, more TP or
  PP, recompute: :meth:`~trials.candidates.CandidateSet.relief`) -- the study goes on until
  its budget is spent;
* when the study's first ``--fail-fast`` trials all fail with one cause (verl missing, a bad
  override, the same crash line), it stops with that cause instead of trying more layouts;
* a tuner that dies (even ``kill -9``) stops sending heartbeats; another tuner (or the same
  command run again) marks its trial failed, stops what it left running, and enqueues the
  layout again -- at once when the dead tuner ran on the same host (each trial records its
  tuner process, :mod:`trials.orphans`), else after the grace period;
* with ``--pruner``, a trial reports each step after its warm-up and a layout that trails the
  study's best at equal steps is stopped early and recorded PRUNED (:mod:`trials.pruning`);
* after each trial the study says whether any untried layout could beat the best measured one
  within the model's error (:mod:`trials.confidence`); with ``--stop-when-confident`` it stops
  when none could;
* the study stops at ``--trials`` measured trials (pruned ones count), at ``--timeout``, after
  ``--patience`` trials without improvement, or when no allowed layout is left.

Objective: measured tokens/s/GPU (maximise), optionally with the measured peak memory
(minimise).  Predictions, measurements, the failure category, its log lines and the layout
are user attributes of each trial, for ``optuna-dashboard``.

Training modes (``tune --mode``): the candidates are the mode plans' (:mod:`trials.candidates`),
the split and the staleness threshold are trial parameters, the trial's ``placement`` user
attribute says its mode, pools and threshold, each trial runs its mode's job
(:mod:`trials.trial_job`), its tokens/s/GPU counts every GPU of both pools, and the best trial is
written back as its mode's job.
"""

from __future__ import annotations

import os
import random
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import Trial, TrialState

from planner import __version__
from planner.cost.efficiency import ranking_uncertainty
from planner.errors import PlanInputError
from trials import orphans
from trials import study_state as attrs
from trials.candidates import CandidateSet, memory_margins
from trials.confidence import Confidence, assess
from trials.defaults import TUNE_DEFAULTS
from trials.failures import Category
from trials.launchers import Launcher, launcher_for_handle
from trials.metrics import MetricLimits
from trials.progress import Progress, Row, Status
from trials.proposals import first_trials
from trials.pruning import StepReporter, make_pruner
from trials.runner import TrialResult, run_trial
from trials.sampler import LayoutSampler
from trials.storage import StorageSpec, open_storage
from trials.study_outputs import update_tuned, write_best, write_trials_csv
from trials.sweep_folder import SWEEP_FILE
from trials.trial_job import TrialJobs

MAX_CONSECUTIVE_SKIPS = 50


class TrialFailed(Exception):
    """A trial that ran and failed (OOM, hang, ...): recorded, not an error of the tuner."""


class Skipped(optuna.TrialPruned):
    """A trial that ran nothing (its layout was measured, is running elsewhere, ...)."""


@dataclass(frozen=True)
class TuneSettings:
    trials: int = 20  # measured trials the study should have
    timeout_s: float | None = None  # this tuner starts no trial after that long
    warmup_steps: int = 1
    top_k: int = TUNE_DEFAULTS["top_k"]  # layouts enqueued first (trials.proposals)
    patience: int = 0  # stop after this many trials without improvement (0: never)
    min_improvement: float = 0.01
    multi_objective: bool = False  # also minimise measured peak memory
    memory_margin: float = 0.0
    sampler: str = TUNE_DEFAULTS["sampler"]  # guided (trials.guided), tpe or random
    seed: int | None = None
    heartbeat_interval: int = 60
    grace_period: int = 180
    max_retry: int = 3
    fail_fast: int = 3  # stop when the first this-many trials fail with one cause (0: never)
    pruner: str = TUNE_DEFAULTS["pruner"]  # trials.pruning (PRUNERS)
    first_trials: str = TUNE_DEFAULTS["first_trials"]  # FIRST_TRIALS (trials.proposals)
    # stop when no untried layout could beat the best (trials.confidence)
    stop_when_confident: bool = TUNE_DEFAULTS["stop_when_confident"]
    model_error: float | None = None  # ranking uncertainty (None: the shipped calibration's)
    # the guided sampler's bound, ln(predicted) + mean + ucb_width * sd (trials.guided)
    ucb_width: float = TUNE_DEFAULTS["ucb_width"]
    # the guided sampler fits its error per GRPO phase ("on") or the step's ("off")
    phase_model: str = TUNE_DEFAULTS["phase_model"]
    # the last this-many trials run the posterior-best layout, no bound (trials.guided; the
    # fifth round of docs/tuning/regret.md: no measured gain, so no tune flag, 0)
    exploit_last: int = TUNE_DEFAULTS["exploit_last"]
    # how the guided sampler picks a layout (trials.acquisition, ACQUISITIONS): its bound ("ucb"),
    # the tie of the largest posterior sd ("design"), the most informative contender ("info"),
    # the additive bound ("additive") or the near-best bound varying most knobs ("knobs"), for
    # the study's first acquisition_trials trials (0: all), the bound after; the sixth round of
    # docs/tuning/regret.md measured none better, so no tune flag
    acquisition: str = TUNE_DEFAULTS["acquisition"]
    acquisition_trials: int = 0


@dataclass(frozen=True)
class TuneResult:
    study_name: str
    measured: int
    best_trial: int | None
    best_key: str | None
    best_value: float | None
    stop_reason: str
    written: tuple[Path, ...]
    confidence: Confidence | None = None  # could an untried layout beat the best?


class Tuner:
    def __init__(self, *, plan, candidates: CandidateSet, jobs: TrialJobs, launcher: Launcher,
                 storage: StorageSpec, study_name: str, sweep_dir: Path,
                 write_dir: Path | None, settings: TuneSettings, progress: Progress,
                 study_info: dict):
        self.plan = plan
        self.candidates = candidates
        self.jobs = jobs
        self.launcher = launcher
        self.storage_spec = storage
        self.study_name = study_name
        self.sweep_dir = Path(sweep_dir)
        self.write_dir = Path(write_dir) if write_dir else None
        self.settings = settings
        self.progress = progress
        self.study_info = {**study_info, "fingerprint": candidates.fingerprint(),
                           "candidates": len(candidates),
                           "objectives": self.objective_names()}
        self.capacity = float(plan.cluster.gpu.memory_bytes)
        gpu = plan.cluster.gpu
        self.limits = MetricLimits.for_plan(max(gpu.peak_flops("bf16"), gpu.peak_flops("fp8")),
                                            plan.model.params.active, gpu.memory_bytes)
        self.status = Status(target=settings.trials)
        self._durations: list[float] = []
        self._written_best: int | None = None
        self._csv: list[Path] = []
        self._job: list[Path] = []
        self._stop_reason = ""
        self._skips = 0
        self.model_error = (settings.model_error if settings.model_error is not None
                            else float(ranking_uncertainty()["relative"]))
        self.first = first_trials(candidates.candidates, settings.top_k, settings.first_trials,
                                  self.model_error)
        self.predicted = np.array([float(c.predicted["tokens_per_s_per_gpu"])
                                   for c in candidates.candidates])
        self.confidence: Confidence | None = None
        # Optuna prunes on one objective only
        self.pruner = "none" if settings.multi_objective else settings.pruner
        # host:pid of this tuner process, and a run id (one process may run several studies)
        self.tuner_id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.tuner_process = orphans.this_tuner()  # host, pid, start: gone means orphaned

    # --- the study -------------------------------------------------------------------------

    def objective_names(self) -> list[str]:
        names = ["tokens_per_s_per_gpu"]
        return names + ["peak_memory_gib"] if self.settings.multi_objective else names

    def open_study(self) -> optuna.Study:
        storage = open_storage(self.storage_spec,
                               heartbeat_interval=self.settings.heartbeat_interval,
                               grace_period=self.settings.grace_period,
                               stale_callback=self._stale_trial)
        if self.settings.sampler == "guided":
            from trials.acquisition import acquisition
            from trials.guided import GuidedSampler

            sampler = GuidedSampler(self.candidates, self._allowed, self.model_error,
                                    seed=self.settings.seed, kappa=self.settings.ucb_width,
                                    phase_model=self.settings.phase_model == "on",
                                    exploit_last=self.settings.exploit_last,
                                    budget=self.settings.trials,
                                    acquire=acquisition(self.settings.acquisition),
                                    acquisition_trials=self.settings.acquisition_trials,
                                    inner=optuna.samplers.RandomSampler(seed=self.settings.seed))
        else:
            inner = (optuna.samplers.RandomSampler(seed=self.settings.seed)
                     if self.settings.sampler == "random"
                     else None)  # LayoutSampler's multivariate TPE with the constant liar
            sampler = LayoutSampler(self.candidates, self._allowed, inner=inner,
                                    seed=self.settings.seed,
                                    n_startup_trials=max(self.settings.top_k, 3))
        directions = ["maximize", "minimize"] if self.settings.multi_objective else ["maximize"]
        pruner = make_pruner(self.pruner, self.jobs.steps - self.settings.warmup_steps)
        study = optuna.create_study(study_name=self.study_name, storage=storage,
                                    sampler=sampler, pruner=pruner, directions=directions,
                                    load_if_exists=True)
        if [d.name.lower() for d in study.directions] != directions:
            raise PlanInputError(f"study {self.study_name!r} exists with objectives "
                                 f"{[d.name.lower() for d in study.directions]}; use the same "
                                 f"--multi-objective setting or another --study-name")
        known = study.user_attrs.get(attrs.STUDY)
        if known is None:
            study.set_user_attr(attrs.STUDY, self.study_info)
        elif known.get("fingerprint") != self.study_info["fingerprint"]:
            raise PlanInputError(
                f"study {self.study_name!r} in {self.storage_spec.display} searches other "
                f"layouts (model {known.get('model', {}).get('name')}, cluster "
                f"{known.get('cluster')}, mode {known.get('mode', 'sync')}"
                + (f" with staleness grid {known['staleness_grid']}"
                   if known.get("staleness_grid") else "")
                + "; the workload, the splits or the planner may differ); resume it with the "
                  "same flags or pass another --study-name")
        return study

    def _snapshot(self, study: optuna.Study) -> attrs.Snapshot:
        return attrs.read_snapshot(study)

    def margins(self, snap: attrs.Snapshot) -> dict[str, float]:
        return memory_margins(snap.ooms, self.capacity, self.settings.memory_margin)

    def _allowed(self, study: optuna.Study) -> np.ndarray:
        snap = self._snapshot(study)
        return self.candidates.allowed([*snap.measured, *snap.running], self.margins(snap))

    def enqueue_next(self, study: optuna.Study) -> str | None:
        """Enqueue the first of the ``--top-k`` first trials (:mod:`trials.proposals`) that is
        not measured, running or excluded yet — only when nothing waits in the queue, so a
        retry of a lost or interrupted trial runs before the remaining top layouts.  The key,
        or None."""
        if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return None
        snap = self._snapshot(study)
        relief = self.enqueue_relief(study, snap)
        if relief:
            return relief
        margins = self.margins(snap)
        for index in self.first:
            candidate = self.candidates[index]
            key = candidate.key
            if (key in snap.measured or key in snap.running
                    or not self.candidates.fits_margins(key, margins)):
                continue
            study.enqueue_trial(dict(candidate.params),
                                user_attrs={"enqueued": f"predicted rank {candidate.rank}"})
            return key
        return None

    def enqueue_relief(self, study: optuna.Study, snap: attrs.Snapshot) -> str | None:
        """After an OOM not relieved yet (the latest first), enqueue the nearest allowed layout
        predicted to need less in the failing phase; its key, or None."""
        mask = None
        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        for phase, _, number, need in reversed(snap.ooms):
            if number in snap.relieved:
                continue
            failed = trials.get(number)
            key = failed.user_attrs.get(attrs.KEY) if failed is not None else None
            if key is None:
                continue
            if mask is None:
                mask = self.candidates.allowed([*snap.measured, *snap.running],
                                               self.margins(snap))
            index = self.candidates.relief(key, phase, mask, need)
            if index is None:
                continue
            candidate = self.candidates[index]
            study.enqueue_trial(dict(candidate.params), user_attrs={
                "enqueued": f"relieves {phase} of OOM trial #{number}",
                attrs.RELIEVES: number})
            return candidate.key
        return None

    # --- one trial ---------------------------------------------------------------------------

    def _check(self, study: optuna.Study, number: int, key: str) -> tuple[str, str] | None:
        """Why trial ``number`` must not run ``key`` now: ``(kind, reason)``, or None."""
        snap = self._snapshot(study)
        if key in snap.measured:
            return "done", f"{key} was measured in trial #{snap.measured[key]}"
        others = snap.running_except(number)
        if key in others:
            return "busy", f"{key} is running in trial #{others[key][0]}"
        if snap.measured_count + sum(len(v) for v in others.values()) >= self.settings.trials:
            return "limit", (f"{snap.measured_count} trials measured and "
                             f"{sum(len(v) for v in others.values())} running of "
                             f"{self.settings.trials}")
        margins = self.margins(snap)
        if not self.candidates.fits_margins(key, margins):
            phases = [f"{phase} +{margin:.0%}" for phase, margin in margins.items()
                      if margin > self.settings.memory_margin]
            return "memory", (f"{key} exceeds memory with the margins raised by measured "
                              f"OOMs ({', '.join(phases)})")
        return None

    def objective(self, trial: Trial):
        trial.set_user_attr(orphans.TUNER_PROCESS, self.tuner_process)  # before anything runs
        proposal = trial.relative_params
        key = self.candidates.key_of(proposal) if proposal else None
        if key is None:
            if not proposal:
                self._stop_reason = "no allowed layout left to try"
            trial.set_user_attr(attrs.SKIPPED, "no allowed layout" if not proposal
                                else "not a layout of this study's search space")
            raise Skipped(trial.user_attrs[attrs.SKIPPED])
        trial.set_user_attr(attrs.KEY, key)  # the claim other tuners see
        trial.set_user_attr(attrs.TUNER, self.tuner_id)
        verdict = self._check(trial.study, trial.number, key)
        if verdict:
            kind, reason = verdict
            trial.set_user_attr(attrs.SKIPPED, reason)
            trial.set_user_attr(attrs.SKIP_KIND, kind)
            raise Skipped(reason)
        candidate = self.candidates.get(key)
        for name, choices in self.candidates.choices.items():
            trial.suggest_categorical(name, choices)
        retry = self._frozen(trial).system_attrs.get("failed_trial")
        if retry is not None:
            trial.set_user_attr(attrs.RETRY_OF, retry)
        trial.set_user_attr(attrs.LAYOUT, {**candidate.layout.to_dict(), "rank": candidate.rank})
        trial.set_user_attr(attrs.PREDICTED, dict(candidate.predicted))
        if candidate.placement:
            trial.set_user_attr(attrs.PLACEMENT, dict(candidate.placement))
        snap = self._snapshot(trial.study)
        self._update_status(snap)
        self.status.running = f"#{trial.number} {key}"
        self.progress.started(self.status, trial.number, key)
        request = self.jobs.request(self.sweep_dir, trial.number, candidate,
                                    self.launcher.shares_filesystem, os.environ)
        trial.set_user_attr(attrs.LOG, str(request.log_path))
        tokens_from_step_time = candidate.mode != "sync"
        monitor = None
        if self.pruner != "none":
            monitor = StepReporter(trial, metrics_path=request.metrics_path,
                                   log_path=request.log_path, steps=self.jobs.steps,
                                   warmup_steps=self.settings.warmup_steps,
                                   n_gpus=self.plan.cluster.num_gpus, limits=self.limits,
                                   tokens_from_step_time=tokens_from_step_time)
        try:
            result = run_trial(request, self.launcher, steps=self.jobs.steps,
                               warmup_steps=self.settings.warmup_steps,
                               n_gpus=self.plan.cluster.num_gpus,
                               on_start=lambda handle: trial.set_user_attr(attrs.LAUNCH, handle),
                               limits=self.limits,
                               tokens_from_step_time=tokens_from_step_time, monitor=monitor)
        except KeyboardInterrupt:
            trial.set_user_attr(attrs.SKIPPED, "interrupted")
            raise
        finally:
            self.status.running = ""
        self._record(trial, result)
        if result.category is Category.PRUNED:
            raise optuna.TrialPruned(result.classification.reason)
        if not result.ok:
            raise TrialFailed(result.classification.reason)
        values = [result.summary.tokens_per_s_per_gpu]
        if self.settings.multi_objective:
            peak = result.peak_memory_gib
            values.append(peak if peak is not None else candidate.predicted["peak_gib"])
        return values if len(values) > 1 else values[0]

    @staticmethod
    def _frozen(trial: Trial):
        return next(t for t in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                    if t.number == trial.number)

    def _record(self, trial: Trial, result: TrialResult) -> None:
        classification = result.classification
        trial.set_user_attr(attrs.MEASURED, result.measured())
        trial.set_user_attr(attrs.REASON, classification.reason)
        trial.set_user_attr(attrs.EVIDENCE, list(classification.evidence))
        trial.set_user_attr(attrs.DURATION, round(result.outcome.duration_s, 3))
        if classification.oom_phase:
            trial.set_user_attr(attrs.OOM_PHASE, classification.oom_phase)
        if classification.oom_numbers:
            trial.set_user_attr(attrs.OOM_NUMBERS, classification.oom_numbers)
        if classification.cause:
            trial.set_user_attr(attrs.CAUSE, classification.cause)
        # Last: a trial with a category counts as measured (study_state).
        trial.set_user_attr(attrs.CATEGORY, classification.category.value)
        self._durations.append(result.outcome.duration_s)

    # --- between trials ----------------------------------------------------------------------

    def _update_status(self, snap: attrs.Snapshot) -> None:
        self.status.measured = snap.measured_count
        if snap.best is not None:
            self.status.best_value = attrs.measured_value(snap.best)
            self.status.best_trial = snap.best.number
            self.status.best_key = snap.best.user_attrs.get(attrs.KEY, "")
        if self._durations:
            self.status.mean_trial_s = float(np.mean(self._durations))

    def after_trial(self, study: optuna.Study, trial) -> None:
        """Optuna callback: report, write back a new best, decide whether to go on."""
        snap = self._snapshot(study)
        self._update_status(snap)
        user = trial.user_attrs
        if attrs.CATEGORY in user:
            self._skips = 0
            measured = user.get(attrs.MEASURED) or {}
            self.progress.finished(self.status, Row(
                number=trial.number, key=user.get(attrs.KEY, ""), category=user[attrs.CATEGORY],
                measured=measured.get("tokens_per_s_per_gpu"),
                predicted=(user.get(attrs.PREDICTED) or {}).get("tokens_per_s_per_gpu"),
                duration_s=float(user.get(attrs.DURATION) or 0.0),
                reason=user.get(attrs.REASON, "")))
            self.write_outputs(study, snap)
            self.update_confidence(study, snap)
        elif attrs.SKIPPED in user:
            self._skips += 1
        if self._should_stop(study, snap, user.get(attrs.SKIP_KIND)):
            study.stop()
        else:
            self.enqueue_next(study)

    def _should_stop(self, study: optuna.Study, snap: attrs.Snapshot, skip_kind) -> bool:
        target = self.settings.trials
        if snap.measured_count >= target:
            # the final line already counts them: "6 trials measured (the --trials 6 budget)"
            self._stop_reason = f"the --trials {target} budget"
            return True
        if skip_kind == "limit":
            # Another tuner is running the last trials.  Two tuners may both have backed
            # off; look again after a random pause before giving up.
            time.sleep(random.uniform(0.2, 1.0))
            snap = self._snapshot(study)
            running = sum(len(v) for v in snap.running.values())
            if snap.measured_count + running >= target:
                self._stop_reason = (f"the last of {target} trials are running in other "
                                     f"tuners")
                return True
        if self._stop_reason:
            return True
        cause = self._common_cause(snap)
        if cause:
            self._stop_reason = (f"the first {self.settings.fail_fast} trials all failed with "
                                 f"one cause: {cause} (see `plan-parallel doctor`)")
            return True
        if (self.settings.stop_when_confident and self.confidence is not None
                and self.confidence.confident):
            self._stop_reason = self.confidence.statement()
            return True
        patience = self.settings.patience
        if patience and snap.best is not None and attrs.trials_since_improvement(
                snap.finished, self.settings.min_improvement) >= patience:
            self._stop_reason = f"no improvement in the last {patience} trials"
            return True
        if self._skips >= MAX_CONSECUTIVE_SKIPS:
            self._stop_reason = f"{self._skips} proposals in a row could not run"
            return True
        return False

    def _common_cause(self, snap: attrs.Snapshot) -> str | None:
        """The cause the first ``fail_fast`` trials this tuner measured all failed with, if they
        did (OOMs excluded: they are the layouts' fault, and the study steers away from them;
        a pruned trial ran well).
        Trials of earlier runs do not count: a rerun after fixing the cause tries again."""
        count = self.settings.fail_fast
        first = [t for t in snap.finished
                 if t.user_attrs.get(attrs.TUNER) == self.tuner_id][:count]
        if not count or len(first) < count:
            return None
        causes = {t.user_attrs.get(attrs.CAUSE) for t in first}
        categories = {t.user_attrs.get(attrs.CATEGORY) for t in first}
        if len(causes) != 1 or None in causes or categories & {"ok", "oom", "pruned"}:
            return None
        return first[-1].user_attrs.get(attrs.REASON) or causes.pop()

    def assess(self, snap: attrs.Snapshot) -> Confidence | None:
        """Could an untried layout beat the best measured one (:mod:`trials.confidence`)?"""
        if snap.best is None:
            return None
        successes = []
        for trial in snap.finished:
            value = attrs.measured_value(trial)
            index = self.candidates.index.get(trial.user_attrs.get(attrs.KEY, ""))
            if value is not None and index is not None:
                successes.append((index, value))
        untried = self.candidates.allowed([*snap.measured, *snap.running], self.margins(snap))
        return assess(self.predicted, untried, successes,
                      (snap.best.user_attrs.get(attrs.KEY, ""), attrs.measured_value(snap.best)),
                      self.model_error)

    def update_confidence(self, study: optuna.Study, snap: attrs.Snapshot) -> None:
        """Assess the study's confidence; keep it with the study (``report`` shows it) and in
        the written job's ``tuned.json``."""
        self.confidence = self.assess(snap)
        if self.confidence is None:
            return
        data = self.confidence.to_dict()
        study.set_user_attr(attrs.CONFIDENCE, data)
        if self.write_dir is not None and self._written_best is not None:
            update_tuned(self.write_dir, {attrs.CONFIDENCE: data})

    def write_outputs(self, study: optuna.Study, snap: attrs.Snapshot) -> None:
        """trials.csv always; the best layout's job when the best changed."""
        directories = [self.sweep_dir] + ([self.write_dir] if self.write_dir else [])
        self._csv = list(write_trials_csv(study, directories))
        best = snap.best
        if self.write_dir is None or best is None:
            return
        candidate = self.candidates.get(best.user_attrs.get(attrs.KEY, ""))
        if candidate is None or best.number == self._written_best:
            return
        paths = write_best(candidate, best, self.write_dir, study_name=self.study_name,
                           model_path=self.jobs.model_path, train_files=self.jobs.train_files,
                           val_files=self.jobs.val_files, overrides=self.jobs.overrides)
        self._written_best = best.number
        self.progress.note(f"new best: trial #{best.number} {candidate.key} "
                           f"{attrs.measured_value(best):,.1f} tok/s/GPU -> "
                           f"{self.write_dir}")
        self._job = list(paths)

    def _stale_trial(self, study: optuna.Study, trial, why: str = "") -> None:
        """Heartbeat-stale trial (its tuner died): stop its leftovers, then retry it."""
        why = why or f"no heartbeat for {self.settings.grace_period} s"
        handle = orphans.launch_handle(trial, trial.user_attrs.get(orphans.TUNER_PROCESS))
        what = "it had not launched"
        if handle:
            try:
                what = launcher_for_handle(handle, self.launcher).abandon(handle)
            except Exception as error:  # noqa: BLE001 - report, keep tuning
                what = f"could not stop its trainer ({error})"
        measured = attrs.CATEGORY in trial.user_attrs
        retry = trial.params and not measured
        self.progress.note(f"trial #{trial.number} lost its tuner ({why}): {what}"
                           + ("; running it again" if retry else ""))
        if retry:
            optuna.storages.RetryHeartbeatStaleTrialCallback(
                max_retry=self.settings.max_retry)(study, trial)

    def _orphaned_trial(self, study: optuna.Study, trial) -> None:
        record = trial.user_attrs.get(orphans.TUNER_PROCESS) or {}
        self._stale_trial(study, trial, f"its tuner, pid {record.get('pid')} on "
                                        f"{record.get('host')}, is gone")

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> TuneResult:
        import warnings

        from optuna.exceptions import ExperimentalWarning

        warnings.filterwarnings("ignore", category=ExperimentalWarning)
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        study = self.open_study()
        write_sweep_file(self.sweep_dir, self.study_name, self.storage_spec)
        self.status.deadline = (time.monotonic() + self.settings.timeout_s
                                if self.settings.timeout_s else None)
        # a killed tuner's trials, before enqueueing: at once when it ran here, else stale
        orphans.fail_orphaned_trials(study, self._orphaned_trial)
        optuna.storages.fail_stale_trials(study)
        snap = self._snapshot(study)
        self._update_status(snap)
        self.progress.note(
            f"study {self.study_name} ({self.storage_spec.display}): {len(self.candidates)} "
            f"candidate layouts, {snap.measured_count} of {self.settings.trials} trials measured"
            f", launcher {self.launcher.describe()}")
        try:
            if not self._should_stop(study, snap, None):
                self.enqueue_next(study)
                study.optimize(self.objective, timeout=self.settings.timeout_s,
                               catch=(TrialFailed,), callbacks=[self.after_trial])
                if not self._stop_reason:
                    self._stop_reason = "--timeout reached"
        finally:
            snap = self._snapshot(study)
            self.write_outputs(study, snap)
            self.update_confidence(study, snap)
            self.progress.close()
        best = snap.best
        return TuneResult(study_name=self.study_name, measured=snap.measured_count,
                          best_trial=best.number if best else None,
                          best_key=best.user_attrs.get(attrs.KEY) if best else None,
                          best_value=attrs.measured_value(best) if best else None,
                          stop_reason=self._stop_reason, written=(*self._job, *self._csv),
                          confidence=self.confidence)




def write_sweep_file(sweep_dir: Path, study_name: str, storage: StorageSpec) -> Path:
    """Where the sweep's study is (the storage URL without its password), for
    ``plan-parallel calibrate SWEEP_DIR``."""
    import json

    path = Path(sweep_dir) / SWEEP_FILE
    path.write_text(json.dumps({"study_name": study_name, "storage": storage.display,
                                "storage_kind": storage.kind}, indent=2) + "\n")
    return path


def study_info(model_ref: str, plan, settings: TuneSettings, launcher: Launcher,
               steps: int, mode: str = "sync",
               staleness_grid: tuple[float, ...] = ()) -> dict[str, Any]:
    """What a study searches (stored with it; ``plan-parallel calibrate`` rebuilds from it)."""
    return {"planner_version": __version__, "model_ref": model_ref,
            "model": plan.model.to_dict(), "cluster": plan.cluster.to_dict(),
            "workload": plan.workload.to_dict(), "steps": steps, "mode": mode,
            **({"staleness_grid": list(staleness_grid)} if staleness_grid else {}),
            "launcher": launcher.name, "settings": {k: v for k, v in asdict(settings).items()
                                                    if k not in ("seed",)}}
