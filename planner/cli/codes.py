"""Exit codes of every ``plan-parallel`` command (documented once, in docs/security.md)."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0  # answered
    NO = 1  # the answer is "no": an invalid layout, no layout fits, a job that would not launch
    USAGE = 2  # bad input: unknown model or GPU, malformed file, contradictory flags, an extra
    #            that is not installed, a resource bound that tripped
    BROKEN_PIPE = 141  # stdout closed early (`| head`): 128 + SIGPIPE, as Unix tools end
    INTERRUPTED = 130  # Ctrl-C / SIGTERM: 128 + SIGINT


FAILED = ExitCode.NO  # the name earlier code used
