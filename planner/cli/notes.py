"""Notes about assumptions the answer rests on (a GPU without BF16, a rollout engine that does
not run on the card, efficiencies borrowed from another GPU), printed to stderr once the command
has its answer.  Held until then so that bad input still gets exactly one line: a command that
ends in an error prints the error alone (planner/cli/main.py drops the held notes)."""

from __future__ import annotations

import sys

_HELD: list[str] = []


def note(text: str) -> None:
    """Hold one note (printed once, in the order given)."""
    if text not in _HELD:
        _HELD.append(text)


def flush() -> None:
    """Print the held notes to stderr and forget them (long commands call it once their inputs
    are checked, so the notes come before hours of trials)."""
    for text in _HELD:
        print(f"note: {text}", file=sys.stderr)
    _HELD.clear()


def drop() -> None:
    _HELD.clear()
