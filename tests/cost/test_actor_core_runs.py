"""The actor's core parts (planner.cost.memory ``_actor_core``) computed once per run of rows of
one layout, and of one layout and micro-batch, then spread over the rows: every array equals the
former per-row evaluation (kept below as the reference) to the bit, dtype included, on a
search's rows, its core rows, the rows shuffled (runs of one row) and rows with varied recompute
settings."""

from dataclasses import replace

import numpy as np
import pytest
from conftest import cluster

from planner.catalog.lengths import ResponseLengths
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload, PretrainWorkload
from planner.cost import memory as m
from planner.cost.request import PlanRequest
from planner.cost.speculative import mtp_stage_params
from planner.search.batches import log_prob_batches, update_batches
from planner.search.space import SearchOptions, build_space

SMALL = GrpoWorkload(train_batch_size=64, rollout_n=4, mini_batch_size=16)
MOVING = replace(SMALL, lengths=ResponseLengths(400.0, 900.0, SMALL.response_length))


def _per_row(request: PlanRequest, cols) -> list[dict]:
    """The former ``_actor_core``: every value computed on every row."""
    model, cluster_, workload = request.model, request.cluster, request.workload
    update = update_batches(workload, cols)
    log_prob = log_prob_batches(workload, cols)
    train_tokens, forward_tokens = update.memory_tokens, log_prob.memory_tokens
    state = m.optimizer_state_bytes(workload)
    grad_bytes = m.MAIN_GRAD_BYTES if getattr(workload, "grad_reduce_in_fp32", True) else 2
    all_ranks = m.rank_layers(model, cols)
    owned = m.optimizer_params_all(model, cluster_, cols, all_ranks)
    mtp_dense, mtp_expert = mtp_stage_params(model, workload, cols["tp"], cols["ep"], cols["etp"])
    dense_shards, expert_shards = m.optimizer_shards(cluster_, cols)
    mtp_owned = mtp_dense / dense_shards + mtp_expert / expert_shards
    mtp_kept, mtp_logits = m.mtp_training_bytes(model, workload, cols, train_tokens)
    train_none = m.LayerActivations.of(model, cols, train_tokens)
    train_kept = m.LayerActivations.of(model, cols, train_tokens, cols["recompute"])
    forward_none = m.LayerActivations.of(model, cols, forward_tokens)
    out = []
    for ranks, (non_expert, expert), params in zip(
            all_ranks, m.actor_params_per_gpu(model, cols, all_ranks), owned):
        held = non_expert + expert + np.where(ranks.head, mtp_dense + mtp_expert, 0)
        params = params + np.where(ranks.head, mtp_owned, 0)
        in_flight = m.in_flight_stage_equivalents(cols, update.memory_count, ranks.rank)
        kept, recompute_working = m.kept_activations(cols, ranks, train_none, train_kept)
        working = forward_none.working_set(ranks)
        is_first, is_last = ranks.embedding, ranks.head
        embedding_inputs = np.where(is_first, m.TOKEN_ID_BYTES * train_tokens * in_flight, 0)
        out.append({
            "weights": m.WEIGHT_BYTES * held,
            "grads": grad_bytes * held,
            "optimizer_state": state * params,
            "optimizer_params": params,
            "train_activations": kept * in_flight + recompute_working + embedding_inputs
            + np.where(is_last, mtp_kept * in_flight, 0),
            "train_logits": np.where(is_last, m.logits_bytes(model, workload, cols, train_tokens,
                                                             "train") + mtp_logits, 0),
            "forward": working + m.ACTIVATION_BYTES * model.hidden_size * forward_tokens,
            "actor_logits": np.where(is_last, m.logits_bytes(model, workload, cols,
                                                             forward_tokens, "actor"), 0),
            "ref_logits": np.where(is_last, m.logits_bytes(model, workload, cols, forward_tokens,
                                                           "ref"), 0),
        })
    return out


def _assert_same_bits(got: list[dict], expected: list[dict]) -> None:
    assert len(got) == len(expected)
    for stage, (mine, reference) in enumerate(zip(got, expected)):
        assert mine.keys() == reference.keys()
        for name, values in reference.items():
            values, mine_values = np.asarray(values), np.asarray(mine[name])
            assert mine_values.dtype == values.dtype, (stage, name)
            assert mine_values.shape == values.shape, (stage, name)
            assert mine_values.tobytes() == values.tobytes(), (stage, name)


JOBS = [
    ("qwen2.5-7b", 8, replace(SMALL, use_kl_loss=False)),  # dense, no reference model
    ("qwen3-30b", 16, MOVING),  # MoE, moving lengths
    ("deepseek-v3", 64, GrpoWorkload(train_mtp=True)),  # MLA, MTP layers trained
    ("qwen3-30b", 16, PretrainWorkload()),  # no rollout
]


