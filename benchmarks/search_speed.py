"""How long the planner's first answers take, as a user runs them: wall time, CPU time and peak
memory of each of issue 24's commands, each also as a ratio to a bare ``python -c pass`` start.

    python benchmarks/search_speed.py [--repeat 3] [--only deepseek] [--baseline PYTHON]

Every command runs ``python -m planner ...`` in a fresh process (imports included, as a user
sees it) with ``PLAN_PARALLEL_NO_NVML=1`` (no GPU probe); the figures are the median of
``--repeat`` runs, taken from the child's resource usage (``os.wait4``): wall seconds, user +
system CPU seconds, peak resident set (MB).  The machine may be shared: CPU time is the steadier
signal, and the ratio to a bare interpreter start puts the figures in that machine's units.
``--baseline`` also times another interpreter -- another checkout's ``.venv/bin/python``, run
from outside any checkout so that it imports the ``planner`` installed in its environment -- its
runs alternating with this one's (the load of a shared machine then weighs on both alike), and
prints its figures under each command's.

Before timing, each interpreter's ``planner`` and ``trials`` are compiled to bytecode
(``compileall``), as an installed copy has them: with ``PYTHONDONTWRITEBYTECODE=1`` (set on
the development machine) every run would otherwise compile the sources again, about 0.2 s of
CPU no user spends after the first start.  ``--no-compile`` times it as it is.

Targets (issue 24, a 2-core machine): DeepSeek-V3 x 1024 <= 1 s, Qwen3-30B x 16 <= 0.5 s,
``--mode best`` on 128 H20 <= 3 s, the 48-count sizing sweep <= 2 s, peak RSS <= 600 MB each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

DAPO = ("--train-batch-size 512 --rollout-n 16 --prompt-length 2048 --response-length 8192 "
        "--mini-batch-size 32")
# (label, arguments after ``python -m planner``, target wall seconds or None)
COMMANDS = (
    ("deepseek-v3 x 1024", "--model deepseek-v3 --gpus 1024 --gpu-type h100", 1.0),
    ("deepseek-v3 x 256", "--model deepseek-v3 --gpus 256 --gpu-type h100", None),
    ("qwen3-235b x 64", "--model qwen3-235b --gpus 64 --gpu-type h100", None),
    ("qwen3-30b x 16", "--model qwen3-30b --gpus 16 --gpu-type h100", 0.5),
    ("qwen3-30b x 128 h20 best", f"--model qwen3-30b --gpus 128 --gpu-type h20 {DAPO} "
                                 "--mode best", 3.0),
    ("sizing 8-128 x 3 types", f"--model qwen3-30b --gpus 8-128 --gpu-type h100,h200,h20 {DAPO}",
     2.0),
)
RSS_TARGET_MB = 600


def measure(argv: list[str], cwd: str | None = None) -> tuple[float, float, float]:
    """Wall s, user+sys CPU s and peak RSS MB of one run of ``argv`` (in ``cwd``)."""
    env = {**os.environ, "PLAN_PARALLEL_NO_NVML": "1"}
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                               start_new_session=True, cwd=cwd)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    error = process.stderr.read().decode() if process.stderr else ""
    if process.stderr:
        process.stderr.close()
    if process.returncode not in (0, 1):  # 1: nothing fits is an answer too
        raise SystemExit(f"{' '.join(argv)} exited {process.returncode}:\n{error}")
    # ru_maxrss is KiB on Linux
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def compile_sources(python: str, cwd: str | None = None) -> None:
    """Write the bytecode of the ``planner`` and ``trials`` that ``python`` imports (in
    ``cwd``), as ``pip install`` and a first start do; ``py_compile`` writes it whatever
    ``PYTHONDONTWRITEBYTECODE`` says."""
    code = ("import compileall, os, planner, trials\n"
            "for package in (planner, trials):\n"
            "    compileall.compile_dir(os.path.dirname(package.__file__), quiet=1)")
    subprocess.run([python, "-c", code], check=True, cwd=cwd)


def medians(runs: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    return tuple(statistics.median(run[i] for run in runs) for i in range(3))


def row(label: str, figures: tuple[float, float, float], bare: tuple[float, float, float],
        target: float | None) -> str:
    wall, cpu, rss = figures
    goal = f"<={target:g} s" if target else ""
    mark = " over" if (target and cpu > target) or rss > RSS_TARGET_MB else ""
    return (f"{label:<26} {wall:>7.2f} {wall / bare[0]:>7.0f} {cpu:>7.2f} "
            f"{cpu / max(bare[1], 1e-3):>7.0f} {rss:>7.0f} {goal:>8}{mark}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="run the commands whose label has this text")
    parser.add_argument("--baseline", metavar="PYTHON",
                        help="also time this interpreter (another checkout's .venv/bin/python), "
                             "its runs alternating with this one's")
    parser.add_argument("--no-compile", action="store_true",
                        help="time without compiling the sources to bytecode first")
    args = parser.parse_args()
    python = sys.executable
    outside = tempfile.gettempdir()  # where a baseline imports its own installed planner
    if not args.no_compile:
        compile_sources(python)
        if args.baseline:
            compile_sources(args.baseline, outside)
        print("bytecode: planner and trials compiled first (--no-compile: as they are)")
    bare = medians([measure([python, "-c", "pass"]) for _ in range(args.repeat)])
    print(f"bare `python -c pass`: {bare[0]:.3f} s wall, {bare[1]:.3f} s CPU, "
          f"{bare[2]:.0f} MB (median of {args.repeat})")
    print(f"{'command':<26} {'wall s':>7} {'x bare':>7} {'CPU s':>7} {'x bare':>7} "
          f"{'RSS MB':>7} {'target':>8}")
    for label, command, target in COMMANDS:
        if args.only and args.only not in label:
            continue
        mine, theirs = [], []
        for _ in range(args.repeat):
            mine.append(measure([python, "-m", "planner", *command.split()]))
            if args.baseline:
                theirs.append(measure([args.baseline, "-m", "planner", *command.split()],
                                      outside))
        print(row(label, medians(mine), bare, target))
        if args.baseline:
            print(row("  baseline", medians(theirs), bare, target))
    print(f"commands: python -m planner <args> with {DAPO!r} as the DAPO workload; "
          f"RSS target {RSS_TARGET_MB} MB")


if __name__ == "__main__":
    main()
