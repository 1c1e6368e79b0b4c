"""Handler of ``tune``: run short real verl GRPO trials of the planner's best layouts (the
study itself lives in :mod:`trials.study`).  ``--mode one-step-off|fully-async|best`` tunes the
split into trainer and rollout pools (and fully-async's staleness threshold, over
``--staleness-grid``) as trial parameters (:mod:`trials.candidates`)."""

from __future__ import annotations

import re
import sys

from planner.bounds import check_output_folder
from planner.catalog.models import resolve_model
from planner.cli import inputs, notes
from planner.cli.args import UsageError
from planner.errors import NoFitError, PlanInputError
from planner.modes import BEST, all_modes, mode_names
from planner.modes.fully_async import STALENESS_GRID
from planner.plan import make_plan
from planner.verl.export import check_overrides
from trials.candidates import CandidateSet, mode_plans
from trials.defaults import TUNE_DEFAULTS
from trials.launchers.local import LocalLauncher
from trials.launchers.ray_jobs import RayJobLauncher
from trials.progress import make_progress
from trials.storage import mask_url, read_password_file, resolve_storage
from trials.study import Tuner, TuneSettings, study_info
from trials.study_outputs import check_write_dir
from trials.trial_job import DEFAULT_TRAINER_COMMAND, TrialJobs, parse_env, split_command

DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?"
                      r"(?:(\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str, flag: str, limit_s: float = 366 * 86_400) -> float:
    """``8h``, ``1h30m``, ``45m``, ``90s`` or plain seconds, at most ``limit_s``."""
    match = DURATION.match(str(text).strip().lower()) if len(str(text)) < 40 else None
    if not match or not any(match.groups()):
        raise PlanInputError(f"{flag} {text!r} is not a duration (e.g. 8h, 1h30m, 45m, 90s)")
    days, hours, minutes, seconds = (float(part) if part else 0.0 for part in match.groups())
    value = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if value <= 0:
        raise PlanInputError(f"{flag} {text!r} must be longer than zero")
    if value > limit_s:
        raise PlanInputError(f"{flag} {text!r} is longer than {limit_s:g} s")
    return value


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]+", "-", text).strip("-")


def default_study_name(model, cluster, workload, mode: str | None = None) -> str:
    suffix = "" if mode in (None, mode_names()[0]) else f"-{mode}"
    return _slug(f"{model.name}-{cluster.num_gpus}x{cluster.gpu.name}-b{workload.train_batch_size}"
                 f"n{workload.rollout_n}-p{workload.prompt_length}r{workload.response_length}"
                 f"{suffix}")


def check_mode_args(args) -> tuple[float, ...]:
    """The staleness grid of ``--mode``; flags that do not apply to it are usage errors."""
    mode = getattr(args, "mode", mode_names()[0])
    inputs.check_mode_flags(args)
    tuners = [m.name for m in all_modes() if "staleness_threshold" in m.study_fields]
    tunes = mode == BEST or mode in tuners
    if args.staleness_grid and not tunes:
        raise UsageError(f"--staleness-grid is {' and '.join(tuners)}'s; --mode {mode} has no "
                         f"staleness threshold (use --mode {' or '.join(tuners)} or {BEST})")
    return tuple(args.staleness_grid or STALENESS_GRID) if tunes else ()


def study_candidates(args, model, cluster, workload, options, grid: tuple[float, ...]):
    """``(plan, candidates)``: the plan the study describes itself by (the sync plan, or the
    first mode plan of an asynchronous mode) and its candidate set."""
    from planner.placement import AsyncOptions

    request = inputs.request(args, model, cluster, workload, options)
    if inputs.baseline_mode(args):
        plan = make_plan(request)
        return plan, CandidateSet.from_plan(plan, args.memory_margin, args.max_candidates)
    plans = mode_plans(request, args.mode,
                       AsyncOptions(partial_rollout=args.partial_rollout,
                                    trainer_gpus=tuple(args.trainer_gpus)), grid or (0.1,))
    candidates = CandidateSet.from_modes(plans, args.memory_margin, args.max_candidates,
                                         mode=args.mode)
    plan = plans[0].sync_plan or plans[0]
    return plan, candidates


