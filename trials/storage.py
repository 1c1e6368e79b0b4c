"""Where a study lives: SQLite in the sweep directory, any SQLAlchemy URL, or a journal file.

* no ``--storage``: ``sqlite:///<sweep dir>/study.db``;
* ``sqlite:///path``, ``postgresql://user:pass@host/db``, ``mysql+pymysql://...``: Optuna's
  ``RDBStorage`` (PostgreSQL or MySQL for several tuner processes on several nodes);
* ``journal:PATH``: Optuna's journal file storage (an append-only log; NFS-safe locks).

Every storage gets heartbeats: a tuner records one per running trial every
``heartbeat_interval`` seconds, and any tuner that finds a RUNNING trial whose heartbeat is
older than ``grace_period`` marks it failed and calls ``stale_callback`` (stop what it left
running, enqueue it again).  Optuna implements this for ``RDBStorage``; for the journal,
:class:`HeartbeatJournalStorage` records the heartbeat as a trial system attribute.

Passwords in URLs are never printed: :func:`mask_url` is applied to every message.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from planner.errors import PlanInputError

DEFAULT_FILE = "study.db"
JOURNAL_PREFIX = "journal:"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*:)(?P<password>[^@/\s]*)@")
STORAGE_ENV = "PLAN_PARALLEL_STORAGE"  # the storage URL, with its password, out of argv
SECRET_ENV = (STORAGE_ENV,)  # never passed on to a trainer unless --trial-env sets it
HEARTBEAT_ATTR = "plan_parallel:heartbeat"
# Tuners starting together on a new database race to create Optuna's tables; the loser retries.
SCHEMA_RACE = re.compile(r"UNIQUE constraint failed|already exists|duplicate key|"
                         r"database is locked|UniqueViolation")
SCHEMA_ATTEMPTS = 5


def mask_url(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _PASSWORD.sub(lambda m: f"{m.group('head')}***@", str(text))


@dataclass(frozen=True)
class StorageSpec:
    kind: str  # "rdb" or "journal"
    url: str  # the SQLAlchemy URL, or the journal file path
    display: str  # for people: the URL without its password

    @property
    def is_local_file(self) -> bool:
        return self.kind == "journal" or self.url.startswith("sqlite:")


def resolve_storage(url: str | None, sweep_dir: Path) -> StorageSpec:
    """Parse ``--storage`` (None: SQLite in the sweep directory)."""
    if not url:
        path = (Path(sweep_dir) / DEFAULT_FILE).resolve()
        return StorageSpec("rdb", f"sqlite:///{path}", f"sqlite:///{path}")
    if url.startswith(JOURNAL_PREFIX):
        path = url[len(JOURNAL_PREFIX):]
        path = path[2:] if path.startswith("//") else path  # journal:///abs/path too
        if not path:
            raise PlanInputError("--storage journal:PATH needs a file path")
        resolved = str(Path(path).expanduser().resolve())
        return StorageSpec("journal", resolved, f"journal:{resolved}")
    if not _URL.match(url):
        raise PlanInputError(f"--storage {mask_url(url)!r} is not a storage URL; expected a "
                             f"SQLAlchemy URL (sqlite:///study.db, postgresql://user@host/db) "
                             f"or journal:PATH")
    return StorageSpec("rdb", url, mask_url(url))


def _heartbeat_base():
    from optuna.storages._heartbeat import BaseHeartbeat  # the interface RDBStorage implements

    return BaseHeartbeat


def _journal_class():
    from optuna.storages import JournalStorage
    from optuna.trial import TrialState

    class HeartbeatJournalStorage(JournalStorage, _heartbeat_base()):
        """Journal storage with Optuna's heartbeat interface (RDBStorage has it built in):
        the heartbeat is a system attribute holding the wall-clock time; a RUNNING trial
        whose last heartbeat (or start) is older than ``grace_period`` is stale."""

        def __init__(self, backend, heartbeat_interval: int, grace_period: int,
                     stale_callback: Callable | None):
            super().__init__(backend)
            self._heartbeat_interval = heartbeat_interval
            self._grace_period = grace_period
            self._stale_callback = stale_callback

        def record_heartbeat(self, trial_id: int) -> None:
            self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            now = time.time()
            stale = []
            for trial in self.get_all_trials(study_id, deepcopy=False,
                                             states=(TrialState.RUNNING,)):
                beat = trial.system_attrs.get(HEARTBEAT_ATTR)
                if beat is None and trial.datetime_start is not None:
                    beat = trial.datetime_start.timestamp()
                if beat is not None and now - float(beat) > self._grace_period:
                    stale.append(trial._trial_id)
            return stale

        def get_heartbeat_interval(self) -> int | None:
            return self._heartbeat_interval

        def get_heartbeat_stale_trial_callback(self):
            return self._stale_callback

    return HeartbeatJournalStorage


def open_storage(spec: StorageSpec, *, heartbeat_interval: int, grace_period: int,
                 stale_callback: Callable | None = None) -> Any:
    """An Optuna storage with heartbeats; unreachable databases are a one-line input error."""
    import warnings

    from optuna.exceptions import ExperimentalWarning

    warnings.filterwarnings("ignore", category=ExperimentalWarning)
    if spec.kind == "journal":
        from optuna.storages.journal import JournalFileBackend

        Path(spec.url).parent.mkdir(parents=True, exist_ok=True)
        return _journal_class()(JournalFileBackend(spec.url), heartbeat_interval,
                                grace_period, stale_callback)
    from optuna.storages import RDBStorage

    engine_kwargs = {}
    if spec.url.startswith("sqlite:"):
        path = spec.url.split(":///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # several tuners on one SQLite file: wait for the write lock instead of failing
        engine_kwargs = {"connect_args": {"timeout": 60}}
    else:
        engine_kwargs = {"pool_pre_ping": True}
    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            return RDBStorage(spec.url, engine_kwargs=engine_kwargs,
                              heartbeat_interval=heartbeat_interval, grace_period=grace_period,
                              heartbeat_stale_trial_callback=stale_callback)
        except Exception as error:  # driver missing, server down, bad credentials, bad URL
            text = str(error).strip()
            if attempt + 1 < SCHEMA_ATTEMPTS and SCHEMA_RACE.search(text):
                # another tuner is creating the same tables right now: its schema will do
                time.sleep(random.uniform(0.2, 1.0))
                continue
            message = text.splitlines()[0] if text else type(error).__name__
            raise PlanInputError(f"cannot open storage {spec.display}: "
                                 f"{mask_url(message)}") from None


def open_storage_read_only(spec: StorageSpec) -> Any:
    """The storage for reading only (``report``, ``calibrate``): SQLite opens with
    ``mode=ro``, no table is created and no schema upgraded, and a file that does not exist is
    an error, never created."""
    from optuna.storages import RDBStorage

    if spec.is_local_file:
        path = Path(spec.url if spec.kind == "journal" else spec.url.split(":///", 1)[-1])
        if not path.is_file():
            raise PlanInputError(f"no study storage at {spec.display}")
    if spec.kind == "journal":
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        return JournalStorage(JournalFileBackend(spec.url))
    url = spec.url
    if url.startswith("sqlite:///"):
        url = f"sqlite:///file:{url.split(':///', 1)[1]}?mode=ro&uri=true"
    try:
        return RDBStorage(url, skip_table_creation=True)
    except Exception as error:  # a file that is not a study database, a server down, ...
        text = str(error).strip()
        message = text.splitlines()[0] if text else type(error).__name__
        raise PlanInputError(f"cannot read study storage {spec.display}: "
                             f"{mask_url(message)}") from None
