"""``plan-parallel``: parse, dispatch, and map errors to exit codes -- the only place that does.

Data goes to stdout (tables, JSON, CSV), messages to stderr.  Handler modules are imported when
their command runs, so ``plan-parallel --help`` starts at once (only argparse loads).
"""

from __future__ import annotations

import importlib
import os
import sys
from contextlib import contextmanager
from typing import Iterator, Sequence

from planner.cli import notes
from planner.cli.args import SUBCOMMANDS, build_parser, trailing_inputs
from planner.cli.codes import ExitCode
from planner.cli.heap import keep_freed_heap
from planner.errors import InvalidLayoutError, NoFitError, PlanInputError
from planner.extras import missing_extra

# command -> (module, handler) under planner.cli
HANDLERS = {
    "plan": ("commands", "cmd_plan"),
    "estimate": ("commands", "cmd_estimate"),
    "models": ("commands", "cmd_models"),
    "gpus": ("commands", "cmd_gpus"),
    "validate": ("diagnose", "cmd_validate"),
    "fix": ("diagnose", "cmd_fix"),
    "diff": ("diagnose", "cmd_diff"),
    "explain": ("diagnose", "cmd_explain"),
    "profile": ("diagnose", "cmd_profile"),
    "report": ("report", "cmd_report"),
    "tune": ("tune", "cmd_tune"),
    "calibrate": ("calibrate", "cmd_calibrate"),
    "doctor": ("doctor", "cmd_doctor"),
    "advise": ("advise", "cmd_advise"),
}
assert set(HANDLERS) == set(SUBCOMMANDS)


# Commands whose modules load numpy's BLAS with one thread (:func:`_blas_threads`): every one
# but those that solve or fit -- ``tune`` (its guided sampler, trials.guided, factorises with
# numpy.linalg), ``calibrate`` and ``advise`` (scipy's least_squares) -- which keep OpenBLAS's
# own threading.
ONE_BLAS_THREAD = frozenset(SUBCOMMANDS) - {"tune", "calibrate", "advise"}


@contextmanager
def _blas_threads(one: bool) -> Iterator[None]:
    """While a command's modules import: numpy's OpenBLAS loads with one thread when ``one``.

    OpenBLAS starts a thread per core when numpy loads (about 45 ms of CPU on the 2-core
    development machine, a third of numpy's import, and more of wall under load), and the
    planner's plans call no BLAS routine (no matmul, no ``numpy.linalg``): their answers are
    the same with one thread.  OpenBLAS reads ``OPENBLAS_NUM_THREADS`` once, as it loads, so the
    variable is set for the import alone and removed after: the processes a command starts
    (verl, the trials) inherit the user's environment.  A user's own setting is left alone."""
    if not one or "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)


def _error(message: str) -> None:
    text = " ".join(str(message).split()) or "error"
    if len(text) > 2000:
        text = text[:2000] + " ..."
    print(f"plan-parallel: error: {text}", file=sys.stderr)


def _unknown_command(word: str) -> str:
    """The one-line error for a first word that is neither a command nor an option."""
    import difflib

    close = difflib.get_close_matches(word, SUBCOMMANDS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"unknown command {word!r}{hint}; valid: {', '.join(SUBCOMMANDS)}, "
            "or options alone for `plan` (plan-parallel --model qwen3-30b --gpus 16)")


def _quiet_stdout() -> None:
    """After a broken pipe: send what Python still flushes at exit to /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "help":  # `plan-parallel help [COMMAND]`, as git and pip take it
        word = argv[1] if argv[1:2] and not argv[1].startswith("-") else "help"
        argv = (["--help"] if word == "help" else [word, "--help"] if word in SUBCOMMANDS
                else [word])  # a mistyped command: refused by name below
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        _error(_unknown_command(argv[0]))  # `plan-parallel plna ...`: a command, mistyped
        return ExitCode.USAGE
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        argv.insert(0, "plan")  # `plan-parallel --model ... --gpus ...`
    if not argv:
        argv = ["--help"]
    notes.drop()
    try:
        # a command's own parser alone (argv starts with a command, or with --help: all)
        args, extra = build_parser(argv[0] if argv[0] in SUBCOMMANDS else None
                                   ).parse_known_args(argv)
        if extra:
            trailing_inputs(args, extra)
        if args.command is None:
            build_parser().print_help()
            return ExitCode.USAGE
        module, name = HANDLERS[args.command]
        if args.command in ONE_BLAS_THREAD:
            keep_freed_heap()  # a planning command's chunks reuse the heap (planner.cli.heap)
        try:
            with _blas_threads(args.command in ONE_BLAS_THREAD):
                if hasattr(args, "mode") and args.mode is None:  # no --mode: the baseline
                    from planner.modes import baseline_name

                    args.mode = baseline_name()
                handler = getattr(importlib.import_module(f"planner.cli.{module}"), name)
            code = int(handler(args))
        except ModuleNotFoundError as error:
            missing = missing_extra(error, f"`plan-parallel {args.command}`")
            if missing is None:
                raise
            raise missing from None
        sys.stdout.flush()
        notes.flush()  # the assumptions the answer rests on, after it (errors drop them)
        return code
    except PlanInputError as error:
        _error(error)
        return ExitCode.USAGE
    except (InvalidLayoutError, NoFitError) as error:
        _error(error)
        return ExitCode.NO
    except KeyboardInterrupt:
        print("plan-parallel: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return ExitCode.BROKEN_PIPE
    except RecursionError:
        _error("input nested too deeply to read")
        return ExitCode.USAGE


def entry_point() -> None:
    sys.exit(main())
