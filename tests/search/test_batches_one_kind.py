"""planner.search.batches: where every row batches one way (all dynamic, or all fixed), only
that way's values are computed; the numbers are those of ``np.where`` over both ways, to the
bit (the formulas below are the module's before that shortcut)."""

import numpy as np
import pytest

from planner.catalog.workload import GrpoWorkload
from planner.search import batches


def _both_ways(workload, cols, sequences, micro, budget):
    """Every field computed both ways and picked per row (the module's former code)."""
    f = batches._f
    cp = f(cols["cp"])
    dynamic = np.asarray(cols["dynamic_batch"]).astype(bool)
    seq_max, seq_mean = float(workload.sequence_length), float(workload.mean_sequence_length)
    micro = np.maximum(f(micro), 1)
    static_count = np.maximum(np.ceil(sequences / micro), 1)
    rank_tokens = sequences * seq_mean
    group = np.where(cols["vpp"] > 1, f(cols["pp"]), 1.0)

    def packed(tokens):
        count = np.clip(np.ceil(tokens / np.maximum(f(budget) * cp, 1)), 1,
                        np.maximum(sequences, 1))
        return np.ceil(count / group) * group

    count = np.where(dynamic, packed(rank_tokens), static_count)
    return (np.where(dynamic, f(budget), micro * seq_max / cp),
            np.where(dynamic, rank_tokens / count / cp, micro * seq_mean / cp), count,
            np.where(dynamic, packed(sequences * seq_max), static_count))


@pytest.mark.parametrize("kind", ["dynamic", "fixed", "mixed"])
@pytest.mark.parametrize("workload", [GrpoWorkload(), GrpoWorkload(
    train_batch_size=512, rollout_n=16, prompt_length=2048, response_length=8192,
    mini_batch_size=32)], ids=["default", "dapo"])
def test_one_kind_of_batching_gives_the_same_bits(kind, workload):
    rng = np.random.default_rng(7)
    n = 3000
    cols = {"tp": np.ones(n, dtype=np.int64), "cp": rng.choice([1, 2, 4], n),
            "vpp": rng.choice([1, 2], n), "pp": rng.choice([1, 2, 4, 8], n),
            "dp": rng.choice([1, 2, 8, 64], n), "micro_batch": rng.choice([1, 2, 4], n),
            "max_token_len": rng.choice([4096, 16384], n)}
    cols["dynamic_batch"] = {"dynamic": np.broadcast_to(True, (n,)),
                             "fixed": np.broadcast_to(False, (n,)),
                             "mixed": rng.random(n) > 0.5}[kind]
    sequences = batches._f(workload.sequences_per_mini_batch) / cols["dp"]
    got = batches._batches(workload, cols, sequences, cols["micro_batch"], cols["max_token_len"])
    want = _both_ways(workload, cols, sequences, cols["micro_batch"], cols["max_token_len"])
    for name, values, expected in zip(("memory_tokens", "mean_tokens", "count", "memory_count"),
                                      (got.memory_tokens, got.mean_tokens, got.count,
                                       got.memory_count), want):
        assert values.dtype == expected.dtype and values.flags.writeable, name
        np.testing.assert_array_equal(values.view(np.uint64), expected.view(np.uint64),
                                      err_msg=name)
    np.testing.assert_array_equal(batches.update_batch_count(workload, cols),
                                  batches.update_batches(workload, cols).count)
