"""Regenerate the example outputs of the README and the docs site from the real commands, or
check them; also the generated CLI reference (``benchmarks/cli_reference.py``).

    python benchmarks/readme_examples.py --write   # rewrite every example and docs/reference/cli.md
    python benchmarks/readme_examples.py --check   # exit 1 with a diff when one is stale
    python benchmarks/readme_examples.py --check --skip-stored   # what the tests check

An example is a ```` ```text ```` block in ``README.md`` or a page under ``docs/`` whose first
line is ``$ plan-parallel ARGS`` or ``$ python benchmarks/SCRIPT.py ARGS``.  ``plan-parallel``
runs in-process from the repository root, as on a machine without GPUs (NVML detection off, so
the output does not depend on where it runs) and without verl or vLLM installed (no note on
their releases, planner.cost.provenance.version_notes); a benchmark script runs as a
subprocess from the repository root.  The block shows what the command writes to stdout and
stderr, in order.  A block may elide the middle of a long output with a line ``...``: the lines
above it are the output's first lines and those below it its last ones, and regenerating keeps
those counts.

A benchmark that takes minutes (``accuracy.py``) keeps a *stored* output: its command line ends
in ``# stored YYYY-MM-DD``, the day the output last changed.  ``--write`` reruns it too (and
moves the date when the output changed); ``--skip-stored`` leaves stored outputs alone, and
``tests/project/test_readme_examples.py`` checks everything else.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import difflib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
PLAN_PARALLEL = "plan-parallel"
ELLIPSIS = "..."
# the command may continue over lines ending in a backslash, as a shell reads it
BLOCK = re.compile(r"^```text\n(\$ (?:plan-parallel|python benchmarks/\w+\.py)\b"
                   r"(?:[^\n]*\\\n)*[^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
STORED = re.compile(r"#\s*stored (\d{4}-\d{2}-\d{2})\s*$")
# modules that detect the local GPUs through NVML (imported by name there)
NVML_USERS = ("planner.cli.inputs", "planner.diagnose.validate")
# where installed packages live differs per machine: shown as <site-packages>
SITE_PACKAGES = re.compile(r"\S*/site-packages/")


@dataclass(frozen=True)
class Example:
    command: str  # the ``$ plan-parallel ...`` or ``$ python benchmarks/...`` line(s)
    body: str  # the output shown, without the command line
    start: int  # offsets of the command and body in their document
    end: int

    @property
    def words(self) -> list[str]:
        """The command's words after ``$``, as a shell splits them (comments dropped)."""
        return shlex.split(self.command[2:].replace("\\\n", " "), comments=True)

    @property
    def argv(self) -> list[str]:
        """``plan-parallel``'s arguments, or the benchmark script and its arguments."""
        words = self.words
        return words[1:]

    @property
    def is_benchmark(self) -> bool:
        return self.words[0] == "python"

    @property
    def stored_on(self) -> str | None:
        """The date of a stored output (a benchmark that takes minutes), else None."""
        match = STORED.search(self.command)
        return match.group(1) if match else None

    def shape(self) -> tuple[int, int] | None:
        """(first, last) line counts kept around a ``...`` line, or None for a whole output."""
        lines = self.body.rstrip("\n").split("\n")
        if ELLIPSIS not in lines:
            return None
        cut = lines.index(ELLIPSIS)
        return cut, len(lines) - cut - 1


def examples(text: str) -> list[Example]:
    return [Example(match.group(1), match.group(2), match.start(1), match.end(2))
            for match in BLOCK.finditer(text)]


