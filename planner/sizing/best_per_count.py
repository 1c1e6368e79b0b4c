"""The best layout for one GPU type and GPU count, cheap enough to sweep dozens of counts.

A plan (:func:`planner.plan.make_plan`) crosses every parallel layout with every combination of
the per-GPU knobs (micro-batch, recompute, the three offloads, the CPU optimizer: 144 with the
default options) and scores them all.  A sizing sweep needs one answer per count -- the best
layout that fits, or the closest miss -- so it asks the plan twice, on smaller spaces:

1. **probe**: every parallel layout at VPP 1 with nine knob settings (:func:`probe_knobs`):
   every micro-batch with everything parked during the rollout (the most KV cache), the larger
   micro-batches with nothing offloaded (the fastest training), the optimizer and reference
   parked, and the two most frugal settings;
2. **refine**: the :data:`REFINE` best parallel layouts of the probe with every knob setting,
   the best :data:`VPP_REFINE` pipelined ones also at every VPP, each with the rollout options
   the probe chose for those layouts.

Every probe row is among the refined rows and keeps its score (same space, same rollout choice),
so the answer is never worse than the best probe, and it is the full plan's answer whenever the
plan's best layout is among the refined ones (``benchmarks/sizing_speed.py --check`` compares
the two: on the issue's benchmark most counts are exact and none is off by more than 0.3%).

When no probe fits, the frugal settings alone decide: the smallest micro-batch, the most
recompute, every offload combination over every parallel layout and VPP.  Memory falls with
each of them (a smaller micro-batch or token budget, fewer activations kept, less state
resident), so a count where none of those fits has no layout that fits, and the one with the
smallest peak is the plan's closest miss.  Tests compare both with full plans.

**Cost.**  A sweep makes two plans per GPU type and count (96 for 48 counts), each of a few
thousand layouts, so its time is the plans' fixed costs -- the calls of the cost model, each
spending its time in per-call Python rather than over rows -- not their rows: with response
lengths that move over the run, every plan calls the time model at the run's three points
(:mod:`planner.cost.trajectory`).  So every plan is timed in full: reading the refinement at
its head (:class:`planner.plan.Head`, what pays on a plan of millions of layouts) would time
its layouts once more, at the middle of the run, before the head's three points (measured on
the 48-count DAPO sweep: 432 calls of the GRPO step's time model instead of 288, about 10%
more CPU time).  The probes of the GPU types at one count share the search space and the
actor's memory (:class:`planner.plan.ActorEvaluation`); their refinements differ (each keeps
its own probe's first layouts) and are evaluated each.  A sweep reads each plan's columns
(:attr:`planner.plan.Plan.columns`), never its pandas frame, and asks for no fill columns
(``PlanReads.fill`` False: the memory band's headroom, which no sweep column shows), and
gathers the plans' ranked columns when it reads them (``PlanReads.lazy``,
:class:`planner.plan.RankedColumns`): the parallel and rollout columns of a probe's fitting
layouts and every column of a plan's first row, not the hundred columns of every layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from planner.catalog.hardware import ClusterSpec
from planner.cost.request import PlanRequest
from planner.plan import Plan, PlanReads, make_plan
from planner.search.layout import RECOMPUTE, unique_rows
from planner.search.space import PARALLEL_FIELDS, ROLLOUT_FIELDS, SearchOptions

REFINE = 12  # parallel layouts of the probe that get every knob setting
VPP_REFINE = 4  # of them, the pipelined ones that also get every VPP


@dataclass(frozen=True)
class CountResult:
    """One GPU type and count: the best layout that fits, or why none does."""

    cluster: ClusterSpec
    valid: int  # layouts that obey every rule (in the spaces searched; 0: none at this count)
    best: dict | None  # the best fitting layout's cost-model row (plan columns), None if none
    closest: dict | None  # when none fits: the layout with the smallest peak (its row)
    scored: int  # actor layouts scored over both stages
    rejected: dict[str, int] = field(default_factory=dict)  # of the probe space, by rule

    @property
    def fits(self) -> bool:
        return self.best is not None


def _pinned(options: SearchOptions, name: str, values: tuple) -> tuple:
    fixed = dict(options.fixed)
    return (fixed[name],) if name in fixed else tuple(values)


def _knob_values(options: SearchOptions) -> dict[str, tuple]:
    return {
        "micro_batch": _pinned(options, "micro_batch", sorted(options.micro_batches)),
        "recompute": tuple(sorted(options.recompute, key=RECOMPUTE.index)),
        "param_offload": _pinned(options, "param_offload", sorted(options.offload)),
        "optimizer_offload": _pinned(options, "optimizer_offload", sorted(options.offload)),
        "ref_param_offload": _pinned(options, "ref_param_offload",
                                     sorted(options.ref_param_offload)),
        "optimizer_cpu_fraction": tuple(sorted(options.optimizer_cpu_fraction)),
    }


def probe_knobs(options: SearchOptions) -> tuple[tuple, ...]:
    """The knob settings of the probe stage (:data:`KNOB_FIELDS` tuples), drawn from the values
    ``options`` allows."""
    v = _knob_values(options)
    mbs, fastest, frugal = v["micro_batch"], v["recompute"][0], v["recompute"][-1]
    middle = mbs[len(mbs) // 2]
    no_p, all_p = v["param_offload"][0], v["param_offload"][-1]
    no_o, all_o = v["optimizer_offload"][0], v["optimizer_offload"][-1]
    no_r, all_r = v["ref_param_offload"][0], v["ref_param_offload"][-1]
    gpu_optimizer, cpu_optimizer = v["optimizer_cpu_fraction"][0], v["optimizer_cpu_fraction"][-1]
    rows = [(mb, fastest, no_p, no_o, no_r, gpu_optimizer) for mb in mbs[len(mbs) // 2:]]
    rows += [(mb, fastest, all_p, all_o, all_r, gpu_optimizer) for mb in mbs]
    rows += [(middle, fastest, no_p, all_o, all_r, gpu_optimizer),
             (mbs[0], frugal, all_p, all_o, all_r, gpu_optimizer),
             (mbs[0], frugal, all_p, no_o, all_r, cpu_optimizer)]
    return tuple(dict.fromkeys(rows))


def frugal_knobs(options: SearchOptions) -> tuple[tuple, ...]:
    """The smallest micro-batch and the most recompute with every offload combination: the
    settings that decide whether anything fits."""
    v = _knob_values(options)
    return tuple((v["micro_batch"][0], v["recompute"][-1], p, o, r, cpu)
                 for p in v["param_offload"] for o in v["optimizer_offload"]
                 for r in v["ref_param_offload"] for cpu in v["optimizer_cpu_fraction"])


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def _top(plan: Plan, count: int) -> tuple[tuple[tuple, ...], tuple[tuple, ...]]:
    """The first ``count`` distinct parallel layouts (with their split) among the plan's fitting
    layouts, best first, and the rollout options the plan chose for any of their layouts."""
    rows = plan.fitting_rows()
    cols = {name: np.asarray(plan.columns[name])[rows] for name in PARALLEL_FIELDS + ROLLOUT_FIELDS}
    shapes, inverse = unique_rows(cols, PARALLEL_FIELDS)  # in order of appearance: best first
    top = [tuple(_plain(shapes[name][i]) for name in PARALLEL_FIELDS)
           for i in range(min(count, len(shapes["tp"])))]
    chosen = {name: cols[name][inverse < count] for name in ("tp",) + ROLLOUT_FIELDS}
    rollouts, _ = unique_rows(chosen, ROLLOUT_FIELDS)
    return tuple(top), tuple(tuple(_plain(rollouts[name][i]) for name in ROLLOUT_FIELDS)
                             for i in range(len(rollouts["rollout_tp"])))


VPP = PARALLEL_FIELDS.index("vpp")
PP = PARALLEL_FIELDS.index("pp")


def _with_vpp(rows: tuple[tuple, ...], options: SearchOptions, count: int) -> tuple[tuple, ...]:
    """``rows`` and, for the first ``count`` of them with a pipeline, every other VPP the options
    allow (the rules drop the ones that do not divide the stages)."""
    if "vpp" in dict(options.fixed):
        return rows
    piped = [row for row in rows if row[PP] > 1][:count]
    extra = [row[:VPP] + (vpp,) + row[VPP + 1:] for row in piped for vpp in options.vpp
             if vpp != row[VPP]]
    return tuple(dict.fromkeys(rows + tuple(extra)))


def _first(plan: Plan) -> dict | None:
    """The plan's best row as :attr:`planner.plan.Plan.candidates`' record (read from its
    columns: a sweep builds no frame)."""
    return plan.records(np.arange(1))[0] if plan.rows else None


def best_layout(request: PlanRequest, refine: int = REFINE,
                shared: dict | None = None) -> CountResult:
    """The best layout that fits the request's cluster, or the closest miss (see the module
    docstring).  Best is the fastest by the prediction (plans ranked with no tie tolerance):
    sizing compares counts and GPU types by step time, so it must not trade speed for
    simplicity.  ``shared``: the probes' actor evaluations of other GPU types, by count and
    probe (:meth:`planner.plan.ActorEvaluation.serves`); filled in here."""
    options, cluster = request.options, request.cluster
    shared = {} if shared is None else shared

    def plan(knobs=None, parallel=None, rollouts=None, vpp=options.vpp, probe: str = "") -> Plan:
        # the probes keep the split settings that build the same stages (exhaustive): see below.
        # Every plan here is timed in full (no ``keep``): a plan of a few thousand layouts costs
        # its calls of the time model, not its rows, and reading the refinement at its head
        # (planner.plan.Head) would time its layouts once more, at the middle of the run, first.
        # No fill columns (the memory band's headroom): the sweep reads none of them; and the
        # ranked columns gathered when read (lazy): a few of every layout, all of the best.
        key = (cluster.num_gpus, probe)
        made = make_plan(replace(request, options=replace(
            options, knob_rows=knobs, parallel_rows=parallel, rollout_rows=rollouts, vpp=vpp,
            exhaustive=bool(probe) or options.exhaustive)), tie_tolerance=0.0,
            actors=shared.get(key) if probe else None, reads=PlanReads.sweep())
        if probe:
            shared[key] = made.actors
        return made

    # VPP only adds activation memory (Megatron's interleaving penalty) and trims the update's
    # bubble: the probe leaves it at 1, the refinement tries the others.  The probes keep the
    # split settings that build the same stages at VPP 1 (exhaustive): they differ at higher
    # VPP, which the refinement tries for the probe's first layouts.
    probe = plan(knobs=probe_knobs(options), vpp=(1,), probe="probe")
    scored = probe.scored
    if not probe.fitting_count:
        frugal = plan(knobs=frugal_knobs(options), probe="frugal")
        scored += frugal.scored
        if not frugal.fitting_count:
            closest = min((p for p in (probe, frugal) if p.rows),
                          key=lambda p: float(p.columns["peak_bytes"][0]), default=None)
            return CountResult(cluster=cluster, valid=max(probe.valid, frugal.valid), best=None,
                               closest=None if closest is None else _first(closest),
                               scored=scored, rejected=probe.rejected)
        probe = frugal
    parallel, rollouts = _top(probe, refine)
    refined = plan(parallel=_with_vpp(parallel, options, VPP_REFINE), rollouts=rollouts)
    return CountResult(cluster=cluster, valid=probe.valid, best=_first(refined), closest=None,
                       scored=scored + refined.scored, rejected=probe.rejected)
