"""Start a command in its own process group, and stop it with everything it spawned.

A verl trainer is a tree: the driver, a local Ray cluster (GCS, raylet, workers), vLLM engine
processes.  The command runs as the leader of a new session (``start_new_session=True``), so
one ``killpg`` reaches the whole group; processes that left the group (Ray workers start their
own sessions) are remembered by :class:`ProcessTree` while the trial runs and stopped by pid.
The leader is reaped last, after the group is gone, so its pid (the group id) cannot be reused
while we still signal the group.  On Linux the tuner makes itself a *child subreaper*: a
process orphaned by the trainer (a daemon whose parent exited) is re-parented to the tuner
instead of init, so it is still found among the tuner's descendants when the trial ends.

A tuner killed with ``kill -9`` cannot clean up, so the next one must.  Three records let it
find what a dead tuner's trial left running, whatever session or group it moved to:

* the trial's process tree, written to the trial's ``processes.json`` as it changes (pids with
  start times, so a reused pid is never mistaken for one of ours; :meth:`ProcessTree.save`);
* a marker in the trial's environment (``PLAN_PARALLEL_TRIAL_ID``), which every descendant
  inherits -- a Ray worker or a double-forked daemon that left the session keeps it;
* where systemd runs a user manager, a transient scope unit per trial (``systemd-run --user
  --scope``): a cgroup holds every descendant, and stopping the unit stops them all.

:func:`leftovers` gathers the first two (and their descendants); :func:`stop_leftovers` stops
them and checks that they exited.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Iterable, Mapping, Sequence

TRIAL_MARK_ENV = "PLAN_PARALLEL_TRIAL_ID"
PROCESSES_FILE = "processes.json"


def start_group(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str],
                output: IO[bytes]) -> subprocess.Popen:
    """Run ``argv`` (a list, never a shell string) as the leader of a new session, stdout and
    stderr both into ``output``."""
    return subprocess.Popen(list(argv), cwd=str(cwd), env=dict(env), stdin=subprocess.DEVNULL,
                            stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def exit_status(pid: int) -> int | None:
    """The exit status of child ``pid`` (negative: killed by that signal) without reaping it;
    None while it runs."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return 0  # already reaped elsewhere
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


class ProcessTree:
    """Every process seen below ``root`` (and the root), remembered by pid and start time so a
    reused pid is never mistaken for one of ours.  With ``adopt``, descendants of this process
    (a subreaper: orphans are re-parented to it) started no earlier than the root count too."""

    def __init__(self, root: int, adopt: bool = False):
        import psutil

        self.root = root
        self.known: dict[int, float] = {}
        try:  # psutil's clock (boot time + ticks), comparable with other create_time()s only
            self.adopted_since = psutil.Process(root).create_time() if adopt else None
        except psutil.Error:
            self.adopted_since = None
        self.refresh()

    def refresh(self) -> None:
        import psutil

        found = []
        try:
            root = psutil.Process(self.root)
            found += [root, *root.children(recursive=True)]
        except psutil.Error:
            pass
        if self.adopted_since is not None:
            try:
                for process in psutil.Process().children(recursive=True):
                    try:
                        if process.create_time() >= self.adopted_since:
                            found.append(process)
                    except psutil.Error:
                        continue
            except psutil.Error:
                pass
        for process in found:
            try:
                self.known.setdefault(process.pid, process.create_time())
            except psutil.Error:
                continue

    def save(self, path: Path, marker: str = "") -> None:
        """Write what is known (``{"root", "marker", "processes": [[pid, start], ...]}``)
        to ``path`` atomically, for a later tuner to stop (:func:`leftovers`)."""
        path = Path(path)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"root": self.root, "marker": marker,
                                         "processes": sorted(self.known.items())}))
        os.replace(temporary, path)

    def alive(self, exclude_root: bool = True) -> list:
        """Known processes still running (zombies excluded)."""
        import psutil

        out = []
        for pid, created in self.known.items():
            if exclude_root and pid == self.root:
                continue
            try:
                process = psutil.Process(pid)
                if (abs(process.create_time() - created) < 0.01
                        and process.status() != psutil.STATUS_ZOMBIE):
                    out.append(process)
            except psutil.Error:
                continue
        return out

    def kill_all(self, grace_s: float) -> None:
        """SIGTERM every remembered process still running, SIGKILL after ``grace_s``; reap
        those that became this process's children (adopted orphans)."""
        kill_processes(self.alive(), grace_s)
        for pid in self.known:
            if pid == self.root:
                continue  # its Popen reaps it
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_group(process: subprocess.Popen, tree: ProcessTree, grace_s: float) -> int:
    """Stop the process group led by ``process`` and every process of ``tree``; reap the leader.

    SIGTERM first, SIGKILL after ``grace_s`` (at once if interrupted again); returns the
    leader's exit status.  A KeyboardInterrupt during the grace period shortens it but the
    group is still killed and reaped before the interrupt propagates.
    """
    pgid = process.pid
    interrupted = False
    tree.refresh()
    try:
        if exit_status(process.pid) is None or tree.alive():
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                if exit_status(process.pid) is not None and not tree.alive():
                    break
                time.sleep(0.05)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        _signal_group(pgid, signal.SIGKILL)
        code = process.wait()
        tree.kill_all(0 if interrupted else grace_s)
    if interrupted:
        raise KeyboardInterrupt
    return code


