"""The pruned search gives the exhaustive search's answer (issue 24).

The default search merges layouts that build the same pipeline stages as a simpler one
(:func:`planner.search.space.equivalent_splits`) and shares the actor evaluation between plans of
one request; ``SearchOptions(exhaustive=True)`` scores every valid combination.  On dense, MoE and
MLA models, in the sync, one-step-off and fully-async modes, ``--mode best`` and a sizing sweep,
both return the same best layout, the same fits verdict and the same tie set (merged layouts
compared by the stages they build).  A plan read only at its head (the filled-GPU plan, a sizing
refinement: ``keep`` with a strict ranking) also leaves untimed the layouts whose expected step
time ranks them after its head; it returns the exhaustive plan's first rows, number for number.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.lengths import ResponseLengths
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload, PretrainWorkload
from planner.cost.request import PlanRequest
from planner.modes import get_mode
from planner.modes.registry import plan_all
from planner.plan import PlanReads, make_plan
from planner.policy import FILL_POLICY
from planner.search.layout import LAYOUT_FIELDS
from planner.search.pipeline import pipeline_split
from planner.search.space import SPLIT_FIELDS, SearchOptions, build_space
from planner.sizing.counts import parse_counts
from planner.sizing.sweep import SizingRequest, run_length, size_cluster

SMALL = GrpoWorkload(train_batch_size=64, rollout_n=4, mini_batch_size=16)
# the mean response length moving over the run (the CLI's default): three time evaluations
MOVING = replace(SMALL, lengths=ResponseLengths(400.0, 900.0, SMALL.response_length))


def request(model: str, gpus: int, gpu: str = "h100", workload=SMALL,
            exhaustive: bool = False) -> PlanRequest:
    return PlanRequest(resolve_model(model), ClusterSpec(get_gpu(gpu), gpus, 8), workload,
                       options=SearchOptions(exhaustive=exhaustive))


def exhaustive(req: PlanRequest) -> PlanRequest:
    return replace(req, options=replace(req.options, exhaustive=True))


def stage_keys(plan, frame) -> set[tuple]:
    """Each row as the job it builds: its layout with the split settings replaced by the
    transformer layers on the first, middle and last stage."""
    first, middle, last, _ = pipeline_split(
        plan.model.num_layers, frame["pp"].to_numpy(), frame["first_stage_layers"].to_numpy(),
        frame["last_stage_layers"].to_numpy(), frame["account_embedding"].to_numpy(),
        frame["account_loss"].to_numpy())
    middle = np.where(frame["pp"].to_numpy() > 2, middle, 0)
    names = [name for name in LAYOUT_FIELDS if name not in SPLIT_FIELDS and name in frame]
    columns = [frame[name].astype(str).to_numpy() for name in names]
    return set(zip(*columns, first, middle, last))


def assert_same_plan(pruned, full) -> None:
    assert pruned.fitting_count > 0 or full.fitting_count == 0
    assert (pruned.fitting_count > 0) == (full.fitting_count > 0)
    assert pruned.valid == full.valid and pruned.enumerated == full.enumerated
    assert pruned.scored + pruned.merged == full.scored
    if not full.fitting_count:
        return
    assert pruned.candidate(0, fitting=True).layout == full.candidate(0, fitting=True).layout
    assert pruned.candidate(0).step_time_s == full.candidate(0).step_time_s
    tied = pruned.candidates[pruned.candidates["within_error_of_best"]]
    full_tied = full.candidates[full.candidates["within_error_of_best"]]
    assert stage_keys(pruned, tied) == stage_keys(full, full_tied)
    # every layout that fits is there, merged twins aside
    assert stage_keys(pruned, pruned.fitting) == stage_keys(full, full.fitting)


SYNC_JOBS = [
    ("qwen3-8b", 8, "h100", SMALL),  # dense
    ("qwen2.5-7b", 8, "h100", SMALL),  # dense, 28 layers (uneven end stages)
    ("qwen3-30b", 16, "h100", SMALL),  # MoE
    ("moonlight-16b", 16, "h100", SMALL),  # MLA MoE, 27 layers
    ("llama3.1-70b", 16, "h100", SMALL),  # dense, 80 layers, needs PP
    ("qwen3-8b", 16, "h20", GrpoWorkload()),  # default workload on another GPU
    ("qwen3-30b", 16, "h100", MOVING),  # MoE, timed at three points of the run
    ("moonlight-16b", 16, "h100", MOVING),  # MLA MoE, timed at three points of the run
    ("llama3.1-8b", 16, "h100", PretrainWorkload(seq_len=4096, global_batch=64)),  # pretraining
]


@pytest.mark.parametrize("model,gpus,gpu,workload", SYNC_JOBS,
                         ids=[f"{job[0]}x{job[1]}-{job[2]}" for job in SYNC_JOBS])
def test_sync_plan_matches_exhaustive(model, gpus, gpu, workload):
    req = request(model, gpus, gpu, workload)
    assert_same_plan(make_plan(req), make_plan(exhaustive(req)))


FILL_JOBS = [("qwen3-8b", 8), ("qwen3-30b", 16), ("moonlight-16b", 16), ("llama3.1-70b", 16)]


@pytest.mark.parametrize("model,gpus", FILL_JOBS, ids=[f"{m}x{g}" for m, g in FILL_JOBS])
def test_filled_gpu_plan_shares_the_actor_evaluation(model, gpus):
    """The filled-GPU plan reads its best alone (``keep=1``, a strict ranking): it reuses the
    actor evaluation, times only the layouts that can lead (``planner.plan._rows_that_can_lead``)
    and ranks by a partial sort -- the exhaustive plan's best, to the last digit."""
    req = request(model, gpus, workload=MOVING)
    plan = make_plan(req)
    filled = replace(req, policy=FILL_POLICY)
    shared = make_plan(filled, tie_tolerance=0.0, actors=plan.actors, reads=PlanReads(keep=1))
    alone = make_plan(replace(filled, options=replace(req.options, exhaustive=True)),
                      tie_tolerance=0.0)
    assert shared.actors is plan.actors  # not computed again
    assert len(shared.candidates) == 1
    # the counts are every layout's (the exhaustive plan also counts the merged twins)
    assert shared.fitting_count == shared.fit_total > 0
    assert shared.candidate(0, fitting=True).layout == alone.candidate(0, fitting=True).layout
    mine, theirs = shared.candidates.iloc[0], alone.candidates.iloc[0]
    for name in ("step_time_s", "step_time_start_s", "step_time_end_s", "peak_bytes",
                 "time_generate_s_fill"):
        assert mine[name] == theirs[name], name