def _positive(args, *names: str) -> None:
    for name in names:
        if getattr(args, name) < 1:
            raise PlanInputError(f"--{name.replace('_', '-')} must be a positive integer, got "
                                 f"{getattr(args, name)}")


def _job_paths(args) -> tuple[str, str, str]:
    import os

    values = (args.model_path or os.environ.get("MODEL_PATH"),
              args.train_files or os.environ.get("TRAIN_FILES"),
              args.val_files or os.environ.get("VAL_FILES"))
    if not all(values):
        raise PlanInputError("tune launches verl: pass --model-path, --train-files and "
                             "--val-files (or set $MODEL_PATH, $TRAIN_FILES, $VAL_FILES)")
    return values


def make_launcher(args, cluster, command: tuple[str, ...]):
    import os

    grace = parse_duration(args.stop_grace, "--stop-grace", limit_s=600)
    if args.launcher == "local":
        import shutil

        if shutil.which(command[0]) is None:
            raise PlanInputError(f"--trainer-command: {command[0]!r} is not an executable "
                                 f"on PATH")

        return LocalLauncher(gpus=min(cluster.gpus_per_node, cluster.num_gpus),
                             stop_grace_s=grace)
    address = args.ray_address or os.environ.get("RAY_ADDRESS") or "http://127.0.0.1:8265"
    launcher = RayJobLauncher(address, shared_filesystem=not args.no_shared_fs)
    try:
        launcher.client().list_jobs()
    except Exception as error:  # noqa: BLE001 - unreachable cluster, wrong address
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PlanInputError(f"cannot reach the Ray cluster at {mask_url(address)}: "
                             f"{mask_url(first)}") from None
    return launcher


def check_tune_outputs(sweep_dir, storage) -> None:
    """Every path the study writes, checked before the first trial: the sweep folder (trial
    logs, trials.csv, sweep.json) and a local storage file (study.db, a journal)."""
    from pathlib import Path

    check_output_folder(Path(sweep_dir), "--sweep-dir")
    if storage.is_local_file:
        path = Path(storage.url if storage.kind == "journal" else storage.url.split(":///", 1)[-1])
        if path.is_dir():
            raise PlanInputError(f"--storage {storage.display}: {str(path)!r} is a folder, not "
                                 f"a study file")
        check_output_folder(path.parent, "--storage")