def documents() -> list[Path]:
    """Where examples live: the README and every page of the docs site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def run(argv: list[str]) -> str:
    """What ``plan-parallel ARGV`` prints (stdout and stderr interleaved), run from the
    repository root without NVML."""
    import importlib

    from planner.cli.main import main

    buffer = io.StringIO()
    with contextlib.ExitStack() as stack:
        for name in NVML_USERS:
            module = importlib.import_module(name)
            stack.enter_context(mock.patch.object(module, "detect_local_gpus", lambda: None))
        provenance = importlib.import_module("planner.cost.provenance")
        stack.enter_context(mock.patch.object(provenance, "installed_version", lambda name: None))
        stack.enter_context(contextlib.redirect_stdout(buffer))
        stack.enter_context(contextlib.redirect_stderr(buffer))
        cwd = os.getcwd()
        os.chdir(REPO)
        try:
            main(argv)
        finally:
            os.chdir(cwd)
    return buffer.getvalue()


def run_benchmark(argv: list[str]) -> str:
    """What ``python benchmarks/SCRIPT.py ARGS`` prints, stdout and stderr together."""
    script = REPO / argv[0]
    if script.parent != REPO / "benchmarks" or not script.is_file():
        raise SystemExit(f"{argv[0]}: not a script under benchmarks/")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    done = subprocess.run([sys.executable, str(script), *argv[1:]], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False)
    return done.stdout


def output_of(example: Example) -> str:
    return run_benchmark(example.argv) if example.is_benchmark else run(example.argv)


def rendered(example: Example, output: str) -> str:
    output = SITE_PACKAGES.sub("<site-packages>/", output)
    lines = [line.rstrip() for line in output.rstrip("\n").split("\n")]
    shape = example.shape()
    if shape is not None:
        first, last = shape
        if first + last < len(lines):
            lines = lines[:first] + [ELLIPSIS] + (lines[len(lines) - last:] if last else [])
    return "\n".join(lines) + "\n"


def regenerate(text: str, name: str, skip_stored: bool = False) -> tuple[str, list[str]]:
    """The document with every example's output regenerated, and a diff per stale example.
    A stored output that changed gets today's date."""
    pieces, position, diffs = [], 0, []
    for example in examples(text):
        command, new = example.command, example.body
        if not (skip_stored and example.stored_on):
            if example.stored_on:
                print(f"running {example.command.splitlines()[0][2:]} (stored output: takes "
                      f"minutes)", file=sys.stderr, flush=True)
            new = rendered(example, output_of(example))
        if new != example.body:
            diffs.append("".join(difflib.unified_diff(
                example.body.splitlines(keepends=True), new.splitlines(keepends=True),
                fromfile=f"{name}: {example.command.splitlines()[0]}",
                tofile="actual output")))
            if example.stored_on:
                command = STORED.sub(f"# stored {datetime.date.today().isoformat()}", command)
        pieces += [text[position:example.start], command, "\n", new]
        position = example.end
    pieces.append(text[position:])
    return "".join(pieces), diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when an example is stale")
    mode.add_argument("--write", action="store_true", help="rewrite the stale examples")
    parser.add_argument("--skip-stored", action="store_true",
                        help="leave the stored outputs of minutes-long benchmarks alone")
    parser.add_argument("--file", type=Path, action="append", default=None,
                        help="only this document (repeatable; default: README.md and docs/)")
    args = parser.parse_args(argv)
    import cli_reference

    total, stale = 0, []
    for path in args.file or documents():
        text = path.read_text()
        found = examples(text)
        if not found:
            continue
        name = str(path.resolve().relative_to(REPO)) if path.resolve().is_relative_to(REPO) \
            else str(path)
        new, diffs = regenerate(text, name, args.skip_stored)
        total += len(found)
        stale += diffs
        if args.write and new != text:
            path.write_text(new)
            print(f"{name}: {len(diffs)} of {len(found)} examples regenerated")
    reference_stale = args.file is None and cli_reference.main(
        ["--write" if args.write else "--check"]) != 0
    if args.write:
        print(f"{total} examples, {len(stale)} regenerated")
        return 0
    for diff in stale:
        print(diff)
    print(f"{total} examples, {len(stale)} stale"
          + (f": run python {Path(__file__).relative_to(REPO)} --write" if stale else ""))
    return 1 if stale or reference_stale else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "benchmarks"))
    sys.exit(main())
