"""Where a study lives: SQLite in the sweep directory, any SQLAlchemy URL, or a journal file.

* no ``--storage``: ``sqlite:///<sweep dir>/study.db``;
* ``sqlite:///path``, ``postgresql://user:pass@host/db``, ``mysql+pymysql://...``: Optuna's
  ``RDBStorage`` (PostgreSQL or MySQL for several tuner processes on several nodes);
* ``journal:PATH``: Optuna's journal file storage (an append-only log; NFS-safe locks).

Every storage gets heartbeats: a tuner records one per running trial every
``heartbeat_interval`` seconds, and any tuner that finds a RUNNING trial whose heartbeat is
older than ``grace_period`` marks it failed and calls ``stale_callback`` (stop what it left
running, enqueue it again); a trial with no heartbeat yet counts its start as its last one.
Optuna implements heartbeats for ``RDBStorage`` (HeartbeatRDBStorage adds the start-time
rule); for the journal, :class:`HeartbeatJournalStorage` records the heartbeat as a trial
system attribute.

Passwords in URLs are never printed: :func:`mask_url` (SQLAlchemy's own URL parser, so a
password holding ``/``, ``?`` or ``@`` is found whole, and ``?password=`` too) is applied to
every message, and the storage's own secrets are blanked wherever they appear.  The URL with
its password need not be on the command line (which ``ps`` shows): ``$PLAN_PARALLEL_STORAGE``
holds it, or ``--storage-password-file`` holds the password; neither reaches a trainer's
environment (:data:`SECRET_ENV`).
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
_URL_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")
_RAW_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:(?P<password>.*)@[^@]*$")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:password|passwd|pwd|sslpassword|secret|token|"
                           r"access_token|api_key)=)[^&#\s]*")
STORAGE_ENV = "PLAN_PARALLEL_STORAGE"  # the storage URL, with its password, out of argv
SECRET_ENV = (STORAGE_ENV,)  # never passed on to a trainer unless --trial-env sets it
HEARTBEAT_ATTR = "plan_parallel:heartbeat"
# Tuners starting together on a new database race to create Optuna's tables; the loser retries.
SCHEMA_RACE = re.compile(r"UNIQUE constraint failed|already exists|duplicate key|"
                         r"database is locked|UniqueViolation")
SCHEMA_ATTEMPTS = 5


def _mask_one(url: str) -> str:
    if url.lower().startswith("sqlite"):
        return url  # a file path: no password, and SQLAlchemy would re-encode it
    raw = _RAW_PASSWORD.match(url)
    if raw and raw.group("password"):  # everything between "user:" and the last "@"
        masked = url[:raw.start("password")] + "***" + url[raw.end("password"):]
    else:
        masked = None
        try:
            from sqlalchemy.engine import make_url

            parsed = make_url(url)
            if parsed.password is not None:
                masked = parsed.render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads (or no SQLAlchemy)
            masked = None
        if masked is None:
            masked = _PASSWORD.sub(lambda m: f"{m.group('head')}***@", url)
    return _SECRET_QUERY.sub(lambda m: f"{m.group(1)}***", masked)


def mask_url(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` with the password of every URL in it (user:PASSWORD@, ``?password=``)
    replaced by ``***``, and every string of ``secrets`` too."""
    text = _URL_TOKEN.sub(lambda m: _mask_one(m.group(0)), str(text))
    for secret in secrets:
        if secret and len(secret) >= 3:
            text = text.replace(secret, "***")
    return text


