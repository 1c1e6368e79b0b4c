"""What a dry run of a verl job reports: one finding per broken rule or doubtful choice."""

from __future__ import annotations

from dataclasses import dataclass

LEVELS = ("error", "warning")


@dataclass(frozen=True)
class Finding:
    """``error``: the job would not launch or would fail; ``warning``: it would run, worse.

    ``check`` names the rule, ``keys`` the verl config keys involved, and ``message`` says the
    values and what would be valid, on one line."""

    check: str
    message: str
    keys: tuple[str, ...] = ()
    level: str = "error"

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"finding level {self.level!r} is not one of {LEVELS}")

    def to_dict(self) -> dict:
        return {"level": self.level, "check": self.check, "keys": list(self.keys),
                "message": self.message}
