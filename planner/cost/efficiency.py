"""The cost model's fitted constants: achieved fractions of hardware peaks, the file they ship in
(``planner/cost/calibration.json``, written by ``benchmarks/calibrate.py``), the priors and
bounds the fit (:mod:`planner.cost.calibration`) keeps them within, and :class:`CostModel`, a
calibration read once.

The fit is physical: one GEMM efficiency per GPU type and precision family, and a handful of
constants shared by every GPU.  A user's own fit (``plan-parallel calibrate``) has the same
shape and is read by :func:`read_calibration`.

A calibration is loaded once, into a :class:`CostModel` (the efficiencies of every GPU type and
precision family it states, the ranking uncertainty, where it came from), which a
:class:`planner.cost.request.PlanRequest` carries; a cost function reads its constants as
``request.efficiency`` (this request's GPU and precision), never from a dict.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from planner.catalog.hardware import GPU_CATALOG, GpuSpec
from planner.errors import PlanInputError


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of hardware peaks (fitted; see ``benchmarks/calibrate.py``)."""

    gemm: float = 0.60  # large-GEMM fraction of dense tensor-core peak
    gemm_half_rows: float = 192.0  # GEMM rows at which efficiency is half of ``gemm``
    attention: float = 0.45  # flash-attention fraction of BF16 peak
    nvlink: float = 0.70  # collective bus bandwidth / NVLink per-direction bandwidth
    network: float = 0.55  # ... / NIC bandwidth across nodes
    hbm: float = 0.70  # decode weight/KV streaming and optimizer step
    dp_overlap: float = 0.60  # share of DP reduce-scatter/all-gather hidden behind compute
    tp_overlap: float = 0.0  # share of TP collectives hidden (0 without TE comm overlap)
    ep_overlap: float = 0.0  # share of EP all-to-all hidden
    cp_overlap: float = 0.70  # share of CP ring exchange hidden behind attention
    # Memory-bound work beside the GEMMs (norms, activation functions, MoE permutation,
    # residual adds): passes over the layer's activation tensors at HBM bandwidth, forward.
    elementwise_passes: float = 2.0
    layer_overhead_s: float = 40e-6  # kernel launches and syncs per layer per micro-batch pass
    expert_gemm: float = 0.7  # grouped expert GEMMs + routing, relative to dense GEMMs
    # --- RL phases (fitted on benchmarks/data/grpo_runs.csv by benchmarks/calibrate.py) ------
    decode_hbm: float = 0.70  # decode weight + KV streaming, fraction of HBM bandwidth
    decode_layer_s: float = 20e-6  # per decoder layer per decode step with CUDA graphs
    decode_step_s: float = 2.5e-3  # per decode step: scheduling, sampling, detokenising
    # per decode step when the engine has TP > 1 workers: the scheduler's output broadcast to
    # every worker process and the sampled tokens gathered back (vLLM's multiprocess executor
    # message queue), which CUDA graphs do not hide
    decode_tp_step_s: float = 2e-3
    sync_tensor_s: float = 0.5e-3  # verl per-tensor weight export: gather + load per tensor
    bucketed_tensor_s: float = 0.1e-3  # NeMo RL bucketed (CUDA IPC) refit, per tensor
    sync_fixed_s: float = 1.5  # rollout engine wake-up, cache reset and sleep per step
    step_fixed_s: float = 3.0  # reward, advantage and data movement between workers per step
    # host time per layer on a stage to prepare and launch one forward-and-backward micro-batch
    # of an RL trainer's Megatron pass, a floor on the micro-batch's time: the trainers block the
    # host on the GPU every micro-batch (planner.cost.timing.train_phase_s)
    host_layer_s: float = 5e-3

    def to_dict(self) -> dict:
        return asdict(self)


CALIBRATION_FILE = "calibration.json"


@cache
def _shipped() -> dict:
    path = Path(__file__).parent / CALIBRATION_FILE  # as planner.catalog.models._catalog_dir
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def shipped_calibration() -> dict:
    """The calibration that ships with the planner (a copy: callers may change it)."""
    return json.loads(json.dumps(_shipped()))




def _family(precision: str) -> str:
    """The precision family a calibration's GEMM efficiency is fitted for (FP16 runs the BF16,
    16-bit, kernels)."""
    return "fp8" if precision == "fp8" else "bf16"


