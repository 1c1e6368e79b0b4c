"""One GRPO parallel layout: the actor (Megatron), the reference model and the rollout engine.

verl builds the reference model with the actor's parallel sizes (it shares the actor's
``megatron`` section), so only the reference's parameter offload is its own.  ``dp`` is derived
from the world size (``world / (tp * pp * cp)``) and stored so a layout reads on its own.

The planner works on many layouts at once as *columns*: a ``dict`` of equally long numpy arrays
keyed by the field names below (``recompute`` as an index into :data:`RECOMPUTE`).
:meth:`Layout.to_columns` and :meth:`Layout.from_row` convert one layout to and from that form,
so a single layout and a search space of millions go through the same code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

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

    def to_columns(self) -> Columns:
        values = asdict(self)
        values["recompute"] = RECOMPUTE.index(self.recompute)
        return {name: np.array([value]) for name, value in values.items()}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Layout":
        """The layout of one row of layout columns or of a plan's candidate frame: numpy
        scalars, ``recompute`` as an index or a name."""
        convert = {"int": int, "bool": bool, "float": float, "str": str}
        values = {}
        for spec in fields(cls):
            value = row[spec.name]
            value = value.item() if hasattr(value, "item") else value
            if spec.name == "recompute" and not isinstance(value, str):
                value = RECOMPUTE[int(value)]
            values[spec.name] = convert[spec.type](value)
        values["gpu_memory_utilization"] = round(values["gpu_memory_utilization"], 2)
        return cls(**values)

    @property
    def offload_text(self) -> str:
        """``param+optim+ref`` for what is offloaded, ``-`` for nothing."""
        parts = [name for name, on in (("param", self.param_offload),
                                       ("optim", self.optimizer_offload),
                                       ("ref", self.ref_param_offload)) if on]
        return "+".join(parts) or "-"

    def actor_text(self, moe: bool = True) -> str:
        """The actor's layout in one line: ``TP2 PP2 VPP1 CP1 EP1 ETP1 DP2, micro-batch 4,
        recompute none, offload -``; the one way every command prints a layout."""
        sizes = f"TP{self.tp} PP{self.pp} VPP{self.vpp} CP{self.cp}"
        if moe:
            sizes += f" EP{self.ep} ETP{self.etp}"
        return (f"{sizes} DP{self.dp}, micro-batch {self.micro_batch}, recompute "
                f"{self.recompute}, offload {self.offload_text}")

    def rollout_text(self) -> str:
        return (f"rollout TP{self.rollout_tp} DP{self.rollout_dp} EP{self.rollout_ep} at "
                f"gpu_memory_utilization {self.gpu_memory_utilization:.2f}")

    def to_dict(self) -> dict:
        return asdict(self)


LAYOUT_FIELDS = tuple(field.name for field in fields(Layout))
