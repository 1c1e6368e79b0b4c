"""Multi-fidelity trials: each step's throughput goes to Optuna, and a trailing trial stops early.

While a trial runs, :class:`StepReporter` (the launcher's ``monitor``) reads the step records
the trainer has written so far -- verl's metrics file, or the console log when there is none --
and after each new step past the warm-up reports the trial's tokens/s/GPU so far (the median
over its steady steps: the statistic its final value is, :func:`trials.metrics.summarise`) at
step 1, 2, ... of the steady state (``trial.report``).  The study's pruner compares that value
with the other trials' at the same step; when the trial trails, the reporter answers
``"pruned"``, the launcher stops the trainer's process group as it stops any trial (SIGTERM,
then SIGKILL after ``--stop-grace``), and the study records the trial as PRUNED with what it
measured until then (:class:`~trials.failures.Category`).  A trial is never pruned at its last
step: it has cost all it will cost.

Pruners (``tune --pruner``), both Optuna's over the steady steps (the resource):

* ``successive-halving`` -- :class:`optuna.pruners.SuccessiveHalvingPruner` with rungs at steady
  steps 1, 3, 9, ... (``REDUCTION_FACTOR`` 3): at each rung a trial goes on only while it is in
  the best third of the trials that reached that rung (the best one while fewer than three
  did) -- so a layout that trails the study's best at equal steps stops there;
* ``hyperband`` -- :class:`optuna.pruners.HyperbandPruner` over 1 .. the steady steps, the same
  rule in brackets that start pruning at different steps (a trial is in one bracket, by its
  number);
* ``probe`` -- a cheaper fidelity: every trial is a probe of one steady step after its
  warm-up, and goes on to all its steps only while it is within the tolerance of the best value
  any trial reached at that step (the rule above with one rung, keeping the best one).  Most
  trials then cost the launch, the warm-up and one step; the sampler learns nearly as much from
  one step as from four (a step scatters by a few percent, the model errs by 16%), so a budget
  of GPU-hours buys about twice as many layouts (docs/tuning/regret.md);
* ``none`` -- every trial runs all its steps.

A multi-objective study (``--multi-objective``) cannot prune: Optuna has no intermediate values
for several objectives.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trials.defaults import PRUNERS
from trials.metrics import MetricLimits, MetricsReader, summarise

if TYPE_CHECKING:
    import optuna

PRUNED = "pruned"  # the launcher's ``stopped`` for a trial the pruner stopped
REDUCTION_FACTOR = 3  # Optuna's SuccessiveHalving/Hyperband eta: keep the best 1/3 per rung
# A trial within this fraction of the best value at its step is never pruned: one step's
# throughput scatters by a few percent (GRPO's response lengths vary from step to step), so a
# layout that close may still be the better one.
TOLERANCE = 0.05


def make_pruner(name: str, steady_steps: int,
                tolerance: float | None = None) -> "optuna.pruners.BasePruner":
    """The Optuna pruner of ``tune --pruner name`` for trials of ``steady_steps`` steps after
    their warm-up, sparing trials within ``tolerance`` (default :data:`TOLERANCE`) of the
    best value at their step."""
    import optuna

    tolerance = TOLERANCE if tolerance is None else tolerance
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "successive-halving":
        inner = optuna.pruners.SuccessiveHalvingPruner(
            min_resource=1, reduction_factor=REDUCTION_FACTOR, min_early_stopping_rate=0)
    elif name == "hyperband":
        inner = optuna.pruners.HyperbandPruner(min_resource=1,
                                               max_resource=max(int(steady_steps), 1),
                                               reduction_factor=REDUCTION_FACTOR)
    elif name == "probe":
        inner = _always_prune()
    else:
        raise ValueError(f"pruner {name!r} is not one of {', '.join(PRUNERS)}")
    return _tolerant(inner, tolerance)


def _always_prune() -> "optuna.pruners.BasePruner":
    """A pruner that stops every trial at its first report: with :func:`_tolerant`, the
    ``probe`` rule (only a trial near the best at its step goes on)."""
    from optuna.pruners import BasePruner

    class AlwaysPruner(BasePruner):
        def prune(self, study, trial) -> bool:
            return trial.last_step is not None

    return AlwaysPruner()


def _tolerant(inner: "optuna.pruners.BasePruner", tolerance: float):
    """``inner``'s decision, except for a trial within ``tolerance`` of the best value any
    trial reported at its step (maximised values)."""
    from optuna.pruners import BasePruner
    from optuna.trial import TrialState

    class TolerantPruner(BasePruner):
        def prune(self, study, trial) -> bool:
            if not inner.prune(study, trial):  # inner first: it records its rungs
                return False
            step = trial.last_step
            if step is None or tolerance <= 0:
                return True
            value = trial.intermediate_values[step]
            best = max((t.intermediate_values[step] for t in study.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                        TrialState.RUNNING))
                        if step in t.intermediate_values), default=value)
            return value < best * (1.0 - tolerance)

    return TolerantPruner()


class _Follower:
    """The new complete lines of a growing file, from where the last call stopped."""

    def __init__(self, path: Path | None):
        self.path = Path(path) if path is not None else None
        self.offset = 0
        self.rest = b""

    def new_lines(self) -> list[str]:
        if self.path is None or not self.path.is_file():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        self.offset += len(chunk)
        parts = (self.rest + chunk).split(b"\n")
        self.rest = parts.pop()  # an unfinished line waits for its end
        return [part.decode("utf-8", errors="replace") for part in parts]


class StepReporter:
    """A launcher ``monitor`` that reports a running trial's steps to Optuna and says
    ``"pruned"`` when the study's pruner stops it (module docstring).

    ``trial``: the running Optuna trial; ``metrics_path``/``log_path``: the trainer's metrics
    file and console log (the file's records are preferred, as :func:`trials.runner.run_trial`
    does); ``steps``: the trial's steps, ``warmup_steps`` of them left out."""

    def __init__(self, trial: "optuna.Trial", *, metrics_path: Path | None, log_path: Path,
                 steps: int, warmup_steps: int, n_gpus: int,
                 limits: MetricLimits | None = None, tokens_from_step_time: bool = False):
        self.trial = trial
        self.steps = steps
        self.warmup_steps = warmup_steps
        self.n_gpus = n_gpus
        self.limits = limits
        self.tokens_from_step_time = tokens_from_step_time
        self._file = _Follower(metrics_path)
        self._log = _Follower(log_path)
        self._file_reader = MetricsReader(limits)
        self._log_reader = MetricsReader(limits)
        self.reported = 0  # steady steps reported
        self.pruned_at: int | None = None  # the steady step the pruner stopped the trial at

    def records(self):
        for line in self._file.new_lines():
            self._file_reader.jsonl_line(line)
        if not self._file_reader.latest:
            for line in self._log.new_lines():
                self._log_reader.console_line(line)
        reader = self._file_reader if self._file_reader.latest else self._log_reader
        return reader.records()

    def __call__(self) -> str | None:
        records = self.records()
        steady = len(records) - self.warmup_steps
        if steady <= self.reported:
            return None
        reported = False
        for step in range(self.reported + 1, steady + 1):  # each new step, in order
            summary = summarise(records[:self.warmup_steps + step], self.warmup_steps,
                                self.n_gpus, limits=self.limits,
                                tokens_from_step_time=self.tokens_from_step_time)
            if summary.tokens_per_s_per_gpu is not None:
                self.trial.report(summary.tokens_per_s_per_gpu, step)
                reported = True
        self.reported = steady
        if not reported or len(records) >= self.steps:  # the last step: nothing left to save
            return None
        if self.trial.should_prune():
            self.pruned_at = steady
            return PRUNED
        return None