def test_a_plan_read_at_its_head_times_only_the_layouts_that_can_lead():
    """The pruning path runs (most fitting layouts go untimed) and keeps the first rows of the
    ranking, strict or with the model's ties moved to the top, the ties in step time and
    memory-tight tiers included."""
    from planner.plan import Head, choose_rollout, score_rows

    req = request("qwen3-30b", 16, workload=MOVING)
    plan = make_plan(req, tie_tolerance=0.0)
    space = plan.actors.space
    cols, actor = choose_rollout(req, space.columns, space.rollouts, None, plan.actors.memory)
    rows = score_rows(req, cols, actor, pick_utilization=True, time_rows=Head(5))
    fits = rows.column("fits").astype(bool)
    assert 0 < rows.timed.sum() < fits.sum() / 2
    assert not (rows.timed & ~fits).any()
    tolerance = req.cost.uncertainty
    tied = score_rows(req, cols, actor, pick_utilization=True, time_rows=Head(5, tolerance))
    assert rows.timed.sum() <= tied.timed.sum() < fits.sum()
    ranked = make_plan(req, actors=plan.actors)  # the model's tie tolerance
    assert ranked.ties > 5
    for count in (1, 5, 40):
        for full, tie_tolerance in ((plan, 0.0), (ranked, None)):
            head = make_plan(req, tie_tolerance=tie_tolerance, actors=plan.actors,
                             reads=PlanReads(keep=count))
            for name in ("tp", "pp", "vpp", "cp", "ep", "micro_batch", "step_time_s",
                         "step_time_start_s", "step_time_end_s", "peak_bytes",
                         "within_error_of_best", "rank"):
                np.testing.assert_array_equal(head.candidates[name].to_numpy(),
                                              full.candidates[name].to_numpy()[:count])