def url_secrets(url: str) -> tuple[str, ...]:
    """The secrets a storage URL holds: its password (as SQLAlchemy parses it and as written)
    and secret query values."""
    found = []
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        if parsed.password:
            found.append(str(parsed.password))
        for key, value in parsed.query.items():
            if _SECRET_QUERY.match(f"?{key}="):
                found.extend([value] if isinstance(value, str) else list(value))
    except Exception:  # noqa: BLE001
        pass
    raw = _RAW_PASSWORD.match(url)
    if raw and raw.group("password"):
        found.append(raw.group("password"))
    return tuple(dict.fromkeys(found))


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` set (SQLAlchemy quotes it: any character is safe)."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception as error:  # noqa: BLE001
        raise PlanInputError(f"--storage {mask_url(url)!r} is not a SQLAlchemy URL: "
                             f"{mask_url(str(error))[:160]}") from None
    return parsed.set(password=password).render_as_string(hide_password=False)


def read_password_file(path: str) -> str:
    """The first line of ``path`` (a password file), without its line end."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise PlanInputError(f"--storage-password-file {path}: cannot read it "
                             f"({getattr(error, 'strerror', None) or error})") from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise PlanInputError(f"--storage-password-file {path} is empty")
    return password


@dataclass(frozen=True)
class StorageSpec:
    kind: str  # "rdb" or "journal"
    url: str  # the SQLAlchemy URL, or the journal file path
    display: str  # for people: the URL without its password
    secrets: tuple[str, ...] = ()  # the URL's password (and secret query values)

    def mask(self, text: str) -> str:
        return mask_url(text, self.secrets)

    def __repr__(self) -> str:  # never the URL: a repr ends up in tracebacks and logs
        return f"StorageSpec(kind={self.kind!r}, display={self.display!r})"

    @property
    def is_local_file(self) -> bool:
        return self.kind == "journal" or self.url.startswith("sqlite:")


def resolve_storage(url: str | None, sweep_dir: Path, password: str | None = None
                    ) -> StorageSpec:
    """Parse ``--storage`` (None: ``$PLAN_PARALLEL_STORAGE``, else SQLite in the sweep
    directory); ``password`` (from ``--storage-password-file``) is set into the URL."""
    import os

    url = url or os.environ.get(STORAGE_ENV) or None
    if password is not None and (not url or url.startswith(JOURNAL_PREFIX)
                                 or url.startswith("sqlite")):
        raise PlanInputError("--storage-password-file needs a database --storage URL "
                             "(postgresql://user@host/db, mysql+pymysql://...)")
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
    if password is not None:
        url = with_password(url, password)
    secrets = url_secrets(url)
    return StorageSpec("rdb", url, mask_url(url, secrets), secrets)


def storage_error(error: BaseException) -> str:
    """The cause of a storage failure, one line: the innermost exception's message (the
    driver's "file is not a database", "Connection refused"), not the wrapper Optuna raises
    from it ("An exception is raised during the commit...")."""
    chain, inner = [error], error
    while len(chain) < 20:
        inner = inner.__cause__ or (None if inner.__suppress_context__ else inner.__context__)
        if inner is None:
            break
        chain.append(inner)
    for candidate in reversed(chain):
        text = str(candidate).strip()
        if text:
            return text.splitlines()[0]
    return type(error).__name__


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


def _rdb_class():
    from datetime import datetime, timedelta

    from optuna.storages import RDBStorage
    from optuna.trial import TrialState

    class HeartbeatRDBStorage(RDBStorage):
        """Optuna's RDBStorage, where a RUNNING trial with no heartbeat yet (its tuner died
        between creating it and the first beat) counts its start time as its last heartbeat,
        as :class:`HeartbeatJournalStorage` does; Optuna's own skips such a trial for good."""

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            stale = list(super()._get_stale_trial_ids(study_id))
            grace = timedelta(seconds=self.grace_period if self.grace_period is not None
                              else 2 * (self.heartbeat_interval or 0))
            beating = self._trials_with_heartbeat(study_id)
            now = datetime.now()  # the clock Optuna stamps datetime_start with
            for trial in self.get_all_trials(study_id, deepcopy=False,
                                             states=(TrialState.RUNNING,)):
                if (trial._trial_id not in beating and trial._trial_id not in stale
                        and trial.datetime_start is not None
                        and now - trial.datetime_start > grace):
                    stale.append(trial._trial_id)
            return stale

        def _trials_with_heartbeat(self, study_id: int) -> set[int]:
            from optuna.storages._rdb import models
            from optuna.storages._rdb.storage import _create_scoped_session

            with _create_scoped_session(self.scoped_session) as session:
                rows = (session.query(models.TrialHeartbeatModel.trial_id)
                        .join(models.TrialModel)
                        .filter(models.TrialModel.study_id == study_id).all())
            return {row[0] for row in rows}

    return HeartbeatRDBStorage


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
    storage_class = _rdb_class()

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
            return storage_class(spec.url, engine_kwargs=engine_kwargs,
                                 heartbeat_interval=heartbeat_interval,
                                 grace_period=grace_period,
                                 heartbeat_stale_trial_callback=stale_callback)
        except Exception as error:  # driver missing, server down, bad credentials, bad URL
            text = f"{error} {storage_error(error)}"
            if attempt + 1 < SCHEMA_ATTEMPTS and SCHEMA_RACE.search(text):
                # another tuner is creating the same tables right now: its schema will do
                time.sleep(random.uniform(0.2, 1.0))
                continue
            raise PlanInputError(f"cannot open storage {spec.display}: "
                                 f"{spec.mask(storage_error(error))}") from None


def open_storage_read_only(spec: StorageSpec) -> Any:
    """The storage for reading only (``report``, ``calibrate``): SQLite opens with
    ``mode=ro``, no table is created and no schema upgraded, and a file that does not exist is
    an error, never created."""
    from optuna.storages import RDBStorage

    if spec.is_local_file:
        path = Path(spec.url if spec.kind == "journal" else spec.url.split(":///", 1)[-1])
        if not path.is_file():
            raise PlanInputError(f"no study storage at {spec.display}")
        if path.stat().st_size == 0:
            raise PlanInputError(f"cannot read study storage {spec.display}: the file is empty "
                                 f"(not a study database or journal)")
    if spec.kind == "journal":
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        try:  # the log is replayed here: a line that is not UTF-8 JSON fails at once
            return JournalStorage(JournalFileBackend(spec.url))
        except (UnicodeDecodeError, ValueError) as error:
            raise PlanInputError(f"cannot read study storage {spec.display}: not an Optuna "
                                 f"journal ({type(error).__name__}: "
                                 f"{storage_error(error)[:120]})") from None
    url = spec.url
    if url.startswith("sqlite:///"):
        url = f"sqlite:///file:{url.split(':///', 1)[1]}?mode=ro&uri=true"
    try:
        return RDBStorage(url, skip_table_creation=True)
    except Exception as error:  # a file that is not a study database, a server down, ...
        raise PlanInputError(f"cannot read study storage {spec.display}: "
                             f"{spec.mask(storage_error(error))}") from None
