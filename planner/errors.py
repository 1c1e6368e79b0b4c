"""The planner's one exception tree.

Messages state the rule that was broken and the values involved, on one line, so the CLI can
print them as they are.  Only :mod:`planner.cli` maps them to exit codes:

* :class:`PlanInputError` (bad input, a missing extra, a resource bound that tripped) -> 2;
* :class:`InvalidLayoutError` and :class:`NoFitError` (the answer is "no") -> 1.
"""

from __future__ import annotations


class PlanError(Exception):
    """Base class of every error the planner raises on purpose."""


class PlanInputError(PlanError, ValueError):
    """Bad user input: an unknown model or GPU, a malformed file, contradictory flags.

    Messages name the verl key when the value came from a job, the flag when it came from the
    command line, and say what would be valid."""


class MissingExtraError(PlanInputError):
    """An optional package a command needs is not installed; the message names the extra."""

    def __init__(self, message: str, extra: str | None = None):
        super().__init__(message)
        self.extra = extra


class ResourceLimitError(PlanInputError):
    """User-controlled input exceeded a bound (file size, nesting depth, expression size)."""


class InvalidLayoutError(PlanError, ValueError):
    """A layout breaks a rule that megatron-core, vLLM or verl enforce.

    ``violations`` holds ``(rule_name, message)`` pairs, every rule broken, not only the first.
    """

    def __init__(self, violations: list[tuple[str, str]]):
        self.violations = list(violations)
        super().__init__("; ".join(message for _, message in self.violations))


class NoFitError(PlanError):
    """No layout fits in GPU memory (a "no" answer, like an invalid layout)."""