def test_the_weight_sync_does_not_move_with_the_response_length():
    """The weight-sync phase's time (with its offload trip and the step's fixed costs) is the
    same at every point of the run: it reads no response length (what a plan's head once
    bounded the expected step time with, before it found every row's own)."""
    from planner.cost.memory import estimate_memory
    from planner.cost.timing import step_columns
    from planner.cost.trajectory import node_lengths, request_at
    from planner.plan import choose_rollout

    req = request("qwen3-30b", 16, workload=MOVING)
    actors = make_plan(req).actors
    cols, _ = choose_rollout(req, actors.space.columns, actors.space.rollouts, None,
                             actors.memory)
    cols = {name: values[::7] for name, values in cols.items()}
    memory = estimate_memory(req, cols, pick_utilization=True)
    lengths = req.workload.lengths
    assert not lengths.constant
    syncs = [step_columns(request_at(req, point), cols, memory)["time_weight_sync_s"]
             for point in node_lengths(lengths)]
    np.testing.assert_array_equal(syncs[0], syncs[1])
    np.testing.assert_array_equal(syncs[1], syncs[2])


def mode_best(plan):
    best = plan.best
    return None if best is None else (best.layout, best.placement, best.step_time_s)


@pytest.mark.parametrize("mode,model,gpus", [
    ("one-step-off", "qwen3-8b", 16),
    ("fully-async", "qwen3-8b", 16),
    ("one-step-off", "qwen3-30b", 16),
])
def test_async_mode_matches_exhaustive(mode, model, gpus):
    req = request(model, gpus)
    pruned = get_mode(mode).plan(req, top=5)
    full = get_mode(mode).plan(exhaustive(req), top=5)
    assert (pruned.best is None) == (full.best is None)
    assert mode_best(pruned) == mode_best(full)


def test_mode_best_matches_exhaustive():
    req = request("qwen3-8b", 16)
    pruned, full = plan_all(req), plan_all(exhaustive(req))
    assert [plan.mode for plan in pruned] == [plan.mode for plan in full]
    assert [mode_best(plan) for plan in pruned] == [mode_best(plan) for plan in full]


def test_sizing_sweep_matches_exhaustive():
    gpus = (get_gpu("h100"), get_gpu("h20"))
    counts = parse_counts("8-24", 8)

    def sweep(full: bool):
        return size_cluster(SizingRequest(resolve_model("qwen3-30b"), SMALL, gpus, counts,
                                          run_length(SMALL, 100), gpus_per_node=8,
                                          options=SearchOptions(exhaustive=full)))

    pruned, full = sweep(False), sweep(True)
    assert [(r.gpu, r.num_gpus, r.fits, r.layout, r.step_time_s) for r in pruned.rows] \
        == [(r.gpu, r.num_gpus, r.fits, r.layout, r.step_time_s) for r in full.rows]


def test_equivalent_splits_are_merged_and_counted():
    """Qwen3-30B on 16 GPUs: at PP 2 the even split and the embedding and loss both counted
    build 24 + 24 layers; one row is kept (the plain split) and the merge is counted.  Only
    rows the rules accept are merged: where the interleaving accepts one split alone, it
    stays."""
    model, cluster = resolve_model("qwen3-30b"), ClusterSpec(get_gpu("h100"), 16, 8)
    pruned = build_space(model, cluster, GrpoWorkload())
    full = build_space(model, cluster, GrpoWorkload(), SearchOptions(exhaustive=True))
    assert pruned.merged > 0 and full.merged == 0
    assert len(pruned) + pruned.merged == len(full)
    assert pruned.valid == full.valid

    def both_counted(cols):  # PP 2 without interleaving: 24 + 24 layers either way
        at = (cols["pp"] == 2) & (cols["vpp"] == 1)
        return (cols["account_embedding"] & cols["account_loss"])[at]

    assert both_counted(full.columns).any() and not both_counted(pruned.columns).any()
    # with VPP 5 only the counted split divides (25 = 24 layers + the embedding per stage)
    at = (pruned.columns["pp"] == 2) & (pruned.columns["vpp"] == 5)
    assert at.any() and pruned.columns["account_embedding"][at].all()


def test_a_plan_that_keeps_few_rows_counts_every_layout():
    from planner.errors import PlanInputError
    from planner.verl.export import job_from_plan

    req = request("qwen3-8b", 8)
    full, short = make_plan(req), make_plan(req, reads=PlanReads(keep=3))
    assert len(short.candidates) == 3 and short.fitting_count == full.fitting_count
    assert short.candidate(2).layout == full.candidate(2).layout
    assert job_from_plan(short, rank=3).layout == full.candidate(2).layout
    with pytest.raises(PlanInputError, match=f"keeps the first 3 of its {full.fitting_count}"):
        job_from_plan(short, rank=4)