# Used when neither the given calibration nor the shipped file states the ranking uncertainty.
DEFAULT_RANKING_UNCERTAINTY = 0.0
UNCERTAINTY_KEY = "ranking_uncertainty"
SHIPPED_SOURCE = "shipped planner/cost/calibration.json"


def ranking_uncertainty(calibration: Mapping | None = None) -> dict:
    """How far apart two layouts' predicted step times must be for the model to tell them
    apart: ``{"relative": fraction, "source": text, ...}``.

    ``benchmarks/accuracy.py --write`` measures it on the published layouts (the median error
    of the predicted throughput ratio of two layouts of one job) and stores it in the
    calibration file; a user's own calibration without the figure uses the shipped one.
    """
    for data in (calibration, _shipped()):
        entry = (data or {}).get(UNCERTAINTY_KEY)
        if isinstance(entry, dict) and isinstance(entry.get("relative"), (int, float)) \
                and not isinstance(entry.get("relative"), bool) \
                and 0.0 <= entry["relative"] < 1.0:
            return dict(entry)
    return {"relative": DEFAULT_RANKING_UNCERTAINTY, "source": "none stated"}


@dataclass(frozen=True, eq=False)
class CostModel:
    """A calibration, read once: the efficiencies of every GPU type and precision family it
    states, the model's ranking uncertainty, and where the calibration came from.

    Build it with :meth:`load` (a calibration dict, or None for the shipped file) or
    :meth:`fixed` (one :class:`Efficiency` for every GPU: a fit's trial point, a test).
    :meth:`efficiency` is a look-up; nothing is read or parsed after construction.
    """

    # calibration key ("H100-80GB/bf16", "*/fp8") -> the shared constants with that entry's
    by_key: Mapping[str, Efficiency]
    shared: Efficiency  # the shared constants alone: a GPU and family no entry names
    uncertainty: float  # ranking uncertainty: step-time ratio within which layouts are ties
    uncertainty_source: str  # where that figure was measured
    source: str = SHIPPED_SOURCE  # where the calibration came from
    # calibration key -> its bookkeeping: how many measurements it was fitted on, or its donor
    fitted_on: Mapping[str, Mapping] = field(default_factory=lambda: MappingProxyType({}))
    # the calibration as read (read-only): what a refit starts from (``advise``) and the
    # provenance it records (:mod:`planner.cost.provenance`); empty for :meth:`fixed`
    calibration: Mapping = field(default_factory=lambda: MappingProxyType({}))
    # the RL constants a user's file lacked and that were taken from the shipped file
    # (:func:`with_shipped_rl_constants`; ``load(..., fill_from_shipped=True)``), for the CLI's
    # note; empty when nothing was filled
    filled_from_shipped: tuple[str, ...] = ()

    @classmethod
    def load(cls, calibration: Mapping | None = None, source: str | None = None,
             fill_from_shipped: bool = False) -> "CostModel":
        """The cost model of ``calibration`` (a dict as ``benchmarks/calibrate.py`` or
        ``plan-parallel calibrate`` writes it); None: the shipped calibration.

        ``fill_from_shipped`` (a user's file, as the CLI reads it): an RL constant the file
        lacks takes the shipped calibration's value instead of the built-in default
        (:func:`with_shipped_rl_constants`), and :attr:`filled_from_shipped` names them."""
        if calibration is None:
            return shipped_cost_model()
        if fill_from_shipped:
            calibration, filled = with_shipped_rl_constants(calibration)
            return replace(cls.load(calibration, source), filled_from_shipped=filled)
        known = {f.name for f in fields(Efficiency)}
        shared = replace(Efficiency(), **{k: v for k, v in calibration.get("shared", {}).items()
                                          if k in known})
        by_key = {key: replace(shared, **{k: v for k, v in entry.items() if k in known})
                  for key, entry in calibration.get("by_gpu", {}).items()}
        fitted_on = {key: MappingProxyType({k: entry[k] for k in ("measurements", "donor")
                                            if k in entry})
                     for key, entry in calibration.get("by_gpu", {}).items()}
        uncertainty = ranking_uncertainty(calibration)
        return cls(by_key=MappingProxyType(by_key), shared=shared,
                   uncertainty=float(uncertainty["relative"]),
                   uncertainty_source=str(uncertainty.get("source", "")),
                   source=source or "given calibration", fitted_on=MappingProxyType(fitted_on),
                   calibration=MappingProxyType(calibration))

    @classmethod
    def fixed(cls, efficiency: Efficiency, source: str = "given efficiency") -> "CostModel":
        """Every GPU type and precision with ``efficiency`` (the shipped ranking uncertainty)."""
        shipped = shipped_cost_model()
        return cls(by_key=MappingProxyType({}), shared=efficiency,
                   uncertainty=shipped.uncertainty,
                   uncertainty_source=shipped.uncertainty_source, source=source)

    def entry(self, gpu: GpuSpec, precision: str) -> str | None:
        """The calibration entry a GPU's efficiencies come from: its own; else its donor's
        (:data:`DONORS`, the closest measured architecture -- a part added to the catalog after
        the calibration file was written); else the median of the measured parts
        (``*/family``); None: the shared constants alone."""
        family = _family(precision)
        donor = DONORS.get(gpu.name)
        for key in (f"{gpu.name}/{family}", f"{donor}/{family}" if donor else None,
                    f"*/{family}"):
            if key is not None and key in self.by_key:
                return key
        return None

    def efficiency(self, gpu: GpuSpec, precision: str) -> Efficiency:
        """The constants for a GPU type and precision (from :meth:`entry`)."""
        key = self.entry(gpu, precision)
        return self.shared if key is None else self.by_key[key]

    def efficiency_of(self, key: str) -> Efficiency:
        """The constants a calibration key (``"H100-80GB/bf16"``, ``"*/fp8"``) resolves to: its
        own entry, else the GPU's (:meth:`efficiency`), else the shared constants."""
        if key in self.by_key:
            return self.by_key[key]
        name, _, family = key.partition("/")
        gpu = next((g for g in GPU_CATALOG if g.name == name), None)
        return self.shared if gpu is None else self.efficiency(gpu, family)

    def source_of(self, gpu: GpuSpec, precision: str) -> str:
        """Where a GPU's fitted efficiencies come from, in words; starts "uncalibrated" when
        the calibration holds no measurement of this GPU type (borrowed or default
        constants)."""
        family, key = _family(precision), self.entry(gpu, precision)
        fitted = self.fitted_on.get(key, {}) if key else {}
        if key == f"{gpu.name}/{family}" and fitted.get("measurements"):
            return f"calibrated: {fitted['measurements']} measurements of {key}"
        if key is None:
            return (f"uncalibrated: no {gpu.name}/{family} entry and no default; built-in "
                    f"constants")
        if key.startswith("*/"):
            return f"uncalibrated: no {gpu.name} measurements; the median of the measured parts"
        borrowed = fitted.get("donor", key) if key == f"{gpu.name}/{family}" else key
        if borrowed == "median":
            return f"uncalibrated: no {gpu.name} measurements; the median of the measured parts"
        if borrowed.startswith(f"{gpu.name}/"):
            return f"calibrated: {borrowed}'s figure (no {family} measurements of its own)"
        return (f"uncalibrated: no {gpu.name} measurements; efficiencies of {borrowed}, the "
                f"closest measured architecture")


