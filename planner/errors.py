"""The planner's small exception hierarchy.

Messages state the rule that was broken and the values involved, on one line, so the CLI can
print them as they are.  The CLI maps :class:`PlanInputError` to exit code 2.
"""

from __future__ import annotations


class PlanError(Exception):
    """Base class of every error the planner raises on purpose."""


class PlanInputError(PlanError, ValueError):
    """Bad user input: an unknown model or GPU, a malformed config.json, contradictory flags."""


class InvalidLayoutError(PlanError, ValueError):
    """A layout breaks a rule that megatron-core, vLLM or verl enforce.

    ``violations`` holds ``(rule_name, message)`` pairs, every rule broken, not only the first.
    """

    def __init__(self, violations: list[tuple[str, str]]):
        self.violations = list(violations)
        super().__init__("; ".join(message for _, message in self.violations))