def cmd_tune(args) -> int:
    import signal
    from pathlib import Path

    _positive(args, "trials", "steps", "top_k", "max_candidates", "heartbeat_interval",
              "grace_period")
    if args.warmup_steps < 0 or args.warmup_steps >= args.steps:
        raise PlanInputError(f"--warmup-steps {args.warmup_steps} must be between 0 and "
                             f"--steps {args.steps} - 1")
    if not 0 <= args.memory_margin < 1:
        raise PlanInputError(f"--memory-margin {args.memory_margin} must be in [0, 1)")
    if args.grace_period <= args.heartbeat_interval:
        raise PlanInputError(f"--grace-period {args.grace_period} must be longer than "
                             f"--heartbeat-interval {args.heartbeat_interval}")
    if args.workload != "grpo":
        raise PlanInputError("tune runs verl GRPO trials; --workload pretrain has no trials")
    pruner = args.pruner or ("none" if args.multi_objective else TUNE_DEFAULTS["pruner"])
    if args.multi_objective and pruner != "none":
        raise UsageError(f"--pruner {pruner} needs one objective (Optuna prunes on one "
                         f"intermediate value); leave --pruner out with --multi-objective")
    if args.multi_objective and args.pruner is None:
        print("note: --multi-objective: trials run all their steps (Optuna prunes on one "
              "objective only)", file=sys.stderr)
    grid = check_mode_args(args)
    timeout = parse_duration(args.timeout, "--timeout") if args.timeout else None
    trial_timeout = parse_duration(args.trial_timeout, "--trial-timeout")
    hang_timeout = parse_duration(args.hang_timeout, "--hang-timeout")
    parse_duration(args.stop_grace, "--stop-grace", limit_s=600)  # before any planning
    model_path, train_files, val_files = _job_paths(args)
    overrides = tuple(check_overrides(args.override))
    trial_env = parse_env(args.trial_env)
    command = split_command(args.trainer_command or DEFAULT_TRAINER_COMMAND)

    model = resolve_model(args.model)
    cluster = inputs.resolve_cluster(args)
    workload = inputs.workload(args, model)
    options = inputs.search_options(args, workload)
    plan, candidates = study_candidates(args, model, cluster, workload, options, grid)
    if not len(candidates):  # "no layout fits": exit 1, as for every command
        what = "layout" if inputs.baseline_mode(args) else f"{args.mode} split"
        raise NoFitError(f"no {what} of {model.name} on {cluster.num_gpus} x "
                         f"{cluster.gpu.name} is predicted to fit with a "
                         f"{args.memory_margin:.0%} memory margin; nothing to try")
    study_name = args.study_name or default_study_name(model, cluster, workload, args.mode)
    sweep_dir = Path(args.sweep_dir) if args.sweep_dir else Path("sweeps") / _slug(study_name)
    password = (read_password_file(args.storage_password_file)
                if args.storage_password_file else None)
    storage = resolve_storage(args.storage, sweep_dir, password)
    check_tune_outputs(sweep_dir, storage)
    if args.write:
        check_write_dir(Path(args.write), study_name, args.force)
    launcher = make_launcher(args, cluster, command)
    if not args.skip_checks:
        from planner.cli.doctor import doctor_inputs, report_checks

        modes = sorted({candidate.mode for candidate in candidates.candidates})
        report_checks(doctor_inputs(args, cluster, workload, command,
                                    (model_path, train_files, val_files), tuple(modes)),
                      before="tune")

    settings = TuneSettings(
        trials=args.trials, timeout_s=timeout, warmup_steps=args.warmup_steps,
        top_k=args.top_k, patience=args.patience, min_improvement=args.min_improvement,
        multi_objective=args.multi_objective, memory_margin=args.memory_margin,
        sampler=args.sampler, seed=args.seed, heartbeat_interval=args.heartbeat_interval,
        grace_period=args.grace_period, max_retry=args.max_retry, fail_fast=args.fail_fast,
        pruner=pruner, first_trials=args.first_trials,
        stop_when_confident=args.stop_when_confident, ucb_width=args.ucb_width,
        phase_model=args.phase_model,
        model_error=inputs.cost_model(args).uncertainty)
    jobs = TrialJobs(model=model, cluster=cluster, workload=workload, trainer_command=command,
                     model_path=model_path, train_files=train_files, val_files=val_files,
                     steps=args.steps, wall_timeout_s=trial_timeout,
                     hang_timeout_s=hang_timeout, study_name=study_name, overrides=overrides,
                     env=trial_env, max_log_bytes=args.max_log_bytes)
    for text in jobs.horizon_notes(candidates.candidates):
        notes.note(text)
    tuner = Tuner(plan=plan, candidates=candidates, jobs=jobs, launcher=launcher,
                  storage=storage, study_name=study_name, sweep_dir=sweep_dir,
                  write_dir=Path(args.write) if args.write else None, settings=settings,
                  progress=make_progress(),
                  study_info=study_info(args.model, plan, settings, launcher, args.steps,
                                        mode=args.mode, staleness_grid=grid))

    def terminate(signum, frame):  # `kill <tuner>`: stop the running trial, like Ctrl-C
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    notes.flush()  # the GPU's notes now, not after hours of trials
    try:
        result = tuner.run()
    except KeyboardInterrupt:
        print(f"plan-parallel: interrupted; the running trial was stopped. Run the same command "
              f"to resume study {study_name!r}.", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"study {result.study_name}: {result.measured} trials measured "
          f"({result.stop_reason})")
    if result.best_trial is None:
        print("no trial succeeded; see trials.csv and the trial logs in "
              f"{sweep_dir / 'trials'}")
        return 1
    print(f"best: trial #{result.best_trial} {result.best_key} "
          f"{result.best_value:,.1f} tokens/s/GPU")
    if result.confidence is not None:
        print(f"confidence: {result.confidence.statement()}")
    for path in result.written:
        print(f"wrote {path}", file=sys.stderr)
    return 0
