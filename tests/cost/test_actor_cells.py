"""The actor's memory is evaluated per core row and knob combination (planner.cost.memory
``actor_memory``): every row's numbers equal those of the same row evaluated on its own, to the
bit, whether the rows come as a search's cross product (blocks of knob combinations, read off)
or in any other order (hashed and gathered)."""

import numpy as np
import pytest
from conftest import cluster

from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.memory import STAGE_PARTS, actor_host_bytes, actor_memory, estimate_memory
from planner.cost.request import PlanRequest
from planner.phases import PHASES
from planner.search.space import SearchOptions, build_space


def _request(name: str, world: int, workload: GrpoWorkload | None = None) -> PlanRequest:
    return PlanRequest(resolve_model(name), cluster(world), workload or GrpoWorkload())


def _space(request: PlanRequest):
    return build_space(request.model, request.cluster, request.workload,
                       SearchOptions()).columns


def _memory_per_row(memory: dict) -> dict:
    out = {f"{phase}/{i}": values for phase, stages in memory["phases"].items()
           for i, values in enumerate(stages)}
    out.update({f"allocated/{phase}": values for phase, values in memory["allocated"].items()})
    out.update({f"{part}/{i}": stage[part] for i, stage in enumerate(memory["stages"])
                for part in STAGE_PARTS})
    return out


def _assert_same_bits(got: dict, expected: dict, rows=slice(None)) -> None:
    assert got.keys() == expected.keys()
    for name, values in expected.items():
        np.testing.assert_array_equal(got[name], np.asarray(values)[rows], err_msg=name)


@pytest.mark.parametrize("name, world, workload", [
    ("qwen3-30b", 16, GrpoWorkload()),
    ("qwen2.5-7b", 8, GrpoWorkload(use_kl_loss=False)),  # no reference model
    ("deepseek-v3", 64, GrpoWorkload()),
])
def test_a_cross_product_in_any_order_gives_every_row_the_same_bits(name, world, workload):
    request = _request(name, world, workload)
    cols = _space(request)
    memory = actor_memory(request, cols)
    assert memory["parts"]._offset == 0  # a search's cross product is read off
    order = np.random.default_rng(3).permutation(len(cols["tp"]))
    shuffled = actor_memory(request, {name: values[order] for name, values in cols.items()})
    assert shuffled["parts"]._offset is None
    _assert_same_bits(_memory_per_row(shuffled), _memory_per_row(memory), order)


def test_each_row_alone_gives_the_same_bits_as_in_the_search():
    request = _request("qwen3-8b", 8)
    cols = _space(request)
    memory = _memory_per_row(actor_memory(request, cols))
    # rows with every knob value: offloads, the CPU optimizer, several core rows
    for row in np.random.default_rng(5).choice(len(cols["tp"]), 40, replace=False):
        alone = actor_memory(request, {name: values[row:row + 1] for name, values in cols.items()})
        _assert_same_bits(_memory_per_row(alone), memory, slice(row, row + 1))


def test_the_peak_stage_parts_are_the_rows_stage_parts():
    request = _request("qwen3-30b", 16)
    cols = _space(request)
    actor = actor_memory(request, cols)
    rows = {**cols, "rollout_tp": np.full(len(cols["tp"]), 2),
            "rollout_dp": np.ones(len(cols["tp"]), dtype=np.int64),
            "rollout_ep": np.ones(len(cols["tp"]), dtype=np.int64),
            "gpu_memory_utilization": np.full(len(cols["tp"]), 0.5)}
    out = estimate_memory(request, rows, actor=actor)
    stage = out["peak_stage"]
    for part in ("weights", "grads", "optimizer", "train_activations", "train_logits",
                 "ref_weights"):
        expected = np.choose(stage, [actor["stages"][i][part] for i in range(4)])
        np.testing.assert_array_equal(out[f"{part}_bytes"], expected, err_msg=part)
    np.testing.assert_array_equal(out["host_bytes_per_gpu"],
                                  np.max([actor["stages"][i]["host"] for i in range(4)], axis=0))


def test_an_empty_set_of_rows_has_empty_phases():
    request = _request("qwen3-8b", 8)
    cols = {name: values[:0] for name, values in _space(request).items()}
    memory = actor_memory(request, cols)
    assert all(len(stage) == 0 for phase in PHASES for stage in memory["phases"][phase])


def test_a_zero_term_changes_no_bit():
    """The actor's knob sums add a term a knob zeroes as an exact 0 in that combination's
    cells (planner.cost.memory.ActorCells): the same bits as the sum without it."""
    rng = np.random.default_rng(11)
    a, b, c = (rng.random(1000) * 1e12 for _ in range(3))
    zero = np.zeros(1000)
    np.testing.assert_array_equal(a + zero + b + zero + 7.0, a + b + 7.0)
    np.testing.assert_array_equal(zero + a + c, a + c)
    np.testing.assert_array_equal(a * 1.0, a)  # the optimizer's GPU share of 1
    np.testing.assert_array_equal(a - zero, a)


@pytest.mark.parametrize("shape", [(50, 1), (50, 6), (0, 1)])
@pytest.mark.parametrize("mask", [[True] * 6, [False] * 6, [True, False, False, True, True, False]])
def test_masked_columns_is_np_where(shape, mask):
    """The (core row, combination) tables' knob-zeroed terms (_masked_columns): np.where's
    values to the bit, NaN, infinities and signed zeros included."""
    from planner.cost.memory import _masked_columns
    values = np.random.default_rng(5).choice([1.5e9, -0.0, np.nan, np.inf, 7.0], shape)
    where = np.array(mask)
    got = _masked_columns(values, where)
    want = np.where(where, values, 0.0)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))


