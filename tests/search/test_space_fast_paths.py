"""build_space's faster paths give the former values to the bit: the rules checked in order on
the rows the earlier ones left (counts, their order and the valid mask of every rule checked on
every row), the split candidates by repeat and take, the tokens per CP rank from a table, and
pipeline_split computed per distinct split."""

from dataclasses import replace

import numpy as np
import pytest
from conftest import cluster

from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload, PretrainWorkload
from planner.search import pipeline, space
from planner.search.pipeline import split_candidates
from planner.search.rules import violations

SMALL = GrpoWorkload(train_batch_size=64, rollout_n=4, mini_batch_size=16)
JOBS = [("qwen2.5-7b", 8, replace(SMALL, use_kl_loss=False)), ("qwen3-30b", 16, SMALL),
        ("deepseek-v3", 256, GrpoWorkload()), ("qwen3-30b", 32, PretrainWorkload()),
        ("Qwen3-Next-80B-A3B", 16, SMALL), ("NVIDIA-Nemotron-3-Nano-30B-A3B", 8, SMALL)]


def _bits(cols: dict) -> dict:
    return {name: (np.asarray(values).dtype.str, np.asarray(values).shape,
                   np.ascontiguousarray(values).tobytes()) for name, values in cols.items()}


def _former_split_candidates(model, cols):
    """The former ``_with_split_candidates``: every column gathered by an index."""
    sizes = np.unique(cols["pp"])
    tables = [np.array(split_candidates(model.num_layers, int(pp)), dtype=np.int64).reshape(-1, 4)
              for pp in sizes]
    which = np.searchsorted(sizes, cols["pp"])
    counts = np.array([len(table) for table in tables])[which]
    rows = np.repeat(np.arange(len(cols["pp"])), counts)
    out = {name: values[rows] for name, values in cols.items()}
    offsets = np.concatenate([[0], np.cumsum([len(table) for table in tables])])
    within = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    flat = np.concatenate(tables)[offsets[which][rows] + within]
    out["first_stage_layers"], out["last_stage_layers"] = flat[:, 0], flat[:, 1]
    out["account_embedding"], out["account_loss"] = flat[:, 2] > 0, flat[:, 3] > 0
    return out


@pytest.mark.parametrize("name, world, workload", JOBS)
def test_rules_in_order_count_as_every_rule_on_every_row(name, world, workload):
    model, hardware = resolve_model(name), cluster(world)
    options = space.SearchOptions()
    grid = space.parallel_grid(model, hardware, options)
    parallel = space.parallel_options(model, hardware, options)
    assert _bits(parallel) == _bits(_former_split_candidates(model, grid))
    weights = np.random.default_rng(1).integers(0, 50, len(parallel["tp"]))
    for weight in (7, weights):
        for names in (space.SPLIT_FREE_RULES, space.SPLIT_RULES, space.PARALLEL_RULES):
            rules = space._rules(names)
            former, mine = {"earlier": 1}, {"earlier": 1}
            expected = space._count(former, names, violations(model, hardware, workload,
                                                              parallel, rules), weight)
            got = space._valid_in_order(
                mine, rules, lambda rule, rows: rule.check(model, hardware, workload, rows),
                parallel, weight)
            assert list(mine.items()) == list(former.items())
            assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("cp", [np.array([1, 2, 4, 8, 16] * 1000), np.array([3, 5, 7] * 2000),
                                np.array([1, 2]), np.array([1, 5000] * 3000)])
def test_tokens_per_cp_rank_from_a_table_are_the_division(cp):
    for tokens in (1, 9216, 12_345):
        got, expected = space._per_cp_rank(tokens, cp), -(-tokens // cp)
        assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("num_layers", [1, 7, 48, 61, 94])
def test_pipeline_split_per_distinct_split_is_per_row(num_layers):
    rng = np.random.default_rng(num_layers)
    n = 3 * pipeline.DISTINCT_SPLIT_ROWS
    pp = rng.choice([1, 2, 3, 4, 8, 16], n)
    first, last = rng.integers(0, min(num_layers, 9) + 3, n), rng.integers(0, 9, n)
    first[rng.random(n) < 0.5] = 0
    last[rng.random(n) < 0.5] = 0
    embedding, loss = rng.random(n) < 0.3, rng.random(n) < 0.3
    args = (first, last, embedding, loss)
    assert pipeline._split_key(pp, first, last, (embedding, loss)) is not None
    got = pipeline.pipeline_split(num_layers, pp, *args)
    expected = pipeline._split_rows(num_layers, pp, (first, last), (embedding, loss))
    for mine, former in zip(got, expected, strict=True):
        assert mine.dtype == former.dtype and mine.tobytes() == former.tobytes()
    # split settings left unset (None) and few rows take the per-row path, the same values
    plain = pipeline.pipeline_split(num_layers, pp)
    zero = np.zeros(n, dtype=np.int64)
    former = pipeline._split_rows(num_layers, pp, (zero, zero), (zero > 0, zero > 0))
    assert all(a.tobytes() == b.tobytes() for a, b in zip(plain, former, strict=True))
    few = pipeline.pipeline_split(num_layers, pp[:10], *(a[:10] for a in args))
    assert all(a.tobytes() == b[:10].tobytes() for a, b in zip(few, expected, strict=True))
    # keys spanning more values than a table codes (wide stage sizes) take the per-row path
    wide = np.where(rng.random(n) < 0.01, 5000, first)
    assert pipeline._split_key(pp, wide, last, (embedding, loss)) is None
    got = pipeline.pipeline_split(num_layers, pp, wide, last, embedding, loss)
    expected = pipeline._split_rows(num_layers, pp, (wide, last), (embedding, loss))
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, expected, strict=True))