@cache
def shipped_cost_model() -> CostModel:
    """The cost model of the shipped calibration (read once per process)."""
    return CostModel.load(_shipped(), SHIPPED_SOURCE)


def with_shipped_rl_constants(calibration: Mapping) -> tuple[dict, tuple[str, ...]]:
    """A copy of ``calibration`` in which each RL constant (:data:`RL_SHARED`,
    :data:`RL_BY_GPU`) it lacks takes the shipped calibration's value (per entry for
    :data:`RL_BY_GPU`, the shipped figure of that GPU and family), and the names filled, sorted.
    A calibration fitted before the RL constants existed, or written by hand, thereby keeps the
    shipped RL phases rather than the built-in defaults; ``calibration`` is not changed."""
    shipped = shipped_cost_model()
    out = {**calibration, "shared": dict(calibration.get("shared") or {}),
           "by_gpu": {k: dict(v) for k, v in (calibration.get("by_gpu") or {}).items()}}
    filled = set()
    for name in RL_SHARED:
        if name not in out["shared"]:
            out["shared"][name] = getattr(shipped.shared, name)
            filled.add(name)
    for key, entry in out["by_gpu"].items():
        for name in RL_BY_GPU:
            if name not in entry:
                entry[name] = getattr(shipped.efficiency_of(key), name)
                filled.add(name)
    if filled:  # where the filled constants come from: the shipped RL fit and its provenance
        carry_rl_record(out, shipped_calibration())
    return out, tuple(sorted(filled))


