"""What the cost model computes once per model or per batch of layouts gives the numbers it
computed every time: the model's cached hash, the activation bytes memoised per model and
computed once for every pipeline stage, the per-model loops over the layers."""

import dataclasses
import pickle

import numpy as np
import pytest

from planner.catalog.models import resolve_model
from planner.cost import flops
from planner.cost.memory import (
    LayerActivations,
    activation_bytes_per_layer,
    activation_bytes_per_token,
    rank_layers,
)

MODELS = ("qwen3-30b", "deepseek-v3", "qwen3-8b")


@pytest.mark.parametrize("name", MODELS)
def test_the_cached_hash_is_the_dataclass_hash_and_stays_in_its_process(name):
    model = resolve_model(name)
    fields = tuple(getattr(model, f.name) for f in dataclasses.fields(model))
    assert hash(model) == hash(fields)
    copy = dataclasses.replace(model)
    assert copy == model and hash(copy) == hash(model) and {model: 1}[copy] == 1
    assert hash(dataclasses.replace(model, name="other")) != hash(model)
    restored = pickle.loads(pickle.dumps(model))
    assert "_field_hash" not in restored.__dict__ and restored == model
    assert hash(restored) == hash(model)


def _rows(rng, n=400):
    return {"tp": rng.choice([1, 2, 4, 8], n), "etp": rng.choice([1, 2, 4], n),
            "sequence_parallel": rng.choice([False, True], n),
            "recompute_modules": rng.choice([0, 3, 5, 64], n),
            "pp": rng.choice([1, 2, 4], n), "vpp": np.ones(n, dtype=np.int64)}


@pytest.mark.parametrize("name", MODELS)
def test_memoised_activation_bytes_equal_the_formula_row_by_row(name):
    model = resolve_model(name)
    rng = np.random.default_rng(7)
    for _ in range(3):  # the later calls read the memo
        cols = _rows(rng)
        recompute = rng.choice([0, 1, 2], len(cols["tp"]))
        tokens = rng.uniform(100, 1e5, len(cols["tp"]))
        for moe in (False, True):
            for dropout in (False, True):
                memoised = activation_bytes_per_layer(model, cols, tokens, moe, recompute,
                                                      dropout)
                formula = tokens * activation_bytes_per_token(model, cols, moe, recompute,
                                                              dropout)
                assert memoised.dtype == formula.dtype
                np.testing.assert_array_equal(memoised, formula)


@pytest.mark.parametrize("name", MODELS)
def test_layer_activations_read_per_stage_equal_the_per_stage_sums(name):
    model = resolve_model(name)
    cols = _rows(np.random.default_rng(3))
    tokens = np.full(len(cols["tp"]), 4096.0)
    kept = LayerActivations.of(model, cols, tokens, 1)
    for ranks in rank_layers(model, cols):
        dense = activation_bytes_per_layer(model, cols, tokens, False, 1)
        expected = ranks.dense * dense
        if model.is_moe:
            expected = expected + ranks.moe * activation_bytes_per_layer(model, cols, tokens,
                                                                         True, 1)
        np.testing.assert_array_equal(kept.on_rank(ranks), expected)


@pytest.mark.parametrize("name", MODELS)
def test_per_model_loops_are_cached_and_unchanged(name):
    model = resolve_model(name)
    copy = dataclasses.replace(model)
    assert flops.kv_grows_only(model) == all(layer.mixer.kv_grows for layer in model.layers)
    assert flops.mixer_matmul_per_layer(copy) == flops.mixer_matmul_per_layer(model)
    linear = flops.linear_params_per_token(model)
    linear["attention"] = -1.0  # a caller's copy: the cached figures stay
    assert flops.linear_params_per_token(model)["attention"] > 0