@pytest.mark.parametrize("name, world, workload", JOBS)
def test_runs_give_the_per_row_bits(name, world, workload):
    request = PlanRequest(resolve_model(name), cluster(world), workload)
    cols = build_space(request.model, request.cluster, workload, SearchOptions()).columns
    knobs, knob = m._knob_combinations(cols)
    core_rows, _ = m._core_rows(cols, knob, len(knobs))
    assert len(m.runs_of_rows(core_rows, ("tp", "pp"))[0]) < len(core_rows["tp"])
    _assert_same_bits(m._actor_core(request, core_rows), _per_row(request, core_rows))
    # every row of the search (runs of a layout's knob combinations), and the rows shuffled
    _assert_same_bits(m._actor_core(request, cols), _per_row(request, cols))
    order = np.random.default_rng(7).permutation(len(cols["tp"]))[:3000]
    shuffled = {name: np.asarray(values)[order] for name, values in cols.items()}
    _assert_same_bits(m._actor_core(request, shuffled), _per_row(request, shuffled))


def test_varied_recompute_settings_give_the_per_row_bits():
    """Full recompute in chunks or blocks of several layers, per row (the rows of full
    recompute are evaluated alone)."""
    request = PlanRequest(resolve_model("qwen3-30b"), cluster(16), SMALL)
    cols = dict(build_space(request.model, request.cluster, SMALL, SearchOptions()).columns)
    n = len(cols["tp"])
    rng = np.random.default_rng(11)
    cols["recompute_num_layers"] = rng.integers(1, 5, n)
    cols["recompute_block"] = rng.random(n) < 0.5
    assert (cols["recompute"] == 2).any() and (cols["recompute"] != 2).any()
    _assert_same_bits(m._actor_core(request, cols), _per_row(request, cols))
    none_full = {**cols, "recompute": np.where(cols["recompute"] == 2, 1, cols["recompute"])}
    _assert_same_bits(m._actor_core(request, none_full), _per_row(request, none_full))


def test_runs_of_rows_compare_floats_by_their_bits():
    cols = {"tp": np.array([1, 1, 1, 2, 2]), "x": np.array([0.0, -0.0, -0.0, np.nan, np.nan])}
    first, lengths = m.runs_of_rows(cols, ("tp", "x"))
    assert first.tolist() == [0, 1, 3] and lengths.tolist() == [1, 2, 2]
    first, lengths = m.runs_of_rows(cols, ("tp",))
    assert first.tolist() == [0, 3] and lengths.tolist() == [3, 2]
    empty = m.runs_of_rows({"tp": np.zeros(0, dtype=np.int64)}, ("tp",))
    assert empty[0].tolist() == [] and empty[1].tolist() == []


def _former_knob_combinations(cols):
    """The former ``_knob_combinations``: the combination coded as an int64 sum."""
    flags = [np.asarray(cols[name]).astype(bool)
             for name in ("param_offload", "optimizer_offload", "ref_param_offload")]
    on_host = m.cpu_fraction(cols)
    _, fraction = m.distinct(on_host)
    first, which = m.distinct(flags[0] + 2 * flags[1] + 4 * flags[2] + 8 * fraction)
    return [m._Knobs(bool(flags[0][i]), bool(flags[1][i]), bool(flags[2][i]), float(on_host[i]))
            for i in first], which


@pytest.mark.parametrize("fractions", [None, 3, 40])
def test_knob_combinations_coded_in_a_byte_are_the_former_ones(fractions):
    request = PlanRequest(resolve_model("qwen3-30b"), cluster(16), SMALL)
    cols = dict(build_space(request.model, request.cluster, SMALL, SearchOptions()).columns)
    if fractions:  # more distinct CPU-optimizer fractions than a byte's code holds (40)
        rng = np.random.default_rng(fractions)
        cols["optimizer_cpu_fraction"] = rng.integers(0, fractions, len(cols["tp"])) / fractions
    knobs, which = m._knob_combinations(cols)
    former, former_which = _former_knob_combinations(cols)
    assert knobs == former
    assert which.dtype == former_which.dtype and which.tobytes() == former_which.tobytes()


@pytest.mark.parametrize("size", [1, 2, 12])
def test_constant_blocks_counted_over_the_column_are_those_compared_per_block(size):
    rng = np.random.default_rng(size)
    blocks = 500
    columns = [np.repeat(rng.integers(0, 3, blocks), size),  # constant per block
               rng.integers(0, 2, blocks * size),  # changes inside blocks (size > 1)
               np.repeat(rng.random(blocks) < 0.5, size),
               np.repeat(np.where(rng.random(blocks) < 0.5, 0.0, -0.0), size),  # 0.0 == -0.0
               np.repeat(np.array([1.0, np.nan])[rng.integers(0, 2, blocks)], size),
               np.repeat(rng.choice(np.array(["", "Et|tL"]), blocks), size),
               np.zeros(0, dtype=np.int64)]
    for column in columns:
        shaped = column.reshape(-1, size)
        expected = bool((shaped == shaped[:, :1]).all())
        assert m._constant_in_blocks([column], size) == expected, column[:8]
    assert m._constant_in_blocks([], size)
