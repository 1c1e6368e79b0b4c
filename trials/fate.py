"""Run a command that dies with the tuner: ``python fate.py PARENT_PID -- COMMAND ...``.

The local launcher starts trials through this file (standard library only, so it starts in
milliseconds).  On Linux it asks the kernel to SIGKILL the process when its parent dies
(``PR_SET_PDEATHSIG``, kept across ``exec``), checks the parent is still the tuner (it may have
died before the request), then replaces itself with the command — same pid, same process group.
A tuner killed with ``kill -9`` so cannot leave a trainer running on to finish a trial nobody
records; what the trainer spawned in its process group is stopped by the next tuner
(:meth:`trials.launchers.local.LocalLauncher.abandon`).  Elsewhere it just runs the command.
"""

import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main(argv: list) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: fate.py PARENT_PID -- COMMAND [ARG ...]")
    parent, command = int(argv[0]), argv[2:]
    die_with_parent()
    if os.getppid() != parent:  # the tuner died before the request took effect
        sys.exit(1)
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"cannot run {command[0]!r}: {error}", file=sys.stderr, flush=True)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
