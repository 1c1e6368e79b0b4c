"""How megatron-core 0.16 splits a model's layers over pipeline stages.

Four ways, each as ``transformer_block.get_num_layers_to_build`` and
``TransformerConfig.__post_init__`` implement them:

* even: ``L % PP == 0``, every stage ``L / PP`` layers;
* uneven first/last stage (``num_layers_in_first_pipeline_stage`` /
  ``..._last_...``): the ``M = L - f - l`` remaining layers divide evenly over the
  ``P' = PP - #set`` other stages, and ``M == 0`` exactly when ``P' == 0``;
* the embedding and/or the loss counted as layers (``account_for_embedding_in_pipeline_split``
  / ``account_for_loss_in_pipeline_split``): ``L + e + l`` divides by PP, and the first (last)
  stage builds one transformer layer fewer -- 94 layers of Qwen3-235B on PP 8 is 96 = 8 x 12;
  it cannot be combined with uneven first/last stages;
* ``pipeline_model_parallel_layout``, a layout string (``"Et*3|(tt|)*29,m|L"``: ``E``
  embedding, ``t`` transformer layer, ``m`` MTP, ``L`` loss, ``|`` between stages; stage
  ``i`` of ``PP * VPP`` stages runs on pipeline rank ``i % PP``), exclusive of the others.

:func:`pipeline_split` is the vectorised form for the first three (what the search generates);
:func:`parse_layout` and :func:`layout_ranks` read a layout string.
"""

from __future__ import annotations

import re

import numpy as np

from planner.errors import PlanInputError
from planner.search.layout import distinct

LAYOUT_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
MAX_LAYOUT_LAYERS = 1 << 16  # a layout string may not unroll to more layer marks than this


def _array(value, like: np.ndarray) -> np.ndarray:
    if value is None:
        return np.zeros_like(like)
    return np.broadcast_to(np.asarray(value, dtype=np.int64), like.shape)


def pipeline_split(num_layers: int, pp, first=None, last=None, account_embedding=None,
                   account_loss=None):
    """Transformer layers on the first, each middle, and the last pipeline stage.

    ``first``/``last`` non-zero: the uneven stages (0: not set).  ``account_embedding`` /
    ``account_loss`` true: the embedding / loss counts as a layer.  Returns ``(first, middle,
    last, valid)`` arrays; ``middle`` is 0 when a pipeline has no middle stage.  Many rows
    (a search's) are computed once per distinct split and gathered: the same values.
    """
    pp = np.asarray(pp, dtype=np.int64)
    first = _array(first, pp)
    last = _array(last, pp)
    embedding = _array(account_embedding, pp).astype(bool)
    loss = _array(account_loss, pp).astype(bool)
    key = _split_key(pp, first, last, (embedding, loss))
    if key is None:
        return _split_rows(num_layers, pp, (first, last), (embedding, loss))
    rows, inverse = distinct(key)
    parts = _split_rows(num_layers, pp[rows], (first[rows], last[rows]),
                        (embedding[rows], loss[rows]))
    return tuple(np.take(part, inverse) for part in parts)


DISTINCT_SPLIT_ROWS = 4096  # from this many rows on, pipeline_split computes distinct splits


def _split_key(pp: np.ndarray, first: np.ndarray, last: np.ndarray, counted: tuple
               ) -> np.ndarray | None:
    """One int64 per row that differs between rows of different splits (PP, first and last
    stage layers, the embedding and loss counted), or None for few rows, or keys spanning
    more values than :func:`planner.search.layout.distinct` codes through a table (hashing
    them costs more than the split)."""
    if pp.ndim != 1 or len(pp) < DISTINCT_SPLIT_ROWS:
        return None
    low = min(int(pp.min()), int(first.min()), int(last.min()))
    width = max(int(first.max()), int(last.max())) + 1
    if low < 0 or (int(pp.max()) + 1) * width * width * 4 > 4 * len(pp) + (1 << 16):
        return None
    embedding, loss = counted
    return ((pp * width + first) * width + last) * 4 + embedding * 2 + loss