@pytest.mark.parametrize("shuffle", [False, True], ids=["cross product", "gathered"])
def test_pick_reads_each_rows_stage(shuffle):
    """ActorParts.pick (one flat take of the stacked tables): each row's part on the stage it
    is given, the same bits as that stage's part on every row."""
    request = _request("deepseek-v3", 64)
    cols = _space(request)
    if shuffle:
        order = np.random.default_rng(4).permutation(len(cols["tp"]))
        cols = {name: values[order] for name, values in cols.items()}
    memory = actor_memory(request, cols)
    stages = memory["stages"]
    stage = np.random.default_rng(8).integers(0, len(stages), len(cols["tp"]))
    for part in ("weights", "grads", "optimizer", "train_activations", "train_logits",
                 "ref_weights"):
        want = np.choose(stage, [np.asarray(view[part], dtype=np.float64) for view in stages])
        np.testing.assert_array_equal(memory["parts"].pick(part, stage), want, err_msg=part)


@pytest.mark.parametrize("start, stop", [(0, 1000), (7, 5003), (12, 24), (5, 5), (3, 10**9)])
def test_a_range_of_held_rows_reads_the_cells_an_index_reads(start, stop):
    """ActorCells.rows on a slice (core rows and knobs laid out without dividing) gives every
    array the index path (which divides) gives on the same rows, to the bit."""
    request = _request("deepseek-v3", 64)
    cols = _space(request)
    cells = actor_memory(request, cols, reduced=True, held=True)["cells"]
    by_range = cells.rows(slice(start, stop))
    by_index = cells.rows(np.arange(start, min(stop, len(cells))))
    _assert_same_bits(_memory_per_row(by_range), _memory_per_row(by_index))
    for phase in by_index["reduced"]:
        for got, want in zip(by_range["reduced"][phase], by_index["reduced"][phase]):
            np.testing.assert_array_equal(got, want)


def _arrays(out: dict) -> dict:
    """Every array of ActorCells._spread's output, by name (the stage parts read per stage)."""
    arrays = {f"{phase}/{i}": values for phase, stages in out["phases"].items()
              for i, values in enumerate(stages)}
    arrays.update({f"allocated/{phase}": v for phase, v in out.get("allocated", {}).items()})
    for name, kept in out.get("reduced", {}).items():
        if isinstance(kept, tuple):
            arrays.update({f"{name}/index": kept[0], f"{name}/values": kept[1]})
        else:
            arrays[f"reduced/{name}"] = kept
    for i, stage in enumerate(out.get("stages", [])):
        arrays.update({f"{part}/{i}": stage[part] for part in STAGE_PARTS})
    return arrays


@pytest.mark.parametrize("name, world, workload, options", [
    ("deepseek-v3", 64, GrpoWorkload(), SearchOptions()),
    ("qwen2.5-7b", 8, GrpoWorkload(use_kl_loss=False), SearchOptions()),  # no reference
    ("qwen3-30b", 16, GrpoWorkload(), SearchOptions(optimizer_cpu_fraction=(0.0, 0.5, 1.0))),
    ("qwen3-8b", 8, GrpoWorkload(free_cache_engine=False),
     SearchOptions()),  # an awake engine joins every phase
])
@pytest.mark.parametrize("reduced", [True, False])
def test_the_sums_per_knob_pattern_are_the_cell_tables_sums(name, world, workload, options,
                                                            reduced):
    """ActorCells._spread sums each distinct pattern of kept terms once
    (planner.cost.knob_sums) and spreads it over the combinations: every array, to the bit
    (NaN, signed zeros), is the one of the (core row, combination) tables with every term in
    every cell (_spread_tables), on a range, an unaligned range, scattered rows and the
    rollout choice's phases alone."""
    request = PlanRequest(resolve_model(name), cluster(world), workload)
    cols = build_space(request.model, request.cluster, request.workload, options).columns
    cells = actor_memory(request, cols, reduced=True, held=True)["cells"]
    cells.reduced = reduced
    n = len(cells)
    scattered = np.sort(np.random.default_rng(2).choice(n, min(n, 3000), replace=False))
    for rows in (slice(0, n), slice(5, min(n, 40_005)), scattered):
        for only in (None, ("generate", "weight_sync"), ("generate",)):
            original = cells._spread

            def tables(*args, original=original):
                return cells._spread_tables(*args)

            got = _arrays(cells.rows(rows, only))
            cells._spread = tables
            try:
                want_out = cells.rows(rows, only)
                if only is None and "reduced" in want_out:
                    # the knob patterns' path keeps the busiest stage's host memory, found
                    # on the patterns: the tables' is found on the rows when first read
                    actor_host_bytes(want_out)
                want = _arrays(want_out)
            finally:
                cells._spread = original
            assert got.keys() == want.keys()
            for key, values in want.items():
                values = np.asarray(values)
                assert np.asarray(got[key]).dtype == values.dtype, key
                np.testing.assert_array_equal(np.asarray(got[key]).view(np.uint8),
                                              values.view(np.uint8), err_msg=key)
