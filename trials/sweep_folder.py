"""Reading a sweep: the study a ``plan-parallel tune`` sweep folder (or a storage URL) holds,
and the model, cluster and workload it tuned.  Read only: nothing is created or changed.

This is the API ``plan-parallel report`` and ``calibrate`` read sweeps through.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from planner.bounds import CLUSTER_LIMITS, MAX_JSON_BYTES, check_fields, load_json
from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import ModelSpec
from planner.catalog.workload import GrpoWorkload
from planner.errors import PlanInputError
from trials import study_state
from trials.storage import StorageSpec, open_storage_read_only, resolve_storage, storage_error

if TYPE_CHECKING:
    from optuna import Study

SWEEP_FILE = "sweep.json"  # a tuner writes it in its sweep folder: storage and study name


def locate(storage: str | None, sweep_dir: str | Path | None,
           study_name: str | None) -> tuple[StorageSpec, str | None]:
    """(storage spec, study name or None) from a storage URL or a sweep folder's sweep.json."""
    if storage:
        return resolve_storage(storage, Path(".")), study_name
    if not sweep_dir:
        raise PlanInputError("give a SWEEP_DIR or --storage URL")
    sweep = Path(sweep_dir)
    info_path = sweep / SWEEP_FILE
    if not info_path.is_file():
        raise PlanInputError(f"{sweep} is not a plan-parallel sweep directory (no "
                             f"{SWEEP_FILE})")
    info = read_json(info_path)
    url, name = info.get("storage"), info.get("study_name")
    if not isinstance(url, str) or not isinstance(name, str):
        raise PlanInputError(f"{info_path} lacks a 'storage' and a 'study_name' string; not a "
                             f"plan-parallel sweep.json")
    if "***" in url:
        import os

        from trials.storage import STORAGE_ENV

        if os.environ.get(STORAGE_ENV):
            return resolve_storage(os.environ[STORAGE_ENV], sweep), study_name or name
        raise PlanInputError(f"the sweep's study lives in {url}; pass --storage with its "
                             f"password (or set PLAN_PARALLEL_STORAGE)")
    return resolve_storage(url, sweep), study_name or name


def read_json(path: Path, limit_bytes: int = MAX_JSON_BYTES) -> dict:
    """A JSON object from a sweep folder, with its size and nesting bounded before parsing."""
    return load_json(path, "sweep file", limit_bytes)


def open_study(storage: str | None = None, sweep_dir: str | Path | None = None,
               study_name: str | None = None) -> tuple["Study", StorageSpec]:
    """The plan-parallel study a storage URL or sweep folder points at, opened read-only."""
    import optuna

    spec, name = locate(storage, sweep_dir, study_name)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    backend = open_storage_read_only(spec)
    try:
        summaries = optuna.get_all_study_summaries(backend)
    except Exception as error:  # noqa: BLE001 - not an Optuna database, or a broken one
        raise PlanInputError(f"cannot read the studies in {spec.display}: "
                             f"{spec.mask(storage_error(error))[:200]}") from None
    names = [s.study_name for s in summaries if study_state.STUDY in s.user_attrs]
    if name is None:
        if len(names) != 1:
            raise PlanInputError(f"{spec.display} holds {len(names)} plan-parallel studies "
                                 f"({', '.join(names) or 'none'}); pass --study-name")
        name = names[0]
    try:
        return optuna.load_study(study_name=name, storage=backend), spec
    except KeyError:
        raise PlanInputError(f"no study {name!r} in {spec.display}") from None


def confidence_statement(sweep: Path) -> str | None:
    """What a tuned sweep folder says about untried layouts (:mod:`trials.confidence`): from
    the ``tuned.json`` of a ``--write`` folder, else from the study its ``sweep.json`` names;
    None when the study has not said (no success yet, or a study from an older version)."""
    from trials.study_outputs import TUNED_FILE

    sweep = Path(sweep)
    if (sweep / TUNED_FILE).is_file():
        data = read_json(sweep / TUNED_FILE).get(study_state.CONFIDENCE)
    elif (sweep / SWEEP_FILE).is_file():
        study, _ = open_study(sweep_dir=sweep)
        data = study.user_attrs.get(study_state.CONFIDENCE)
    else:
        return None
    statement = data.get("statement") if isinstance(data, dict) else None
    return statement if isinstance(statement, str) else None


def study_setting(study: "Study") -> tuple[ModelSpec, ClusterSpec, GrpoWorkload]:
    """The model, cluster and workload a plan-parallel study tuned (its user attributes)."""
    info = study.user_attrs.get(study_state.STUDY)
    if not isinstance(info, dict):
        raise PlanInputError(f"study {study.study_name!r} was not made by plan-parallel tune")
    try:
        spec_fields = ModelSpec.__dataclass_fields__
        counts = {name: (0, 1 << 24) for name, field in spec_fields.items()
                  if field.type in ("int", int)}
        check_fields(f"study {study.study_name!r}: model", info["model"], counts)
        check_fields(f"study {study.study_name!r}: cluster", info["cluster"], CLUSTER_LIMITS)
        model = ModelSpec(**info["model"])
        cluster = info["cluster"]
        cluster = ClusterSpec(get_gpu(cluster["gpu_type"]), int(cluster["num_gpus"]),
                              int(cluster["gpus_per_node"]))
        names = set(GrpoWorkload.__dataclass_fields__)
        workload = GrpoWorkload(**{k: v for k, v in info["workload"].items() if k in names})
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise PlanInputError(f"study {study.study_name!r}: its plan-parallel settings cannot be "
                             f"read ({str(error)[:200]})") from None
    return model, cluster, workload