def _split_rows(num_layers: int, pp: np.ndarray, ends: tuple, counted: tuple):
    """:func:`pipeline_split` of every row: ``ends`` the first/last stage layers, ``counted``
    the embedding/loss counted as layers (arrays of ``pp``'s shape)."""
    first, last = ends
    embedding, loss = counted
    accounted = embedding | loss
    first_set, last_set = first > 0, last > 0
    uneven = first_set | last_set

    # uneven first/last stages (or neither: the even split)
    others = pp - first_set - last_set
    rest = num_layers - first - last
    middle = np.where(others > 0, rest // np.maximum(others, 1), 0)
    uneven_ok = np.where(others > 0, (rest % np.maximum(others, 1) == 0) & (middle >= 1),
                         rest == 0)
    first_layers = np.where(first_set, first, middle)
    last_layers = np.where(last_set, last, middle)
    uneven_ok &= (first_layers >= 1) & (last_layers >= 1)

    # the embedding and loss counted as layers
    total = num_layers + embedding + loss
    per_rank = total // pp
    accounted_ok = (total % pp == 0) & ~uneven
    accounted_first = per_rank - embedding
    accounted_last = per_rank - loss
    accounted_ok &= (accounted_first >= 0) & (accounted_last >= 0)

    first_layers = np.where(accounted, accounted_first, first_layers)
    last_layers = np.where(accounted, accounted_last, last_layers)
    middle = np.where(accounted, np.where(pp > 2, per_rank, 0), middle)
    valid = np.where(accounted, accounted_ok, uneven_ok)

    single = pp == 1  # one stage holds everything; the split settings do not apply
    first_layers = np.where(single, num_layers, first_layers)
    last_layers = np.where(single, num_layers, last_layers)
    middle = np.where(single, num_layers, middle)
    return first_layers, middle, last_layers, valid | (single & ~(uneven & accounted))


def automatic_uneven_split(num_layers: int, pp: int) -> tuple[int, int] | None:
    """The uneven (first, last) stage sizes verl's examples use when PP does not divide the
    layers: middle stages take ``ceil(L / PP)`` layers and the first and last share the rest,
    the last (which also holds the output layer and the loss) the smaller half."""
    if pp < 3 or num_layers % pp == 0:
        return None
    middle = -(-num_layers // pp)
    remainder = num_layers - middle * (pp - 2)
    last = remainder // 2
    first = remainder - last
    if last < 1 or first > middle:
        return None
    return first, last


def split_candidates(num_layers: int, pp: int) -> list[tuple[int, int, bool, bool]]:
    """Every way the search tries to split ``num_layers`` over ``pp`` stages, as ``(first,
    last, account_embedding, account_loss)``: even, the embedding and loss counted as layers
    (both, or one), verl's uneven first/last split, and one uneven end stage (the other stages
    ``floor(L / PP)`` layers; DeepSeek-V3's 61 layers on PP 12 take 6 on the last stage).
    Candidates megatron-core rejects are left for the rules to count."""
    if pp == 1:
        return [(0, 0, False, False)]
    out = [(0, 0, False, False), (0, 0, True, True), (0, 0, True, False), (0, 0, False, True)]
    automatic = automatic_uneven_split(num_layers, pp)
    if automatic:
        out.append((automatic[0], automatic[1], False, False))
    base = num_layers // pp
    if base >= 1 and num_layers % pp:
        end = num_layers - base * (pp - 1)
        out += [(0, end, False, False), (end, 0, False, False)]
    return list(dict.fromkeys(out))


# --- layout strings (pipeline_model_parallel_layout) --------------------------------------------


def parse_layout(text: str) -> list[str]:
    """The stages of a layout string, unrolled as megatron-core's ``parse_str_to_list`` does:
    commas are cosmetic, ``(...)*n`` and ``x*n`` repeat.  Raises :class:`PlanInputError` on
    characters other than ``E L t m | ( ) * , digits`` or an expansion beyond
    :data:`MAX_LAYOUT_LAYERS`."""
    source = str(text)
    if len(source) > 10_000:
        raise PlanInputError(f"pipeline layout string of {len(source)} characters is too long")
    layout = source.replace(",", "").replace(" ", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        def unroll(match: re.Match) -> str:
            count = int(match.group(2))
            if count * len(match.group(1)) > MAX_LAYOUT_LAYERS:
                raise PlanInputError(f"pipeline layout {source!r} unrolls to more than "
                                     f"{MAX_LAYOUT_LAYERS} layers")
            return match.group(1) * count

        layout = re.sub(pattern, unroll, layout)
        if len(layout) > MAX_LAYOUT_LAYERS * 2:
            raise PlanInputError(f"pipeline layout {source!r} unrolls to more than "
                                 f"{MAX_LAYOUT_LAYERS} layers")
    bad = sorted(set(layout) - set(LAYOUT_CHARS) - {"|"})
    if bad:
        raise PlanInputError(f"pipeline layout {source!r}: invalid character(s) {bad}; valid: "
                             f"E (embedding), t (transformer layer), m (MTP), L (loss), | "
                             f"(stage boundary), (...)*n repeats")
    return layout.split("|")


def layout_ranks(text: str, pp: int, num_layers: int) -> list[list[str]]:
    """Stages of a layout string per pipeline rank (``[rank][vpp stage]``), checked as
    megatron-core's ``PipelineParallelLayerLayout.validate_layer_layout`` checks it (MTP layers
    are refused: verl does not train them).  Raises :class:`PlanInputError` naming the
    problem."""
    stages = parse_layout(text)
    if len(stages) % pp:
        raise PlanInputError(f"pipeline layout {text!r} has {len(stages)} stages, not a multiple "
                             f"of pipeline_model_parallel_size {pp}")
    flat = "".join(stages)
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 \
            or flat.count("L") != 1:
        raise PlanInputError(f"pipeline layout {text!r} must start with the embedding E and end "
                             f"with the loss L, each exactly once")
    if flat.count("m"):
        raise PlanInputError(f"pipeline layout {text!r} places MTP layers (m); verl does not "
                             f"train multi-token prediction: drop them")
    if flat.count("t") != num_layers:
        raise PlanInputError(f"pipeline layout {text!r} places {flat.count('t')} transformer "
                             f"layers; the model has {num_layers}")
    vpp = len(stages) // pp
    return [[stages[v * pp + rank] for v in range(vpp)] for rank in range(pp)]


def layout_vpp(text: str, pp: int) -> int:
    return max(len(parse_layout(text)) // max(pp, 1), 1)


def default_split(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, int, bool, bool]:
    """The split a single layout takes when none is given: the first of
    :func:`split_candidates` that megatron-core accepts with this VPP (even first)."""
    for first, last, embedding, loss in split_candidates(num_layers, pp):
        f, middle, l_, ok = (int(np.asarray(part).reshape(-1)[0]) for part in pipeline_split(
            num_layers, np.array([pp]), [first], [last], [embedding], [loss]))
        per_first, per_last = f + embedding, l_ + loss
        chunks_ok = vpp == 1 or (per_first % vpp == 0 and per_last % vpp == 0
                                 and (pp < 3 or middle % vpp == 0)
                                 and not (first and last and pp == 2))
        if ok and chunks_ok:
            return first, last, embedding, loss
    return 0, 0, False, False


def balanced_layout(num_layers: int, pp: int, vpp: int) -> str:
    """A layout string spreading the embedding, the layers and the loss as evenly as the
    ``PP * VPP`` stages allow (what Megatron-Bridge's recipes write for DeepSeek-V3's 61
    layers, which no even or accounted split divides); "" when there are more stages than
    marks."""
    stages = pp * vpp
    marks = num_layers + 2
    if stages < 2 or stages > marks:
        return ""
    base, extra = divmod(marks, stages)
    sizes = [base + (1 if index >= stages - extra else 0) for index in range(stages)]
    text, placed = [], 0
    for index, size in enumerate(sizes):
        chars = []
        for position in range(size):
            mark = placed + position
            chars.append("E" if mark == 0 else "L" if mark == marks - 1 else "t")
        placed += size
        text.append("".join(chars))
    return "|".join(text)


def split_problems(num_layers: int, pp: int, vpp: int, first: int, last: int,
                   embedding: bool, loss: bool, layout: str) -> list[tuple[str, str]]:
    """Split settings that contradict each other (``(field, message)``; the caller names the
    flag or verl key): a layout string that does not cover the model, the embedding/loss
    counted with one stage only, either way combined with uneven first/last stages."""
    out = []
    if layout:
        try:
            ranks = layout_ranks(layout, pp, num_layers)
        except PlanInputError as error:
            out.append(("pipeline_layout", str(error)))
        else:
            if len(ranks[0]) != vpp:
                out.append(("pipeline_layout", f"pipeline layout {layout!r} has {len(ranks[0])}"
                                               f" stages per pipeline rank; "
                                               f"virtual_pipeline_model_parallel_size is {vpp}"))
        if first or last or embedding or loss:
            out.append(("pipeline_layout", "a pipeline layout string cannot be combined with "
                                           "uneven first/last stages or the embedding/loss "
                                           "counted as layers (megatron-core raises)"))
    if (first or last) and pp == 1:
        out.append(("first_stage_layers" if first else "last_stage_layers",
                    "num_layers_in_first/last_pipeline_stage needs pipeline_model_parallel_size "
                    "> 1 (got 1; megatron-core finds the other layers no middle stage)"))
    if (embedding or loss) and pp == 1:
        which = "account_embedding" if embedding else "account_loss"
        out.append((which, "counting the embedding or loss as a pipeline layer needs "
                           "pipeline_model_parallel_size > 1 (got 1)"))
    if (embedding or loss) and (first or last):
        out.append(("account_embedding" if embedding else "account_loss",
                    "the embedding/loss counted as layers cannot be combined with "
                    "num_layers_in_first/last_pipeline_stage (megatron-core raises)"))
    return out