def group_members(pgid: int, not_before: float) -> list:
    """Running processes of process group ``pgid`` started no earlier than ``not_before``
    (the group's leader start time): what a killed tuner's trial left behind."""
    import psutil

    members = []
    for process in psutil.process_iter(["pid", "create_time"]):
        try:
            if (os.getpgid(process.pid) == pgid
                    and process.info["create_time"] >= not_before - 0.01
                    and process.status() != psutil.STATUS_ZOMBIE):
                members.append(process)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return members


def kill_processes(processes: list, grace_s: float) -> int:
    """Terminate, then kill after ``grace_s``; returns how many there were."""
    import psutil

    for process in processes:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, rest = psutil.wait_procs(processes, timeout=grace_s)
    for process in rest:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(rest, timeout=5)
    return len(processes)


def read_tree_file(path: Path) -> tuple[dict[int, float], str]:
    """(pid -> start time, marker) from a trial's ``processes.json``; empty when unreadable."""
    try:
        data = json.loads(Path(path).read_text())
        known = {int(pid): float(created) for pid, created in data.get("processes", [])}
        return known, str(data.get("marker", ""))
    except (OSError, ValueError, TypeError, AttributeError):
        return {}, ""


def leftovers(known: Mapping[int, float], marker: str = "",
              not_before: float = 0.0) -> list:
    """Running processes of a trial: those of ``known`` (pid -> start time, matched to 10 ms),
    those whose environment carries ``PLAN_PARALLEL_TRIAL_ID=marker``, and every descendant
    of them; started no earlier than ``not_before``.  Zombies and this process excluded."""
    import psutil

    found: dict[int, object] = {}
    for process in psutil.process_iter(["pid", "create_time"]):
        try:
            pid, created = process.info["pid"], process.info["create_time"]
            if pid == os.getpid() or created < not_before - 0.01:
                continue
            ours = pid in known and abs(known[pid] - created) < 0.01
            if not ours and marker:
                try:
                    ours = process.environ().get(TRIAL_MARK_ENV) == marker
                except (psutil.AccessDenied, psutil.ZombieProcess):
                    ours = False
            if ours and process.status() != psutil.STATUS_ZOMBIE:
                found[pid] = process
        except psutil.Error:
            continue
    for process in list(found.values()):
        try:
            for child in process.children(recursive=True):
                if child.pid != os.getpid() and child.status() != psutil.STATUS_ZOMBIE:
                    found.setdefault(child.pid, child)
        except psutil.Error:
            continue
    return list(found.values())


def stop_leftovers(processes: list, grace_s: float) -> tuple[int, list[int]]:
    """Stop ``processes`` (SIGTERM, SIGKILL after ``grace_s``), reap those that are our
    children, and check they are gone: (how many there were, pids still running)."""
    import psutil

    kill_processes(processes, grace_s)
    survivors = []
    for process in processes:
        try:
            os.waitpid(process.pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                survivors.append(process.pid)
        except psutil.Error:
            continue
    return len(processes), survivors


_SCOPE_USABLE: bool | None = None


def scope_available() -> bool:
    """Whether ``systemd-run --user --scope`` works here (a user manager runs): probed once."""
    global _SCOPE_USABLE
    if _SCOPE_USABLE is None:
        _SCOPE_USABLE = False
        if sys.platform.startswith("linux") and shutil.which("systemd-run") \
                and shutil.which("systemctl"):
            try:
                probe = subprocess.run(["systemd-run", "--user", "--scope", "--quiet",
                                        "--collect", "--", "true"], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       timeout=10)
                _SCOPE_USABLE = probe.returncode == 0
            except (OSError, subprocess.SubprocessError):
                _SCOPE_USABLE = False
    return _SCOPE_USABLE


def scope_prefix(unit: str) -> tuple[str, ...]:
    """The argv prefix that runs a command in its own transient scope unit ``unit`` (a cgroup;
    ``systemd-run --scope`` execs the command, so its pid stays our child's), or () where
    systemd's user manager is not available."""
    if not scope_available():
        return ()
    return ("systemd-run", "--user", "--scope", "--quiet", "--collect", f"--unit={unit}", "--")


def stop_scope(unit: str, timeout_s: float = 30.0) -> bool:
    """Kill every process of scope ``unit`` and stop it; False when systemd could not."""
    if not unit or not shutil.which("systemctl"):
        return False
    try:
        subprocess.run(["systemctl", "--user", "kill", "--signal=SIGKILL", unit],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=timeout_s)
        stop = subprocess.run(["systemctl", "--user", "stop", unit], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout_s)
        return stop.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def pids_of(processes: Iterable) -> list[int]:
    return sorted(process.pid for process in processes)