def carry_rl_record(calibration: dict, source: Mapping) -> None:
    """Copy ``source``'s record of its RL constants (``rl_fit`` and ``provenance.rl``) into
    ``calibration`` where it has none of its own: RL constants taken from ``source`` keep
    saying where they came from."""
    if "rl_fit" not in calibration and "rl_fit" in source:
        calibration["rl_fit"] = copy.deepcopy(source["rl_fit"])
    provenance = dict(calibration.get("provenance") or {})
    if "rl" not in provenance and "rl" in (source.get("provenance") or {}):
        provenance["rl"] = copy.deepcopy(source["provenance"]["rl"])
        calibration["provenance"] = provenance


def load_efficiency(gpu: GpuSpec, precision: str, calibration: Mapping | None = None
                    ) -> Efficiency:
    """Efficiency for a GPU type and precision: shared constants, then per-GPU/precision ones.

    ``calibration`` is a dict as written by ``benchmarks/calibrate.py`` (or a user's
    ``plan-parallel calibrate``); by default the shipped ``planner/cost/calibration.json``.
    (The planner itself reads a :class:`CostModel` once; this reads one entry.)
    """
    return CostModel.load(calibration).efficiency(gpu, precision)


def efficiency_source(gpu: GpuSpec, precision: str, calibration: Mapping | None = None) -> str:
    """Where a GPU's efficiencies come from in ``calibration`` (None: the shipped one), in words
    (:meth:`CostModel.source_of`)."""
    return CostModel.load(calibration).source_of(gpu, precision)


def read_calibration(path: Path) -> dict:
    """A calibration file (``plan-parallel calibrate`` writes them), checked whole on read:
    bounded size and nesting, UTF-8 JSON without NaN, and the schema -- ``shared`` an object
    of constants, ``by_gpu`` an object of ``GPU/family`` objects, every efficiency a finite
    number (the fitted ones within :data:`BOUNDS`, the RL ones within :data:`RL_PRIORS`'
    bounds).  Anything else is one input error."""
    from planner.bounds import load_json

    where = str(path)
    data = load_json(Path(path), "--calibration")
    if not {"shared", "by_gpu"} & set(data):
        raise PlanInputError(f"{where!r} is not a plan-parallel calibration file "
                             f"(expects 'shared' and 'by_gpu')")
    sections = [("shared", data.get("shared"))]
    by_gpu = data.get("by_gpu")
    if by_gpu is not None and not isinstance(by_gpu, dict):
        raise PlanInputError(f"{where!r}: by_gpu is {_json_type(by_gpu)}, not an object of "
                             f"'GPU/family' entries (e.g. {{\"H100-80GB/bf16\": {{\"gemm\": "
                             f"0.7}}}})")
    sections += [(f"by_gpu.{key}", value) for key, value in (by_gpu or {}).items()]
    known = {f.name for f in fields(Efficiency)}
    for name, section in sections:
        if section is None and name == "shared":
            continue
        if not isinstance(section, dict):
            raise PlanInputError(f"{where!r}: {name} is {_json_type(section)}, not an object "
                                 f"of constants (e.g. {{\"gemm\": 0.7}})")
        for key, value in section.items():
            if key not in known:
                continue  # bookkeeping: measurements, donor, rl_donor
            bounded = key in BOUNDS or key in RL_PRIORS
            low, high = prior(key)[2] if bounded else (0.0, float("inf"))
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not low <= value <= high or value != value or value == float("inf"):
                shown = f"a number in {low:g}..{high:g}" if bounded else "a finite number >= 0"
                raise PlanInputError(f"{where!r}: {name}.{key} = {value!r:.60} is not {shown}")
    return data


