"""``plan-parallel tune``: run short real verl GRPO trials of the planner's best layouts.

``add_arguments`` stays import-light (``plan-parallel --help`` builds every parser); everything
else is imported when the command runs.
"""

from __future__ import annotations

import argparse
import re
import sys

DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?"
                      r"(?:(\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str, flag: str) -> float:
    """``8h``, ``1h30m``, ``45m``, ``90s`` or plain seconds."""
    from planner.errors import PlanInputError

    match = DURATION.match(str(text).strip().lower())
    if not match or not any(match.groups()):
        raise PlanInputError(f"{flag} {text!r} is not a duration (e.g. 8h, 1h30m, 45m, 90s)")
    days, hours, minutes, seconds = (float(part) if part else 0.0 for part in match.groups())
    value = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if value <= 0:
        raise PlanInputError(f"{flag} {text!r} must be longer than zero")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from planner.cli import _cluster_args, _layout_args, _workload_args

    _cluster_args(parser)
    _workload_args(parser)
    _layout_args(parser, required=False)
    study = parser.add_argument_group("study (Optuna)")
    study.add_argument("--trials", type=int, default=20,
                       help="measured trials the study should have (default 20; several tuners "
                            "on one study share this count)")
    study.add_argument("--timeout", help="start no trial after this long, e.g. 8h (default: "
                                         "no limit)")
    study.add_argument("--study-name", help="default: derived from model, GPUs and workload")
    study.add_argument("--storage", help="SQLAlchemy URL (sqlite:///f.db, postgresql://user:pass"
                                         "@host/db) or journal:PATH (default: SQLite in the "
                                         "sweep directory)")
    study.add_argument("--sweep-dir", help="trial directories, logs, study.db, trials.csv "
                                           "(default: sweeps/<study name>)")
    study.add_argument("--steps", type=int, default=5,
                       help="training steps per trial (trainer.total_training_steps, default 5)")
    study.add_argument("--warmup-steps", type=int, default=1,
                       help="first steps left out of the medians (default 1)")
    study.add_argument("--top-k", type=int, default=5,
                       help="predicted best layouts run first (default 5)")
    study.add_argument("--patience", type=int, default=0,
                       help="stop after this many trials without improvement (default 0: "
                            "never)")
    study.add_argument("--min-improvement", type=float, default=0.01,
                       help="what counts as an improvement for --patience (default 0.01 = 1%%)")
    study.add_argument("--multi-objective", action="store_true",
                       help="also minimise measured peak GPU memory")
    study.add_argument("--sampler", choices=("tpe", "random"), default="tpe")
    study.add_argument("--seed", type=int)
    study.add_argument("--memory-margin", type=float, default=0.0,
                       help="run only layouts predicted to fit with this fraction of GPU memory "
                            "to spare (default 0); measured OOMs raise it per phase")
    study.add_argument("--max-candidates", type=int, default=5000,
                       help="predicted best layouts the study may choose from (default 5000)")
    study.add_argument("--no-offload", action="store_true",
                       help="leave parameter/optimizer offload out of the search")
    trial = parser.add_argument_group("trials")
    trial.add_argument("--launcher", choices=("local", "ray"), default="local",
                       help="local: a process group on this node; ray: a job on a Ray cluster")
    trial.add_argument("--ray-address", help="Ray dashboard address for --launcher ray "
                                             "(default $RAY_ADDRESS or http://127.0.0.1:8265)")
    trial.add_argument("--no-shared-fs", action="store_true",
                       help="ray: the cluster cannot see the sweep directory (metrics come "
                            "from the job's console log)")
    trial.add_argument("--trainer-command", help="command before the overrides (default "
                                                 "'python3 -m verl.trainer.main_ppo'; e.g. "
                                                 "'srun --ntasks=1 python3 -m ...')")
    trial.add_argument("--trial-timeout", default="30m",
                       help="wall-clock limit of one trial (default 30m)")
    trial.add_argument("--hang-timeout", default="10m",
                       help="stop a trial whose log and metrics stop growing this long "
                            "(default 10m)")
    trial.add_argument("--stop-grace", default="15s",
                       help="SIGTERM-to-SIGKILL delay when stopping a trial (default 15s)")
    trial.add_argument("--trial-env", action="append", default=[], metavar="NAME=VALUE",
                       help="environment variable for every trial (repeatable)")
    trial.add_argument("--heartbeat-interval", type=int, default=30,
                       help="seconds between a running trial's heartbeats (default 30)")
    trial.add_argument("--grace-period", type=int, default=120,
                       help="a trial without heartbeat this long lost its tuner and is retried "
                            "(default 120)")
    trial.add_argument("--max-retry", type=int, default=3,
                       help="retries of a trial whose tuner died (default 3)")
    export = parser.add_argument_group("the verl job (trials and the written-back best layout)")
    export.add_argument("--write", metavar="DIR",
                        help="write the best measured layout as a verl job (and trials.csv)")
    export.add_argument("--model-path", help="HF model directory (default $MODEL_PATH)")
    export.add_argument("--train-files", help="training parquet (default $TRAIN_FILES)")
    export.add_argument("--val-files", help="validation parquet (default $VAL_FILES)")
    export.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Hydra override for the job (repeatable)")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]+", "-", text).strip("-")


def default_study_name(model, cluster, workload) -> str:
    return _slug(f"{model.name}-{cluster.num_gpus}x{cluster.gpu.name}-b{workload.train_batch_size}"
                 f"n{workload.rollout_n}-p{workload.prompt_length}r{workload.response_length}")


