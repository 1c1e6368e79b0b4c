"""A trial's job: the exported verl job of a layout, cut to a short horizon, in its own directory.

The overrides are :func:`planner.verl.export.job_overrides` (what ``plan-parallel --write``
exports, so a trial measures the job the user will run), then the user's ``--override``s, then
the trial's horizon, which wins: ``trainer.total_training_steps``, no validation, no
checkpoints, no resume, a unique experiment name, ``data.train_max_samples`` of exactly the
steps' prompts, and the file logger writing to the trial's ``metrics.jsonl``
(``VERL_FILE_LOGGER_PATH``, passed to verl's Ray runtime environment as well as to the process).

The trainer command is configurable (default ``python3 -m verl.trainer.main_ppo``) so a site
can wrap it (``srun ...``, ``apptainer exec ...``); it is split like a shell would, but never run
through one.

A trial of an asynchronous training mode (a candidate of ``tune --mode``) runs the job
``plan --mode ... --write`` exports for its split (:meth:`planner.modes.TrainingMode.job`:
the trainer pool's layout, the rollout pool, ``async_training.*``) under the mode's entry module
(``keys.MODE_ENTRY``): :func:`mode_command` puts it where the command names
``verl.trainer.main_ppo``.  A command that does not name it (a wrapper script) runs as given
for every mode; the overrides tell the modes apart (``actor_rollout_ref.hybrid_engine=False``
for both asynchronous modes, ``async_training.*`` for fully-async).  The horizon is the same:
with one parameter sync per train batch (the planner's default ``trigger_parameter_sync_step``)
fully-async logs one record per sync, i.e. per step, and stops when the horizon's
``data.train_max_samples`` prompts are consumed.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from planner.catalog.hardware import ClusterSpec
from planner.catalog.models import ModelSpec
from planner.catalog.workload import GrpoWorkload
from planner.errors import PlanInputError
from planner.modes import Launch, export_job
from planner.verl.export import ENVIRONMENT, hydra_value
from planner.verl.keys import ENTRY_MODULE, MODE_ENTRY
from trials.candidates import Candidate
from trials.launchers.launcher import LaunchRequest

DEFAULT_TRAINER_COMMAND = "python3 -m verl.trainer.main_ppo"
PROJECT_NAME = "plan_parallel_trials"
LOG_FILE = "trainer.log"
METRICS_FILE = "metrics.jsonl"
COMMAND_FILE = "command.sh"
LOGGER_ENV = "VERL_FILE_LOGGER_PATH"


def split_command(text: str) -> tuple[str, ...]:
    try:
        argv = tuple(shlex.split(text))
    except ValueError as error:
        raise PlanInputError(f"--trainer-command {text!r}: {error}") from None
    if not argv:
        raise PlanInputError("--trainer-command is empty")
    return argv


def mode_command(command: Sequence[str], mode: str) -> tuple[str, ...]:
    """``command`` for a trial of ``mode``: verl's synchronous entry module replaced by the
    mode's wherever the command names it (see the module docstring)."""
    entry = MODE_ENTRY[mode]
    return tuple(entry if part == ENTRY_MODULE else part for part in command)


def parse_env(items: Sequence[str]) -> dict[str, str]:
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not name.replace("_", "a").isalnum():
            raise PlanInputError(f"--trial-env {item!r} is not NAME=VALUE")
        env[name] = value
    return env


def horizon_overrides(*, steps: int, train_batch_size: int, experiment: str, workdir: Path,
                      metrics_path: Path | None) -> list[str]:
    out = [f"trainer.total_training_steps={steps}",
           "trainer.val_before_train=False",
           "trainer.test_freq=-1",
           "trainer.save_freq=-1",
           "trainer.resume_mode=disable",
           "trainer.log_val_generations=0",
           f"trainer.project_name={PROJECT_NAME}",
           f"trainer.experiment_name={hydra_value(experiment)}",
           f"trainer.default_local_dir={hydra_value(str(workdir / 'checkpoints'))}",
           f"data.train_max_samples={train_batch_size * steps}"]
    if metrics_path is not None:
        out += ["trainer.logger=[console,file]",
                f"+ray_kwargs.ray_init.runtime_env.env_vars.{LOGGER_ENV}="
                f"{hydra_value(str(metrics_path))}"]
    else:
        out.append("trainer.logger=[console]")
    return out


def job_environment(overrides: Mapping[str, str], inherited: Mapping[str, str]) -> dict[str, str]:
    """The export's environment (``CUDA_DEVICE_MAX_CONNECTIONS=1``, ...), where the user may
    keep their own value of the overridable ones; then the trial's own variables."""
    env = {}
    for name, value, overridable, _ in ENVIRONMENT:
        env[name] = inherited[name] if overridable and name in inherited else value
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env


