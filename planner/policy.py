"""The memory policy the whole tool keeps, and the two memory quantities it prints.

Users watch ``nvidia-smi`` during a run and aim for a stable 70-85% of GPU memory: below, the
GPUs are underused; above, a longer response or allocator fragmentation runs the job out of
memory an hour in.  Plans, ``estimate``, ``validate``, ``fix``, the configs library and the report
all judge one quantity -- the :data:`PEAK_NAME` -- against one :class:`MemoryPolicy`, and name
it (and the :data:`WORKING_SET_NAME` beside it) the same way wherever they print it.

The band also caps the rollout engine: the plan picks vLLM's ``gpu_memory_utilization`` so that
its preallocated pool plus the actor state left resident during rollout stays below the band's
top.  ``--memory-band 0.70-0.95`` (:data:`FILL_POLICY`) lets the pool fill the GPU, as vLLM's
own default would; the plan prints what the headroom costs against that.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import PlanInputError

PEAK_NAME = "nvidia-smi peak"
PEAK_MEANING = ("reserved memory per GPU at the step's worst moment as nvidia-smi shows it -- "
                "vLLM's whole gpu_memory_utilization pool, the state left resident during "
                "rollout, allocator fragmentation, CUDA context and NCCL buffers included; the "
                "memory band judges it")
WORKING_SET_NAME = "allocated working set"
WORKING_SET_MEANING = ("what a phase's tensors occupy -- in generate the rollout weights, "
                       "activations and the KV blocks of the sequences running at once, not "
                       "the pool's unused rest")


@dataclass(frozen=True)
class MemoryPolicy:
    """``low``/``high``: the band (fractions of GPU memory) the :data:`PEAK_NAME` should sit in.
    The rollout pool is sized to keep the peak below ``high``."""

    low: float = 0.70
    high: float = 0.85

    def __post_init__(self) -> None:
        if not 0.0 < self.low < self.high <= 0.99:
            raise PlanInputError(f"--memory-band {self.low:g}-{self.high:g} is not a band: "
                                 f"need 0 < low < high <= 0.99 (e.g. 0.70-0.85)")

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
        return cls(low=values[0], high=values[1])

    @property
    def band_text(self) -> str:
        return f"{100 * self.low:.0f}-{100 * self.high:.0f}%"

    @property
    def option_text(self) -> str:
        """The ``--memory-band`` value that selects this policy."""
        return f"{self.low:.2f}-{self.high:.2f}"

    @property
    def fills_gpu(self) -> bool:
        """The rollout pool may grow as far as vLLM would let it (no headroom kept)."""
        return self.high >= FILL_HIGH

    def position(self, fraction: float) -> str:
        """``"below"``, ``"inside"`` or ``"above"`` the band."""
        if fraction < self.low:
            return "below"
        return "above" if fraction > self.high + 1e-9 else "inside"


# vLLM's own default gpu_memory_utilization is 0.90 of the GPU beside nothing else; the planner
# leaves 5% beside the rollout pool in any case (cost.memory.ROLLOUT_HEADROOM_FRACTION), so a
# band top of 0.95 removes every other limit: "fill the GPU".
FILL_HIGH = 0.95
DEFAULT_POLICY = MemoryPolicy()
FILL_POLICY = MemoryPolicy(low=DEFAULT_POLICY.low, high=FILL_HIGH)
