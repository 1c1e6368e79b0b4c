"""Size the cluster: for each GPU type and GPU count, the best layout, its step time, the run's
time, GPU-hours and cost, and the points that matter.

* **run**: ``--steps N``, or ``--epochs E`` over ``--dataset-prompts P``: verl runs
  ``floor(P / train_batch_size)`` steps per epoch (its train dataloader drops the last partial
  batch, ``RayPPOTrainer._create_dataloader``) times the epochs;
* **GPU-hours** = step time x steps x GPUs / 3600; **cost** = GPU-hours x the price of one
  GPU-hour of that type (:mod:`planner.sizing.prices`; no price, no cost);
* **marks**, per GPU type: ``fastest`` (shortest step), ``cheapest`` (fewest GPU-hours, so the
  lowest cost at one price), ``smallest`` (the fewest GPUs that fit), ``knee`` (the smallest
  count N from which doubling to 2N speeds the step up less than ``min_scaling``); across
  types the fastest and, where every type is priced, the cheapest run.
* **blocked**: below the smallest fitting count, the closest miss at the largest count that
  does not fit -- its phase and the memory it needs -- says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from planner.catalog.hardware import ClusterSpec, GpuSpec
from planner.catalog.models import ModelSpec
from planner.catalog.workload import Workload
from planner.cost.efficiency import CostModel, shipped_cost_model
from planner.cost.request import PlanRequest
from planner.errors import PlanInputError
from planner.phases import PHASES
from planner.policy import DEFAULT_POLICY, MemoryPolicy
from planner.search.layout import Layout
from planner.search.space import SearchOptions
from planner.sizing.best_per_count import CountResult, best_layout
from planner.sizing.counts import AUTO_MAX_GPUS, GpuCounts, auto_counts
from planner.sizing.prices import PriceTable
from planner.units import GIB, SECONDS_PER_HOUR, kv_pool_text

DEFAULT_STEPS = 100  # a round number for the run figures when neither --steps nor --epochs
DEFAULT_MIN_SCALING = 1.5  # the speed-up a doubling of GPUs must bring to be worth it
MARKS = ("fastest", "cheapest", "smallest", "knee")


@dataclass(frozen=True)
class RunLength:
    steps: int
    text: str


def run_length(workload: Workload, steps: int | None = None, epochs: int | None = None,
               dataset_prompts: int | None = None) -> RunLength:
    """The run a sweep prices (see the module docstring)."""
    if steps is not None and (epochs is not None or dataset_prompts is not None):
        raise PlanInputError("--steps contradicts --epochs/--dataset-prompts; give the steps or "
                             "the epochs over a dataset")
    if epochs is None and dataset_prompts is None:
        if steps is None:
            return RunLength(DEFAULT_STEPS, f"{DEFAULT_STEPS:,} steps (default; set --steps, or "
                                            f"--epochs with --dataset-prompts)")
        return RunLength(steps, f"{steps:,} steps")
    if epochs is None or dataset_prompts is None:
        raise PlanInputError("--epochs and --dataset-prompts go together: verl runs "
                             "floor(prompts / --train-batch-size) steps per epoch")
    per_epoch = dataset_prompts // workload.dataset_rows_per_step
    if per_epoch < 1:
        raise PlanInputError(f"--dataset-prompts {dataset_prompts:,} is below one batch of "
                             f"--train-batch-size {workload.dataset_rows_per_step:,}; verl's "
                             f"dataloader drops the partial batch and would run no step")
    return RunLength(per_epoch * epochs,
                     f"{epochs} epoch{'s' if epochs > 1 else ''} x {per_epoch:,} steps "
                     f"({dataset_prompts:,} prompts / {workload.dataset_rows_per_step:,} per step) "
                     f"= {per_epoch * epochs:,} steps")


@dataclass(frozen=True)
class Blocked:
    """Why nothing fits at a count, from its closest miss: the phase that sets its peak (or
    ``generate`` for a KV cache that holds no sequence, ``host`` for host memory; None when no
    layout obeys the rules), the peak, the GPU's memory and the reason in words."""

    phase: str | None
    peak_bytes: float | None
    capacity_bytes: float
    reason: str


@dataclass(frozen=True)
class BlockedBelow:
    """The closest miss at the largest count below the smallest that fits."""

    num_gpus: int
    blocked: Blocked


@dataclass(frozen=True)
class SizingRow:
    """One GPU type at one count."""

    gpu: str
    num_gpus: int
    num_nodes: int
    valid: bool  # some layout obeys every rule
    fits: bool
    step_time_s: float | None = None  # expected over the run (planner.cost.trajectory)
    tokens_per_s_per_gpu: float | None = None
    run_time_s: float | None = None  # steps x expected step time: the run's integral
    gpu_hours: float | None = None
    price_per_gpu_hour: float | None = None
    cost: float | None = None
    layout: Layout | None = None
    peak_bytes: float | None = None
    peak_phase: str | None = None
    dominant_phase: str | None = None
    blocked: Blocked | None = None  # when nothing fits: why (the closest miss)
    marks: tuple[str, ...] = ()
    # step time at the run's first and last step (the mean response length moves)
    step_time_start_s: float | None = None
    step_time_end_s: float | None = None


