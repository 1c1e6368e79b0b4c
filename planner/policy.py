"""The memory policy the whole tool keeps: the band a well-used layout's peak should sit in,
and the level above which a training phase is called tight.

Users watch ``nvidia-smi`` during a run and aim for a stable 70-85% of GPU memory: below, the
GPUs are underused; above, a longer response or allocator fragmentation runs the job out of
memory an hour in.  Plans, ``validate``, ``fix``, the configs library and the report all judge
peaks against one :class:`MemoryPolicy` and format their messages from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import PlanInputError


@dataclass(frozen=True)
class MemoryPolicy:
    """``low``/``high``: the band (fractions of GPU memory) a peak should sit in; ``tight``: a
    training-phase peak above it is flagged as likely to OOM on a long response."""

    low: float = 0.70
    high: float = 0.85
    tight: float = 0.92

    def __post_init__(self) -> None:
        if not 0.0 < self.low < self.high <= 0.99:
            raise PlanInputError(f"--memory-band {self.low:g}-{self.high:g} is not a band: "
                                 f"need 0 < low < high <= 0.99 (e.g. 0.70-0.85)")
        if not self.high <= self.tight <= 1.0:
            raise PlanInputError(f"tight-memory level {self.tight:g} must lie between the band's"
                                 f" top {self.high:g} and 1")

    @classmethod
    def parse(cls, text: str) -> "MemoryPolicy":
        """``"0.70-0.85"`` (fractions) or ``"70-85"`` (percent)."""
        low, dash, high = str(text).strip().partition("-")
        try:
            values = [float(low), float(high)]
        except ValueError:
            raise PlanInputError(f"--memory-band {text!r} is not LOW-HIGH (e.g. 0.70-0.85 or "
                                 f"70-85)") from None
        if not dash:
            raise PlanInputError(f"--memory-band {text!r} is not LOW-HIGH (e.g. 0.70-0.85)")
        if all(value > 1 for value in values):
            values = [value / 100 for value in values]
        high_value = values[1]
        return cls(low=values[0], high=high_value, tight=max(cls.tight, high_value))

    @property
    def band_text(self) -> str:
        return f"{100 * self.low:.0f}-{100 * self.high:.0f}%"

    def position(self, fraction: float) -> str:
        """``"below"``, ``"inside"`` or ``"above"`` the band."""
        if fraction < self.low:
            return "below"
        return "above" if fraction > self.high else "inside"

    def is_tight(self, fraction: float) -> bool:
        return fraction > self.tight


DEFAULT_POLICY = MemoryPolicy()