def _json_type(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return f"{names.get(type(value), type(value).__name__)} ({json.dumps(value)[:40]})"


# (typical value, sigma of the log): NCCL bus bandwidth ~75% of NVLink and ~70% of the NIC;
# cuBLAS GEMMs ~65% of dense peak; flash attention ~45%; tens of microseconds of kernel
# launches per layer; grouped expert GEMMs below dense ones.
PRIORS = {"gemm": (0.65, 0.3), "gemm_half_rows": (128.0, 1.0), "attention": (0.45, 0.3),
          "nvlink": (0.75, 0.2), "network": (0.70, 0.3), "dp_overlap": (0.6, 0.5),
          "ep_overlap": (0.3, 1.0), "elementwise_passes": (3.0, 0.5),
          "layer_overhead_s": (30e-6, 0.7), "expert_gemm": (0.7, 0.5)}
BOUNDS = {"gemm": (0.2, 0.95), "gemm_half_rows": (8.0, 4096.0), "attention": (0.2, 0.9),
          "nvlink": (0.3, 0.95), "network": (0.2, 0.95), "dp_overlap": (0.01, 0.98),
          "ep_overlap": (0.01, 0.9), "elementwise_passes": (0.1, 12.0),
          "layer_overhead_s": (1e-6, 500e-6), "expert_gemm": (0.1, 1.0)}
SHARED = ("gemm_half_rows", "attention", "nvlink", "network", "dp_overlap", "ep_overlap",
          "elementwise_passes", "layer_overhead_s", "expert_gemm")
# Parts with no measurements borrow a measured part of the same architecture.
# A part's donor also serves at load time when the calibration file predates the part
# (:meth:`CostModel.entry`): Volta (V100) has no measured part of its own and borrows the
# nearest measured tensor-core generation (Ampere A100); Ampere GA10x (A10, A10G) and Ada (L4,
# L40, RTX 4090) borrow the A100 as the L40S does; the Hopper variants borrow the H100.
DONORS = {"H800": "H100-80GB", "H20-96GB": "H100-80GB", "H200": "H100-80GB",
          "H100-PCIe": "H100-80GB", "A100-40GB": "A100-80GB",
          "L40S": "A100-80GB", "B300": "B200",
          "V100-16GB": "A100-80GB", "V100-32GB": "A100-80GB", "A10": "A100-80GB",
          "A10G": "A100-80GB", "L4": "A100-80GB", "L40": "A100-80GB", "RTX-4090": "A100-80GB",
          "H20-141GB": "H100-80GB", "H200-NVL": "H100-80GB"}
# MI300X/MI325X (CDNA3) have no measured part of their architecture: the median of each family.

# --- the RL constants (fitted phase by phase on published RL steps, benchmarks/rl_data.py) ---
# (typical value, sigma of the log, bounds): HBM streaming at decode ~60-80% of the datasheet
# (vLLM/SGLang decode benchmarks); tens of microseconds per layer of graph replay and ~1-3 ms of
# scheduling per step (vLLM v1), ~ms more to broadcast each step to TP workers;
# sub-millisecond per exported tensor; seconds of fixed costs; a few ms of host work per layer to
# prepare and dispatch an eager forward and backward (Python module calls, hooks and ~100-300
# kernel launches of ~10-20 us each), wide: no published profile of the trainers' loops sizes it.
RL_PRIORS = {"decode_hbm": (0.7, 0.3, (0.2, 0.95)),
             "decode_layer_s": (20e-6, 1.0, (2e-6, 60e-6)),
             "decode_step_s": (2.5e-3, 1.0, (1e-4, 20e-3)),
             "decode_tp_step_s": (2e-3, 1.0, (1e-4, 20e-3)),
             "sync_tensor_s": (0.5e-3, 1.5, (1e-6, 20e-3)),
             "bucketed_tensor_s": (0.1e-3, 1.5, (1e-7, 5e-3)),
             "sync_fixed_s": (1.5, 1.0, (0.1, 20.0)),
             "step_fixed_s": (3.0, 1.0, (0.1, 30.0)),
             "host_layer_s": (5e-3, 1.0, (1e-4, 20e-3))}
RL_SHARED = ("decode_layer_s", "decode_step_s", "decode_tp_step_s", "sync_tensor_s",
             "bucketed_tensor_s", "sync_fixed_s", "step_fixed_s", "host_layer_s")
RL_BY_GPU = ("decode_hbm",)
PER_GPU = ("gemm",) + RL_BY_GPU  # constants kept per GPU type and precision family


def prior(name: str) -> tuple[float, float, tuple[float, float]]:
    """``(typical value, sigma of its log, (low, high))`` of a fitted constant."""
    if name in RL_PRIORS:
        return RL_PRIORS[name]
    centre, sigma = PRIORS[name]
    return centre, sigma, BOUNDS[name]