@dataclass(frozen=True)
class TrialJobs:
    """Everything that is the same for every trial of a study."""

    model: ModelSpec
    cluster: ClusterSpec
    workload: GrpoWorkload
    trainer_command: tuple[str, ...]
    model_path: str
    train_files: str
    val_files: str
    steps: int
    wall_timeout_s: float
    hang_timeout_s: float
    study_name: str
    overrides: tuple[str, ...] = ()  # the user's --override
    env: Mapping[str, str] = field(default_factory=dict)  # the user's --trial-env
    max_log_bytes: int | None = None  # --max-log-bytes

    def workdir(self, sweep_dir: Path, number: int, candidate: Candidate) -> Path:
        """``trials/NNNN-KEY`` in the sweep folder; where that folder exists already -- another
        study in the same ``--sweep-dir`` ran its trial NNNN on the same layout -- the first
        free ``NNNN-KEY.2``, ``.3``, ...: the launcher appends to ``trainer.log``, and a
        trainer that fails before verl's file logger opens leaves the old ``metrics.jsonl``,
        so a reused folder would classify and measure the other run's trial."""
        base = Path(sweep_dir).resolve() / "trials"
        name = f"{number:04d}-{candidate.key}"
        workdir, copy = base / name, 1
        while workdir.exists():
            copy += 1
            workdir = base / f"{name}.{copy}"
        return workdir

    def horizon_notes(self, candidates: Sequence[Candidate]) -> list[str]:
        """What the study's time limits will do to every trial, from the fastest predicted
        step among ``candidates``: verl logs a step's metrics when the step ends and nothing
        while it generates and trains, so a step longer than the hang timeout is stopped as a
        hang; ``steps`` steps longer than the wall-clock limit stop at it.  One line per limit
        that even the fastest layout's predicted step breaks (the model's time is a prediction:
        it errs both ways); [] when none does."""
        steps = [float(c.predicted["step_time_s"]) for c in candidates
                 if c.predicted.get("step_time_s")]
        if not steps:
            return []
        fastest = min(steps)
        notes = []
        if fastest > self.hang_timeout_s:
            notes.append(f"the fastest layout's step is predicted to take {fastest:,.0f} s, longer "
                         f"than --hang-timeout {self.hang_timeout_s:g} s: verl writes a step's "
                         f"metrics when it ends, so every trial would be stopped as a hang; pass "
                         f"--hang-timeout above {fastest:,.0f} s (e.g. "
                         f"{_round_up_minutes(2 * fastest)})")
        if self.steps * fastest > self.wall_timeout_s:
            notes.append(f"{self.steps} steps of the fastest layout are predicted to take "
                         f"{self.steps * fastest:,.0f} s (model loading not counted), longer "
                         f"than --trial-timeout {self.wall_timeout_s:g} s: every trial would stop "
                         f"at the limit; pass a longer --trial-timeout (e.g. "
                         f"{_round_up_minutes(2 * self.steps * fastest)}) or fewer --steps")
        return notes

    def overrides_of(self, candidate: Candidate, extra: Sequence[str]) -> list[str]:
        """The exported job of ``candidate`` (its mode's), then ``extra``."""
        job = export_job(candidate.plan, candidate.rank, Launch(
            model_path=self.model_path, train_files=self.train_files, val_files=self.val_files,
            extra_overrides=tuple(extra)))
        return job.overrides({"MODEL_PATH": self.model_path, "TRAIN_FILES": self.train_files,
                              "VAL_FILES": self.val_files})

    def request(self, sweep_dir: Path, number: int, candidate: Candidate,
                shares_filesystem: bool, inherited_env: Mapping[str, str]) -> LaunchRequest:
        workdir = self.workdir(sweep_dir, number, candidate)
        metrics = workdir / METRICS_FILE if shares_filesystem else None
        experiment = f"{self.study_name}-{number:04d}"
        horizon = horizon_overrides(steps=self.steps,
                                    train_batch_size=self.workload.train_batch_size,
                                    experiment=experiment, workdir=workdir, metrics_path=metrics)
        overrides = self.overrides_of(candidate, [*self.overrides, *horizon])
        env = dict(self.env)
        if metrics is not None:
            env[LOGGER_ENV] = str(metrics)
        command = mode_command(self.trainer_command, candidate.mode)
        return LaunchRequest(argv=(*command, *overrides), workdir=workdir,
                             log_path=workdir / LOG_FILE, metrics_path=metrics,
                             wall_timeout_s=self.wall_timeout_s,
                             hang_timeout_s=self.hang_timeout_s,
                             env=job_environment(env, inherited_env), name=experiment,
                             max_log_bytes=self.max_log_bytes)


def _round_up_minutes(seconds: float) -> str:
    """``seconds`` as whole minutes, rounded up (``45m``), the form --hang-timeout takes."""
    return f"{-(-int(seconds) // 60)}m"


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by its owner only (mode 0600, from its creation:
    never readable by others, not even for a moment); an existing file is replaced."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(descriptor, 0o600)  # whatever the umask
        with os.fdopen(descriptor, "w") as handle:
            descriptor = -1
            handle.write(text)
    finally:
        if descriptor >= 0:
            os.close(descriptor)
    os.replace(temporary, path)
    return path


def write_command(request: LaunchRequest) -> Path:
    """The trial's command as a script, to rerun it by hand (``bash command.sh``).  It holds
    the trial's environment (``--trial-env`` values, which may be tokens), so it is written
    mode 0600."""
    path = request.workdir / COMMAND_FILE
    parts = ["env", *(f"{name}={value}" for name, value in sorted(request.env.items()))]
    command = " \\\n    ".join(shlex.quote(part) for part in [*parts, *request.argv])
    return write_private(path, f"#!/usr/bin/env bash\n"
                               f"cd {shlex.quote(str(request.workdir))}\n{command}\n")