@dataclass(frozen=True)
class TypeSummary:
    gpu: str
    capacity_bytes: float
    smallest_fit: int | None  # fewest GPUs that fit (among the counts swept)
    blocked_below: BlockedBelow | None  # the closest miss at the largest count below it
    knee: int | None
    knee_gain: float | None  # step(knee) / step(2 x knee)
    fastest: int | None
    cheapest: int | None


@dataclass
class Sizing:
    model: ModelSpec
    workload: Workload
    gpus_per_node: int
    run: RunLength
    prices: PriceTable | None
    min_scaling: float
    rows: list[SizingRow]
    types: list[TypeSummary] = field(default_factory=list)
    fastest: SizingRow | None = None  # shortest run over every type and count
    cheapest: SizingRow | None = None  # lowest cost among priced rows (None without prices)
    unpriced: tuple[str, ...] = ()  # GPU types swept without a price
    scored: int = 0  # actor layouts scored over the sweep
    cost: CostModel = field(default_factory=shipped_cost_model)  # the calibration it used


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def _blocked(result: CountResult) -> Blocked:
    """Why nothing fits at this count, from the closest miss."""
    gpu = result.cluster.gpu
    capacity = gpu.memory_bytes / GIB
    row = result.closest
    if row is None:
        top = [name for name, _ in sorted(result.rejected.items(), key=lambda item: -item[1])
               if name != "world_size"][:2]
        return Blocked(phase=None, peak_bytes=None, capacity_bytes=gpu.memory_bytes,
                       reason=f"no layout obeys the rules at {result.cluster.num_gpus} GPUs"
                              + (f" (most rejected by {', '.join(top)})" if top else ""))
    phase = str(row["peak_phase"])
    peak = float(row["peak_bytes"]) / GIB
    if peak > capacity:
        reason = f"{phase} needs {peak:.1f} GiB per GPU of {capacity:.1f} GiB"
    elif not bool(row["rollout_fits"]):
        pool = kv_pool_text(_plain(row["kv_cache_tokens_per_gpu"]),
                            bool(_plain(row.get("kv_pool_in_bytes", False))), "")
        reason = (f"generate: the rollout's KV cache ({pool}) cannot hold one sequence "
                  f"beside the resident state ({peak:.1f} GiB of {capacity:.1f} GiB)")
        phase = "generate"
    else:
        host = float(row["host_bytes_per_node"]) / GIB
        reason = (f"host memory: offload needs {host:.0f} GiB per node of "
                  f"{result.cluster.host_memory_per_node_bytes / GIB:.0f} GiB")
        phase = "host"
    return Blocked(phase=phase, peak_bytes=float(row["peak_bytes"]),
                   capacity_bytes=gpu.memory_bytes, reason=reason)


def row_of(result: CountResult, run: RunLength, prices: PriceTable | None) -> SizingRow:
    """A count's result as a sweep row, with the run's time, GPU-hours and cost."""
    cluster = result.cluster
    base = dict(gpu=cluster.gpu.name, num_gpus=cluster.num_gpus, num_nodes=cluster.num_nodes,
                valid=result.valid > 0)
    if result.best is None:
        return SizingRow(**base, fits=False, blocked=_blocked(result))
    row = result.best
    step_s = float(row["step_time_s"])
    gpu_hours = step_s * run.steps * cluster.num_gpus / SECONDS_PER_HOUR
    price = prices.price(cluster.gpu.name) if prices is not None else None
    dominant = row.get("dominant_phase")
    return SizingRow(
        **base, fits=True, step_time_s=step_s,
        step_time_start_s=float(row.get("step_time_start_s", step_s)),
        step_time_end_s=float(row.get("step_time_end_s", step_s)),
        tokens_per_s_per_gpu=float(row["tokens_per_s_per_gpu"]),
        run_time_s=step_s * run.steps, gpu_hours=gpu_hours, price_per_gpu_hour=price,
        cost=None if price is None else gpu_hours * price,
        layout=Layout.from_row(row), peak_bytes=float(row["peak_bytes"]),
        peak_phase=str(row["peak_phase"]),
        dominant_phase=None if dominant is None else (
            dominant if isinstance(dominant, str) else PHASES[int(dominant)]))


def knee(rows: list[SizingRow], min_scaling: float) -> tuple[int | None, float | None]:
    """The smallest fitting count N whose doubling (2N, also fitting) speeds the step up less
    than ``min_scaling``, and that speed-up."""
    step = {row.num_gpus: row.step_time_s for row in rows if row.fits}
    for count in sorted(step):
        if 2 * count in step:
            gain = step[count] / step[2 * count]
            if gain < min_scaling:
                return count, gain
    return None, None


def _first(rows: list[SizingRow], key: Callable[[SizingRow], float]) -> SizingRow | None:
    """The row with the smallest key; ties go to fewer GPUs."""
    return min(rows, key=lambda row: (key(row), row.num_gpus), default=None)


