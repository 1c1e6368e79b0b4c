"""``plan-parallel calibrate SWEEP_DIR | --storage URL``: fit the time model to measured trials.

Prints the prediction error (mean absolute percentage error of tokens/s/GPU over the study's
successful trials) before and after the fit, and writes a calibration file that
``plan-parallel ... --calibration FILE`` reads.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep_dir", nargs="?", metavar="SWEEP_DIR",
                        help="a `plan-parallel tune` sweep directory (its sweep.json names the "
                             "study and storage)")
    parser.add_argument("--storage", help="the study's storage URL instead (sqlite:///..., "
                                          "postgresql://..., journal:PATH)")
    parser.add_argument("--study-name", help="which study (default: the sweep's, or the only "
                                             "plan-parallel study in the storage)")
    parser.add_argument("--calibration", help="calibration to start from and compare with "
                                              "(default: the shipped one)")
    parser.add_argument("--output", "-o", help="file to write (default: SWEEP_DIR/"
                                               "calibration.json, else ./calibration.json)")


def _locate(args):
    """(storage spec, study name or None) from the arguments and sweep.json."""
    import json
    from pathlib import Path

    from planner.errors import PlanInputError
    from trials.storage import resolve_storage

    if args.storage:
        return resolve_storage(args.storage, Path(".")), args.study_name
    if not args.sweep_dir:
        raise PlanInputError("calibrate needs a SWEEP_DIR or --storage URL")
    sweep = Path(args.sweep_dir)
    from trials.study import SWEEP_FILE

    info_path = sweep / SWEEP_FILE
    if not info_path.is_file():
        raise PlanInputError(f"{sweep} is not a plan-parallel sweep directory (no {SWEEP_FILE})")
    try:
        info = json.loads(info_path.read_text())
        storage, name = info["storage"], info["study_name"]
    except (ValueError, KeyError) as error:
        raise PlanInputError(f"cannot read {info_path}: {error}") from None
    if "***" in storage:
        raise PlanInputError(f"the sweep's study lives in {storage}; pass --storage with its "
                             f"password")
    return resolve_storage(storage, sweep), args.study_name or name


def open_study(args):
    """The plan-parallel study that ``args`` (sweep_dir / storage / study_name) point at, and
    its storage spec."""
    from pathlib import Path

    import optuna

    from planner.errors import PlanInputError
    from trials import study_state
    from trials.storage import open_storage

    spec, name = _locate(args)
    if spec.is_local_file and not Path(spec.url.split(":///", 1)[-1]).exists():
        raise PlanInputError(f"no study storage at {spec.display}")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(spec, heartbeat_interval=None, grace_period=None)
    if name is None:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)
                 if study_state.STUDY in s.user_attrs]
        if len(names) != 1:
            raise PlanInputError(f"{spec.display} holds {len(names)} plan-parallel studies "
                                 f"({', '.join(names) or 'none'}); pass --study-name")
        name = names[0]
    try:
        return optuna.load_study(study_name=name, storage=storage), spec
    except KeyError:
        raise PlanInputError(f"no study {name!r} in {spec.display}") from None


def run(args) -> int:
    from pathlib import Path

    from planner.timing import read_calibration
    from trials.calibrate import calibrate_study, write_calibration

    study, spec = open_study(args)
    name = study.study_name
    initial = read_calibration(Path(args.calibration)) if args.calibration else None
    result = calibrate_study(study, initial, source=f"plan-parallel calibrate: study {name} "
                                                    f"({spec.display})")
    output = Path(args.output) if args.output else (
        Path(args.sweep_dir) / "calibration.json" if args.sweep_dir else Path("calibration.json"))
    write_calibration(result.calibration, output)
    start = args.calibration or "the shipped calibration"
    print(f"study {name}: {result.measurements} successful trials")
    print(f"prediction error (MAPE of tokens/s/GPU): {result.mape_before:.1%} with {start} -> "
          f"{result.mape_after:.1%} fitted")
    print(f"wrote {output}; use it with: plan-parallel ... --calibration {output}",
          file=sys.stderr)
    return 0
