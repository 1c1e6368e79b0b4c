"""Regenerate the README's example outputs from the real commands, or check them.

    python benchmarks/readme_examples.py --check   # exit 1 with a diff when an example is stale
    python benchmarks/readme_examples.py --write   # rewrite the examples in README.md

An example is a ```` ```text ```` block whose first line is ``$ plan-parallel ARGS``.  The
command runs in-process from the repository root, as on a machine without GPUs (NVML detection
off, so the output does not depend on where it runs); the block shows what it writes to stdout
and stderr, in order.  A block may elide the middle of a long output with a line ``...``: the
lines above it are the output's first lines and those below it its last ones, and regenerating
keeps those counts.  ``tests/test_readme_examples.py`` runs ``--check``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PROMPT = "$ plan-parallel "
ELLIPSIS = "..."
# the command may continue over lines ending in a backslash, as a shell reads it
BLOCK = re.compile(r"^```text\n(\$ plan-parallel (?:[^\n]*\\\n)*[^\n]*)\n(.*?)^```$",
                   re.MULTILINE | re.DOTALL)
# modules that detect the local GPUs through NVML (imported by name there)
NVML_USERS = ("planner.cli.inputs", "planner.diagnose.validate")
# where installed packages live differs per machine: shown as <site-packages>
SITE_PACKAGES = re.compile(r"\S*/site-packages/")


@dataclass(frozen=True)
class Example:
    command: str  # the ``$ plan-parallel ...`` line
    body: str  # the output shown, without the command line
    start: int  # offsets of the body in the README
    end: int

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.command[len(PROMPT):].replace("\\\n", " "), comments=True)

    def shape(self) -> tuple[int, int] | None:
        """(first, last) line counts kept around a ``...`` line, or None for a whole output."""
        lines = self.body.rstrip("\n").split("\n")
        if ELLIPSIS not in lines:
            return None
        cut = lines.index(ELLIPSIS)
        return cut, len(lines) - cut - 1


def examples(text: str) -> list[Example]:
    return [Example(match.group(1), match.group(2), match.start(2), match.end(2))
            for match in BLOCK.finditer(text)]


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
        stack.enter_context(contextlib.redirect_stdout(buffer))
        stack.enter_context(contextlib.redirect_stderr(buffer))
        cwd = os.getcwd()
        os.chdir(REPO)
        try:
            main(argv)
        finally:
            os.chdir(cwd)
    return buffer.getvalue()


def rendered(example: Example, output: str) -> str:
    output = SITE_PACKAGES.sub("<site-packages>/", output)
    lines = [line.rstrip() for line in output.rstrip("\n").split("\n")]
    shape = example.shape()
    if shape is not None:
        first, last = shape
        if first + last < len(lines):
            lines = lines[:first] + [ELLIPSIS] + (lines[len(lines) - last:] if last else [])
    return "\n".join(lines) + "\n"


def regenerate(text: str) -> tuple[str, list[str]]:
    """The README with every example's output regenerated, and a diff per stale example."""
    pieces, position, diffs = [], 0, []
    for example in examples(text):
        new = rendered(example, run(example.argv))
        if new != example.body:
            diffs.append("".join(difflib.unified_diff(
                example.body.splitlines(keepends=True), new.splitlines(keepends=True),
                fromfile=f"README: {example.command}", tofile="actual output")))
        pieces += [text[position:example.start], new]
        position = example.end
    pieces.append(text[position:])
    return "".join(pieces), diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when an example is stale")
    mode.add_argument("--write", action="store_true", help="rewrite README.md's examples")
    parser.add_argument("--readme", type=Path, default=README)
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    new, diffs = regenerate(text)
    if args.write:
        if new != text:
            args.readme.write_text(new)
        print(f"{len(examples(text))} examples, {len(diffs)} regenerated in {args.readme}")
        return 0
    for diff in diffs:
        print(diff)
    print(f"{len(examples(text))} examples, {len(diffs)} stale"
          + (f": run python {Path(__file__).relative_to(REPO)} --write" if diffs else ""))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