def _summarise(sizing: Sizing, gpus: tuple[GpuSpec, ...]) -> None:
    marked: dict[tuple[str, int], list[str]] = {}
    for gpu in gpus:
        rows = [row for row in sizing.rows if row.gpu == gpu.name]
        fitting = [row for row in rows if row.fits]
        fastest = _first(fitting, lambda row: row.step_time_s)
        cheapest = _first(fitting, lambda row: row.gpu_hours)
        smallest = _first(fitting, lambda row: row.num_gpus)
        knee_count, gain = knee(rows, sizing.min_scaling)
        below = [row for row in rows if not row.fits
                 and (smallest is None or row.num_gpus < smallest.num_gpus)]
        blocked = None
        if below:
            last = max(below, key=lambda row: row.num_gpus)
            blocked = BlockedBelow(last.num_gpus, last.blocked)
        for mark, row in (("fastest", fastest), ("cheapest", cheapest), ("smallest", smallest)):
            if row is not None:
                marked.setdefault((gpu.name, row.num_gpus), []).append(mark)
        if knee_count is not None:
            marked.setdefault((gpu.name, knee_count), []).append("knee")
        sizing.types.append(TypeSummary(
            gpu=gpu.name, capacity_bytes=gpu.memory_bytes,
            smallest_fit=None if smallest is None else smallest.num_gpus,
            blocked_below=blocked, knee=knee_count, knee_gain=gain,
            fastest=None if fastest is None else fastest.num_gpus,
            cheapest=None if cheapest is None else cheapest.num_gpus))
    sizing.rows = [replace(row, marks=tuple(m for m in MARKS
                                            if m in marked.get((row.gpu, row.num_gpus), ())))
                   for row in sizing.rows]
    fitting = [row for row in sizing.rows if row.fits]
    sizing.fastest = _first(fitting, lambda row: row.run_time_s)
    priced = [row for row in fitting if row.cost is not None]
    sizing.cheapest = _first(priced, lambda row: row.cost)
    sizing.unpriced = tuple(gpu.name for gpu in gpus
                            if sizing.prices is None or sizing.prices.price(gpu.name) is None)


def _auto_done(rows: list[SizingRow], min_scaling: float) -> bool:
    """``auto`` stops a GPU type once a doubling past a fitting count gained too little, or
    once the rules allow no layout above a fitting count (DP beyond the batch)."""
    if knee(rows, min_scaling)[0] is not None:
        return True
    fitted = False
    for row in sorted(rows, key=lambda row: row.num_gpus):
        fitted = fitted or row.fits
        if fitted and not row.valid:
            return True
    return False


@dataclass(frozen=True)
class SizingRequest:
    """What a sizing sweep is asked: the model and workload, the GPU types and counts to visit
    and the shape of their nodes, the run to price, when a doubling is worth it, and -- as in a
    plan's :class:`~planner.cost.request.PlanRequest` -- the search options, cost model and
    memory policy of every count's plan."""

    model: ModelSpec
    workload: Workload
    gpus: tuple[GpuSpec, ...]
    counts: GpuCounts
    run: RunLength
    gpus_per_node: int
    prices: PriceTable | None = None
    min_scaling: float = DEFAULT_MIN_SCALING
    options: SearchOptions = SearchOptions()
    cost: CostModel = field(default_factory=shipped_cost_model)
    policy: MemoryPolicy = DEFAULT_POLICY
    host_memory_gib: float | None = None
    auto_limit: int = AUTO_MAX_GPUS

    def plan_request(self, gpu: GpuSpec, count: int) -> PlanRequest:
        """The plan request of one GPU type at one count."""
        cluster = ClusterSpec(gpu=gpu, num_gpus=count,
                              gpus_per_node=min(self.gpus_per_node, count),
                              host_memory_gib=self.host_memory_gib)
        return PlanRequest(self.model, cluster, self.workload, self.options, self.cost,
                           self.policy)


def size_cluster(request: SizingRequest) -> Sizing:
    """The sweep: every GPU type at every count (``auto``: the doubling ladder until each type
    passes its knee), each with its best layout
    (:func:`planner.sizing.best_per_count.best_layout`)."""
    min_scaling, counts = request.min_scaling, request.counts
    if not min_scaling > 1:
        raise PlanInputError(f"--min-scaling {min_scaling} must be above 1 (a doubling of GPUs "
                             f"gains at most 2x)")
    ladder = (auto_counts(request.gpus_per_node, request.auto_limit) if counts.auto
              else counts.counts)
    sizing = Sizing(model=request.model, workload=request.workload,
                    gpus_per_node=request.gpus_per_node, run=request.run,
                    prices=request.prices, min_scaling=min_scaling, rows=[],
                    cost=request.cost)
    shared: dict = {}  # the probes' actor evaluations, shared by the GPU types at each count
    for gpu in request.gpus:
        rows: list[SizingRow] = []
        for count in ladder:
            result = best_layout(request.plan_request(gpu, count), shared=shared)
            sizing.scored += result.scored
            rows.append(row_of(result, request.run, request.prices))
            if counts.auto and _auto_done(rows, min_scaling):
                break
        sizing.rows += rows
    _summarise(sizing, request.gpus)
    return sizing