def _positive(args, *names: str) -> None:
    from planner.errors import PlanInputError

    for name in names:
        if getattr(args, name) < 1:
            raise PlanInputError(f"--{name.replace('_', '-')} must be a positive integer, got "
                                 f"{getattr(args, name)}")


def _job_paths(args) -> tuple[str, str, str]:
    import os

    from planner.errors import PlanInputError

    values = (args.model_path or os.environ.get("MODEL_PATH"),
              args.train_files or os.environ.get("TRAIN_FILES"),
              args.val_files or os.environ.get("VAL_FILES"))
    if not all(values):
        raise PlanInputError("tune launches verl: pass --model-path, --train-files and "
                             "--val-files (or set $MODEL_PATH, $TRAIN_FILES, $VAL_FILES)")
    return values


def make_launcher(args, cluster, command: tuple[str, ...]):
    import os

    from planner.errors import PlanInputError
    from trials.storage import mask_url

    grace = parse_duration(args.stop_grace, "--stop-grace")
    if args.launcher == "local":
        import shutil

        from trials.launchers.local import LocalLauncher

        if shutil.which(command[0]) is None:
            raise PlanInputError(f"--trainer-command: {command[0]!r} is not an executable "
                                 f"on PATH")

        return LocalLauncher(gpus=min(cluster.gpus_per_node, cluster.num_gpus),
                             stop_grace_s=grace)
    from trials.launchers.ray_jobs import RayJobLauncher

    address = args.ray_address or os.environ.get("RAY_ADDRESS") or "http://127.0.0.1:8265"
    launcher = RayJobLauncher(address, shared_filesystem=not args.no_shared_fs)
    try:
        launcher.client().list_jobs()
    except Exception as error:  # noqa: BLE001 - unreachable cluster, wrong address
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PlanInputError(f"cannot reach the Ray cluster at {mask_url(address)}: "
                             f"{mask_url(first)}") from None
    return launcher


def run(args) -> int:
    import signal
    from pathlib import Path

    from planner.cli import _calibration, _pins, _resolve_cluster, _workload
    from planner.errors import PlanInputError
    from planner.layout import RECOMPUTE
    from planner.models import resolve_model
    from planner.plan import make_plan
    from planner.space import SearchOptions
    from planner.verl_export import check_overrides
    from trials.candidates import CandidateSet
    from trials.job import DEFAULT_TRAINER_COMMAND, TrialJobs, parse_env, split_command
    from trials.storage import resolve_storage

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
    timeout = parse_duration(args.timeout, "--timeout") if args.timeout else None
    trial_timeout = parse_duration(args.trial_timeout, "--trial-timeout")
    hang_timeout = parse_duration(args.hang_timeout, "--hang-timeout")
    model_path, train_files, val_files = _job_paths(args)
    overrides = tuple(check_overrides(args.override))
    trial_env = parse_env(args.trial_env)
    command = split_command(args.trainer_command or DEFAULT_TRAINER_COMMAND)

    model = resolve_model(args.model)
    cluster = _resolve_cluster(args)
    workload = _workload(args)
    pins = _pins(args)
    options = SearchOptions(offload=(False,) if args.no_offload else (False, True),
                            recompute=(args.recompute,) if args.recompute else RECOMPUTE,
                            gpu_memory_utilization=args.gpu_memory_utilization,
                            fixed=tuple(sorted(pins.items())))
    plan = make_plan(model, cluster, workload, options, _calibration(args))
    candidates = CandidateSet.from_plan(plan, args.memory_margin, args.max_candidates)
    if not len(candidates):
        raise PlanInputError(f"no layout of {model.name} on {cluster.num_gpus} x "
                             f"{cluster.gpu.name} is predicted to fit with a "
                             f"{args.memory_margin:.0%} memory margin; nothing to try")
    study_name = args.study_name or default_study_name(model, cluster, workload)
    sweep_dir = Path(args.sweep_dir) if args.sweep_dir else Path("sweeps") / _slug(study_name)
    storage = resolve_storage(args.storage, sweep_dir)
    launcher = make_launcher(args, cluster, command)

    from trials.progress import make_progress
    from trials.study import Tuner, TuneSettings, study_info

    settings = TuneSettings(
        trials=args.trials, timeout_s=timeout, warmup_steps=args.warmup_steps,
        top_k=args.top_k, patience=args.patience, min_improvement=args.min_improvement,
        multi_objective=args.multi_objective, memory_margin=args.memory_margin,
        sampler=args.sampler, seed=args.seed, heartbeat_interval=args.heartbeat_interval,
        grace_period=args.grace_period, max_retry=args.max_retry)
    jobs = TrialJobs(model=model, cluster=cluster, workload=workload, trainer_command=command,
                     model_path=model_path, train_files=train_files, val_files=val_files,
                     steps=args.steps, wall_timeout_s=trial_timeout,
                     hang_timeout_s=hang_timeout, study_name=study_name, overrides=overrides,
                     env=trial_env)
    tuner = Tuner(plan=plan, candidates=candidates, jobs=jobs, launcher=launcher,
                  storage=storage, study_name=study_name, sweep_dir=sweep_dir,
                  write_dir=Path(args.write) if args.write else None, settings=settings,
                  progress=make_progress(), study_info=study_info(args.model, plan, settings,
                                                                   launcher, args.steps))

    def terminate(signum, frame):  # `kill <tuner>`: stop the running trial, like Ctrl-C
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
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
    for path in result.written:
        print(f"wrote {path}", file=sys.stderr)
    return 0
