"""One GRPO parallel layout: the actor (Megatron), the reference model and the rollout engine.

verl builds the reference model with the actor's parallel sizes (it shares the actor's
``megatron`` section), so only the reference's parameter offload is its own.  ``dp`` is derived
from the world size (``world / (tp * pp * cp)``) and stored so a layout reads on its own.

The planner works on many layouts at once as *columns*: a ``dict`` of equally long numpy arrays
keyed by the field names below (``recompute`` as an index into :data:`RECOMPUTE`).
:meth:`Layout.to_columns` and :meth:`Layout.from_columns` convert one layout to and from that form,
so a single layout and a search space of millions go through the same code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from planner.errors import PlanInputError

# Megatron recomputation: "none"; "selective" (recompute_modules core_attn, layernorm, moe_act);
# "full" (recompute_granularity=full, method=uniform, one layer per checkpoint).
RECOMPUTE = ("none", "selective", "full")

Columns = dict[str, np.ndarray]


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    dp: int = 1
    micro_batch: int = 1
    recompute: str = "none"
    param_offload: bool = False
    optimizer_offload: bool = False
    ref_param_offload: bool = False
    sequence_parallel: bool = True  # only meaningful (and only set for Megatron) when tp > 1
    distributed_optimizer: bool = True
    first_stage_layers: int = 0  # 0: split evenly, or as evenly as uneven first/last stages allow
    last_stage_layers: int = 0
    rollout_tp: int = 1
    rollout_dp: int = 1
    rollout_ep: int = 1
    gpu_memory_utilization: float = 0.6

    def __post_init__(self) -> None:
        if self.recompute not in RECOMPUTE:
            raise PlanInputError(f"--recompute {self.recompute!r} is not one of "
                                 f"{', '.join(RECOMPUTE)}")
        for name in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "micro_batch", "rollout_tp",
                     "rollout_dp", "rollout_ep"):
            if getattr(self, name) < 1:
                raise PlanInputError(f"--{name.replace('_', '-')} must be a positive integer, "
                                     f"got {getattr(self, name)}")
        if not 0.05 <= self.gpu_memory_utilization <= 0.99:
            raise PlanInputError(f"--gpu-memory-utilization {self.gpu_memory_utilization} is "
                                 f"outside 0.05..0.99")

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    def to_columns(self) -> Columns:
        values = asdict(self)
        values["recompute"] = RECOMPUTE.index(self.recompute)
        return {name: np.array([value]) for name, value in values.items()}

    @classmethod
    def from_columns(cls, columns: Columns, row: int = 0) -> "Layout":
        values = {}
        for field in fields(cls):
            value = columns[field.name][row]
            if field.name == "recompute":
                value = RECOMPUTE[int(value)]
            elif field.type in ("bool",):
                value = bool(value)
            elif field.type == "float":
                value = float(value)
            else:
                value = int(value)
            values[field.name] = value
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)


LAYOUT_FIELDS = tuple(field.name for field in fields(Layout))
