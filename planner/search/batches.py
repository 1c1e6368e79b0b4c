"""How verl cuts a step's sequences into micro-batches, per DP rank: for the actor update (per
optimizer step) and for the forward-only log-prob passes (per step).

* Fixed micro-batches (``ppo_micro_batch_size_per_gpu`` / ``log_prob_micro_batch_size_per_gpu``):
  ``sequences / micro_batch`` micro-batches; memory is sized for ``micro_batch`` sequences of the
  maximum length, time follows the mean length.
* Dynamic batches (``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu`` /
  ``log_prob_max_token_len_per_gpu``): ``verl/utils/seqlen_balancing.py::rearrange_micro_batches``
  packs the rank's sequences into ``ceil(tokens / (budget * CP))`` micro-batches of balanced
  token counts (never more than there are sequences; with interleaved pipelines rounded up to a
  multiple of ``microbatch_group_size_per_vp_stage``, which defaults to PP).  Memory is sized
  for the budget; the count, and so the time, follows the mean length.  The micro-batches a
  pipeline holds in flight (:attr:`MicroBatches.memory_count`) are judged at the maximum length,
  as every memory figure is (issue 23): a step whose responses all run to the maximum packs
  into the most micro-batches, and 1F1B keeps up to PP of them.

Token counts are per GPU, i.e. per context-parallel rank (CP splits every sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.catalog.workload import DEFAULT_MEAN_RESPONSE_FRACTION, GrpoWorkload
from planner.search.layout import Columns


def mean_response_length(workload: GrpoWorkload) -> float:
    """Tokens generated per response on average (half the maximum when not given)."""
    return float(workload.mean_response_length
                 or DEFAULT_MEAN_RESPONSE_FRACTION * workload.response_length)


def mean_prompt_length(workload: GrpoWorkload) -> float:
    """Prompt tokens on average (the maximum when not given)."""
    return float(workload.mean_prompt_length or workload.prompt_length)


@dataclass(frozen=True)
class MicroBatches:
    """Micro-batches of one pass on one DP rank (arrays over layouts)."""

    memory_tokens: np.ndarray  # tokens per GPU of the largest micro-batch (what memory holds)
    mean_tokens: np.ndarray  # tokens per GPU of an average micro-batch (what time follows)
    count: np.ndarray  # micro-batches (per optimizer step for the update, per step else)
    # micro-batches when every sequence has the maximum length (what memory holds in flight)
    memory_count: np.ndarray


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _either(dynamic: np.ndarray, if_dynamic, if_fixed) -> np.ndarray:
    """``np.where(dynamic, if_dynamic(), if_fixed())`` (float64), computing one side alone
    where every row is of one kind (the same numbers: ``np.where`` of one side)."""
    if len(dynamic) and (dynamic.all() or not dynamic.any()):
        value = if_dynamic() if dynamic[0] else if_fixed()
        return np.array(np.broadcast_to(value, dynamic.shape), dtype=np.float64)
    return np.where(dynamic, if_dynamic(), if_fixed())


def _batch_count(workload, cols: Columns, sequences: np.ndarray, micro: np.ndarray,
                 budget: np.ndarray) -> np.ndarray:
    """Micro-batches of the pass per rank (:class:`MicroBatches`' ``count``)."""
    n = len(cols["tp"])
    dynamic = np.asarray(cols.get("dynamic_batch", np.zeros(n, dtype=bool))).astype(bool)
    return _either(dynamic, lambda: _packed(cols, sequences * float(workload.mean_sequence_length),
                                            sequences, budget),
                   lambda: _fixed_count(sequences, micro))


def _fixed_count(sequences: np.ndarray, micro) -> np.ndarray:
    """The fixed micro-batch's count: ``ceil(sequences / micro)``, at least 1."""
    return np.maximum(np.ceil(sequences / np.maximum(_f(micro), 1)), 1)


def _packed(cols: Columns, tokens, sequences: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """rearrange_micro_batches' count for ``tokens`` on the rank."""
    cp = _f(cols["cp"])
    group = np.where(cols["vpp"] > 1, _f(cols["pp"]), 1.0)
    count = np.clip(np.ceil(tokens / np.maximum(_f(budget) * cp, 1)), 1,
                    np.maximum(sequences, 1))
    return np.ceil(count / group) * group


def _batches(workload, cols: Columns, sequences: np.ndarray, micro: np.ndarray,
             budget: np.ndarray) -> MicroBatches:
    """The pass's :class:`MicroBatches`.  Each field is the dynamic rows' value or the fixed
    rows'; where every row is one kind only that kind's value is computed (:func:`_either`)."""
    n = len(cols["tp"])
    cp = _f(cols["cp"])
    dynamic = np.asarray(cols.get("dynamic_batch", np.zeros(n, dtype=bool))).astype(bool)
    seq_max, seq_mean = float(workload.sequence_length), float(workload.mean_sequence_length)
    fixed_micro = np.maximum(_f(micro), 1)
    rank_tokens = sequences * seq_mean
    count = _batch_count(workload, cols, sequences, micro, budget)
    return MicroBatches(
        memory_tokens=_either(dynamic, lambda: _f(budget), lambda: fixed_micro * seq_max / cp),
        mean_tokens=_either(dynamic, lambda: rank_tokens / count / cp,
                            lambda: fixed_micro * seq_mean / cp),
        count=count,
        memory_count=_either(dynamic, lambda: _packed(cols, sequences * seq_max, sequences,
                                                      budget),
                             lambda: _fixed_count(sequences, micro)))


def _update_pass(workload, cols: Columns) -> tuple:
    """The actor update's pass per rank: its sequences (``ppo_mini_batch_size * n / DP``), its
    fixed micro-batch and its token budget (``max_token_len``; 0 where not set)."""
    sequences = _f(workload.sequences_per_mini_batch) / np.maximum(_f(cols["dp"]), 1)
    budget = np.asarray(cols.get("max_token_len", np.zeros(len(cols["tp"]))))
    return sequences, cols["micro_batch"], budget


def update_batches(workload, cols: Columns) -> MicroBatches:
    """The actor update's micro-batches per optimizer step (``ppo_mini_batch_size * n / DP``
    sequences per rank)."""
    return _batches(workload, cols, *_update_pass(workload, cols))


def update_batch_count(workload, cols: Columns) -> np.ndarray:
    """:func:`update_batches`' ``count`` alone (the same numbers)."""
    return _batch_count(workload, cols, *_update_pass(workload, cols))


def log_prob_micro_batch(cols: Columns) -> np.ndarray:
    n = len(cols["tp"])
    given = np.asarray(cols.get("log_prob_micro_batch", np.zeros(n)))
    return np.where(given > 0, given, cols["micro_batch"])


def log_prob_budget(cols: Columns) -> np.ndarray:
    n = len(cols["tp"])
    budget = np.asarray(cols.get("max_token_len", np.zeros(n)))
    given = np.asarray(cols.get("log_prob_max_token_len", np.zeros(n)))
    return np.where(given > 0, given, budget)


def log_prob_batches(workload, cols: Columns) -> MicroBatches:
    """A forward-only log-prob pass's micro-batches over the whole step
    (``train_batch_size * n / DP`` sequences per rank)."""
    sequences = _f(workload.sequences_per_step) / np.maximum(_f(cols["dp"]), 1)
    return _batches(workload, cols, sequences, log_prob_micro_batch(cols), log_prob_budget(cols))
