"""One GRPO parallel layout: the actor (Megatron), the reference model and the rollout engine.

verl builds the reference model with the actor's parallel sizes (it shares the actor's
``megatron`` section), so only the reference's parameter offload is its own.  ``dp`` is derived
from the world size (``world / (tp * pp * cp)``) and stored so a layout reads on its own.

The planner works on many layouts at once as *columns*: a ``dict`` of equally long numpy arrays
keyed by the field names below (``recompute`` as an index into :data:`RECOMPUTE`).
:meth:`Layout.to_columns` and :meth:`Layout.from_row` convert one layout to and from that form,
so a single layout and a search space of millions go through the same code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Collection, Mapping

import numpy as np

from planner.errors import PlanInputError

# Megatron recomputation (megatron-core TransformerConfig.recompute_granularity): "none";
# "selective" (the modules of ``recompute_modules``); "full" (whole layers, with
# recompute_method uniform -- chunks of ``recompute_num_layers`` layers keep only their input --
# or block -- the first ``recompute_num_layers`` layers of each stage are recomputed).
RECOMPUTE = ("none", "selective", "full")
# megatron-core 0.16 recompute_modules, as the bits of ``Layout.recompute_modules``.
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "moe",
                     "shared_experts")
# The planner's "selective": core_attn + layernorm + moe_act (moe_act only matters for MoE).
DEFAULT_SELECTIVE_MODULES = 0b111


# recompute_modules that apply only to MoE layers / multi-latent attention (megatron-core
# TransformerConfig: moe_act needs grouped-GEMM experts; mla_up_proj needs MLA)
MOE_MODULES = ("moe_act", "moe", "shared_experts")
MLA_MODULES = ("mla_up_proj",)


def applicable_modules(mask: int, is_moe: bool, is_mla: bool) -> int:
    """``mask`` without the modules a model does not have (MoE modules on a dense model,
    ``mla_up_proj`` without multi-latent attention): what an exported job recomputes."""
    absent = [name for name in RECOMPUTE_MODULES
              if (not is_moe and name in MOE_MODULES) or (not is_mla and name in MLA_MODULES)]
    return mask & ~modules_mask(absent)


def modules_mask(names) -> int:
    """The bitmask of recompute module names (unknown names are an input error)."""
    mask = 0
    for name in names:
        if name not in RECOMPUTE_MODULES:
            raise PlanInputError(f"recompute module {name!r} is not one of "
                                 f"{', '.join(RECOMPUTE_MODULES)}")
        mask |= 1 << RECOMPUTE_MODULES.index(name)
    return mask


def module_names(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in enumerate(RECOMPUTE_MODULES) if mask >> bit & 1)

Columns = dict[str, np.ndarray]


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    dp: int = 1
    micro_batch: int = 1
    recompute: str = "none"
    param_offload: bool = False
    optimizer_offload: bool = False
    ref_param_offload: bool = False
    sequence_parallel: bool = True  # only meaningful (and only set for Megatron) when tp > 1
    distributed_optimizer: bool = True
    # --- the pipeline split (megatron-core 0.16) ------------------------------------------------
    first_stage_layers: int = 0  # num_layers_in_first_pipeline_stage; 0: not set
    last_stage_layers: int = 0  # num_layers_in_last_pipeline_stage; 0: not set
    account_embedding: bool = False  # account_for_embedding_in_pipeline_split
    account_loss: bool = False  # account_for_loss_in_pipeline_split
    pipeline_layout: str = ""  # pipeline_model_parallel_layout, e.g. "Et*3|(tt|)*29,m|L"
    # --- recomputation detail ---------------------------------------------------------------
    recompute_modules: int = 0  # selective: bits of RECOMPUTE_MODULES (0: the default set)
    recompute_num_layers: int = 1  # full: layers per checkpoint (uniform) or recomputed (block)
    recompute_block: bool = False  # full: recompute_method block instead of uniform
    # --- Megatron's CPU optimizer (HybridDeviceOptimizer) ------------------------------------
    # optimizer_offload_fraction of the optimizer state and Adam step on the host; 0: off.
    optimizer_cpu_fraction: float = 0.0
    # --- batching (verl) --------------------------------------------------------------------
    dynamic_batch: bool = False  # use_dynamic_bsz: micro-batches packed to a token budget
    max_token_len: int = 0  # ppo_max_token_len_per_gpu (dynamic batches)
    log_prob_max_token_len: int = 0  # log_prob_max_token_len_per_gpu; 0: max_token_len
    log_prob_micro_batch: int = 0  # log_prob_micro_batch_size_per_gpu; 0: micro_batch
    # --- the rollout engine ---------------------------------------------------------------------
    rollout_tp: int = 1
    rollout_dp: int = 1
    rollout_ep: int = 1
    gpu_memory_utilization: float = 0.6

    def __post_init__(self) -> None:
        if self.recompute not in RECOMPUTE:
            raise PlanInputError(f"--recompute {self.recompute!r} is not one of "
                                 f"{', '.join(RECOMPUTE)}")
        for name in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "micro_batch", "rollout_tp",
                     "rollout_dp", "rollout_ep", "recompute_num_layers"):
            if getattr(self, name) < 1:
                raise PlanInputError(f"--{name.replace('_', '-')} must be a positive integer, "
                                     f"got {getattr(self, name)}")
        for name in ("first_stage_layers", "last_stage_layers", "max_token_len",
                     "log_prob_max_token_len", "log_prob_micro_batch"):
            if getattr(self, name) < 0:
                raise PlanInputError(f"--{name.replace('_', '-')} must be >= 0, got "
                                     f"{getattr(self, name)}")
        if not 0.05 <= self.gpu_memory_utilization <= 0.99:
            raise PlanInputError(f"--gpu-memory-utilization {self.gpu_memory_utilization} is "
                                 f"outside 0.05..0.99")
        if not 0.0 <= self.optimizer_cpu_fraction <= 1.0:
            raise PlanInputError(f"--optimizer-offload-fraction {self.optimizer_cpu_fraction} "
                                 f"is outside 0..1 (optimizer_offload_fraction)")
        if self.dynamic_batch and self.max_token_len < 1:
            raise PlanInputError("--dynamic-batch needs --max-token-len-per-gpu N "
                                 "(ppo_max_token_len_per_gpu), a positive token count")
        if not 0 <= self.recompute_modules < 1 << len(RECOMPUTE_MODULES):
            raise PlanInputError(f"recompute modules mask {self.recompute_modules} is not a "
                                 f"set of {', '.join(RECOMPUTE_MODULES)}")
        if self.recompute == "selective" and self.recompute_modules == 0:
            object.__setattr__(self, "recompute_modules", DEFAULT_SELECTIVE_MODULES)
        if self.recompute != "selective" and self.recompute_modules:
            object.__setattr__(self, "recompute_modules", 0)
        # One form per layout: a log-prob setting equal to the training one is "follows it" (0),
        # so a layout read back from a verl config (which spells both out) equals the plan's.
        if self.log_prob_micro_batch == self.micro_batch:
            object.__setattr__(self, "log_prob_micro_batch", 0)
        if self.log_prob_max_token_len == self.max_token_len:
            object.__setattr__(self, "log_prob_max_token_len", 0)

    def to_columns(self) -> Columns:
        values = asdict(self)
        values["recompute"] = RECOMPUTE.index(self.recompute)
        return {name: np.array([value]) for name, value in values.items()}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Layout":
        """The layout of one row of layout columns or of a plan's candidate frame: numpy
        scalars, ``recompute`` as an index or a name.  Fields the row lacks keep their
        defaults (rows written before the field existed)."""
        convert = {"int": int, "bool": bool, "float": float, "str": str}
        values = {}
        for spec in fields(cls):
            if spec.name not in row:
                continue
            value = row[spec.name]
            value = value.item() if hasattr(value, "item") else value
            if spec.name == "recompute" and not isinstance(value, str):
                value = RECOMPUTE[int(value)]
            values[spec.name] = convert[spec.type](value)
        values["optimizer_cpu_fraction"] = round(values["optimizer_cpu_fraction"], 4)
        values["gpu_memory_utilization"] = round(values["gpu_memory_utilization"], 2)
        return cls(**values)

    @property
    def offload_text(self) -> str:
        """``param+optim+ref`` for what is offloaded, ``-`` for nothing."""
        parts = [name for name, on in (("param", self.param_offload),
                                       ("optim", self.optimizer_offload),
                                       ("ref", self.ref_param_offload)) if on]
        return "+".join(parts) or "-"

    @property
    def batch_text(self) -> str:
        if self.dynamic_batch:
            logp = self.log_prob_max_token_len or self.max_token_len
            return f"dynamic batch {self.max_token_len} tokens/GPU (log-prob {logp})"
        logp = self.log_prob_micro_batch or self.micro_batch
        return f"micro-batch {self.micro_batch}" + (
            f" (log-prob {logp})" if logp != self.micro_batch else "")

    @property
    def recompute_text(self) -> str:
        if self.recompute == "selective":
            return "selective " + "+".join(module_names(self.recompute_modules))
        if self.recompute == "full" and (self.recompute_block or self.recompute_num_layers > 1):
            method = "block" if self.recompute_block else "uniform"
            return f"full {method} {self.recompute_num_layers}"
        return self.recompute

    def actor_text(self, moe: bool = True) -> str:
        """The actor's layout in one line: ``TP2 PP2 VPP1 CP1 EP1 ETP1 DP2, micro-batch 4,
        recompute none, offload -``; the one way every command prints a layout."""
        sizes = f"TP{self.tp} PP{self.pp} VPP{self.vpp} CP{self.cp}"
        if moe:
            sizes += f" EP{self.ep} ETP{self.etp}"
        text = (f"{sizes} DP{self.dp}, {self.batch_text}, recompute {self.recompute_text}, "
                f"offload {self.offload_text}")
        if self.optimizer_cpu_fraction:
            text += f", CPU optimizer {self.optimizer_cpu_fraction:.0%}"
        return text

    def rollout_text(self, utilization: str | None = None) -> str:
        """The rollout layout as printed; ``utilization``: what follows its parallel sizes in
        place of the ``gpu_memory_utilization`` setting."""
        return (f"rollout TP{self.rollout_tp} DP{self.rollout_dp} EP{self.rollout_ep} "
                + (utilization or f"at gpu_memory_utilization "
                   f"{self.gpu_memory_utilization:.2f}"))

    def to_dict(self) -> dict:
        return asdict(self)


LAYOUT_FIELDS = tuple(field.name for field in fields(Layout))


class RowsAt(Mapping):
    """The columns ``columns`` at rows ``index``, each gathered when first read (and kept):
    a plan times its fitting rows on the few dozen columns the step reads, not on the hundred
    its memory and layout columns make (the same values as ``values[index]`` per column; a 0-d
    value is read as it is).  ``taken``: columns already at those rows (computed for them
    alone), read before ``columns``' of the same name."""

    def __init__(self, columns: Mapping, index: np.ndarray, taken: Mapping | None = None) -> None:
        self._columns, self._index = columns, index
        # an integer index gathers with np.take (numpy's faster loop; the same values)
        self._by_position = isinstance(index, np.ndarray) and index.dtype.kind in "iu"
        self._taken = dict(taken) if taken else {}
        self._given = tuple(self._taken)
        self._own = tuple(name for name in self._given if name not in columns)

    def __getitem__(self, name: str) -> np.ndarray:
        taken = self._taken.get(name)
        if taken is None:
            values = self._columns[name]
            taken = values if np.ndim(values) == 0 else (
                np.take(values, self._index, axis=0) if self._by_position else values[self._index])
            self._taken[name] = taken
        return taken

    def __contains__(self, name: object) -> bool:
        return name in self._columns or name in self._own

    def __iter__(self):
        yield from self._columns
        yield from self._own

    def __len__(self) -> int:
        return len(self._columns) + len(self._own)

    def at(self, index: np.ndarray) -> "RowsAt":
        """These rows at ``index`` (of them), gathered from the columns at once."""
        return RowsAt(self._columns, self._index[index],
                      {name: self._taken[name][index] for name in self._given})


def scalar_columns(cols: Mapping, names: Collection[str] | None = None) -> dict:
    """The 0-d values of ``cols`` (a :class:`RowsAt`'s, without gathering its columns), in its
    order; ``names``: of those columns alone (no other column read: a
    :class:`planner.cost.deferred.DeferredColumns`' deferred ones stay deferred)."""
    source = cols._columns if isinstance(cols, RowsAt) else cols  # a 0-d value is not gathered
    if names is None:
        return {name: values for name, values in source.items() if np.ndim(values) == 0}
    return {name: source[name] for name in source
            if name in names and np.ndim(source[name]) == 0}


def unique_rows(cols: Columns, names: tuple[str, ...],
                codes_of: dict | None = None) -> tuple[Columns, np.ndarray]:
    """The distinct rows of ``cols`` over the fields ``names``, and for every row the index of
    its distinct row: the cost model computes what depends only on those fields once per
    distinct row (a search crosses every parallel layout with several knobs that do not change
    it) and broadcasts with ``values[inverse]``.

    Each field becomes codes ``0..k-1`` (:func:`_codes`), the codes combine into one int64 key
    (re-coded whenever the next field would overflow it), and the key is coded once more
    (:func:`distinct`).  ``codes_of``: each field's codes (None: one value) kept across calls
    on the same columns (the step's groups read many of the same fields), and the rows'
    codes over some of ``names`` (:func:`share_rows`), from which the key then starts: rows
    are equal on ``names`` exactly when they are equal on those and on the rest, and
    :func:`distinct` codes rows by which rows are equal, so the result is the same.
    """
    n = len(cols["tp"])
    if n == 0:
        return dict(cols), np.zeros(0, dtype=np.int64)
    codes_of = {} if codes_of is None else codes_of
    shared = codes_of.get(_SHARED_ROWS)
    if shared is None or not set(shared[0]) <= set(names):
        first, inverse = distinct(_row_key(cols, names, codes_of))
    else:
        rest = tuple(name for name in names if name not in shared[0])
        key = _row_key(cols, rest, codes_of, (shared[2], len(shared[1])))
        # no other field varies: the shared rows' codes are in order of appearance already
        first, inverse = (shared[1], shared[2]) if key is shared[2] else distinct(key)
    return {name: np.take(values, first, axis=0) for name, values in cols.items()}, inverse


# the key of :data:`codes_of` (:func:`unique_rows`) that keeps :func:`share_rows`' codes
_SHARED_ROWS = ("rows over",)


def share_rows(cols: Columns, names: tuple[str, ...], codes_of: dict) -> int:
    """Code the rows of ``cols`` over the fields ``names`` (:func:`distinct`'s first rows and
    codes) into ``codes_of``, for the :func:`unique_rows` calls on the same columns whose
    fields include them (the step's two training passes share all but a few fields): each
    such call then codes its other fields alone.  Returns how many distinct rows there are."""
    if not len(cols["tp"]):
        return 0
    codes_of[_SHARED_ROWS] = (tuple(names), *distinct(_row_key(cols, names, codes_of)))
    return len(codes_of[_SHARED_ROWS][1])


def _row_key(cols: Columns, names: tuple[str, ...], codes_of: dict,
             start: tuple[np.ndarray, int] | None = None) -> np.ndarray:
    """One int64 key per row, equal exactly where the rows' fields ``names`` all are (and
    ``start``'s codes, of the count given, when given; ``start``'s very array when no field
    varies)."""
    key, combinations = start or (np.zeros(len(cols["tp"]), dtype=np.int64), 1)
    for name in names:
        if name not in cols:
            continue
        if name not in codes_of:
            values = np.asarray(cols[name])
            # one value distinguishes nothing (a column read from one element: at once)
            codes_of[name] = (None if values.ndim != 1 or values.strides == (0,)
                              or (values[0] == values).all() else _codes(values))
        if codes_of[name] is None:
            continue
        codes, count = codes_of[name]
        if combinations * count >= 2**62:
            compressed, key = distinct(key)
            combinations = len(compressed)
        key = key * count + codes
        combinations *= count
    return key


def rows_column(cols: Mapping, name: str) -> np.ndarray:
    """``cols[name]``, but a :class:`RowsAt`'s column that is one element read throughout
    (stride 0: a search's constant column) as such a view of the rows' length, not gathered
    (the same values)."""
    if isinstance(cols, RowsAt) and cols._by_position:
        source = cols._columns.get(name) if name not in cols._taken else None
        if isinstance(source, np.ndarray) and source.ndim == 1 and source.strides == (0,):
            return np.broadcast_to(source[:1], (len(cols._index),))
    return cols[name]


def _codes(values: np.ndarray) -> tuple[np.ndarray, int]:
    """One field as codes ``0..count-1``, equal codes for equal values: a narrow range of
    integers (or booleans) by offset, anything else as its distinct values' positions
    (:func:`distinct`)."""
    if values.dtype.kind in "biu":
        integers = values.astype(np.int64)
        low, high = int(integers.min()), int(integers.max())
        if high - low < 1 << 16:
            return integers - low, high - low + 1
    first, inverse = distinct(values)
    return inverse, len(first)


# From this many values on, :func:`distinct` hashes them (:func:`_first_equal`, linear); below
# it, a sort costs as little and numpy's sort paths serve.
HASHED_VALUES = 1 << 12


def _hashed(count: int) -> bool:
    """Whether :func:`distinct` hashes ``count`` values (:func:`_first_equal`)."""
    return count >= HASHED_VALUES


def distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first, inverse)``: the index of the first occurrence of each distinct value (in order
    of appearance) and, per element, the position of its value in ``first`` --
    ``values[first][inverse] == values`` (int64 both): ``pandas.factorize``'s coding (0.0 and
    -0.0 one value), without importing pandas (about 0.3 s of CPU and 40 MB).

    Integers spanning at most a few times as many values as there are elements go through a
    table indexed by value (linear).  Other numbers, :data:`HASHED_VALUES` of them or more, are
    hashed (:func:`_first_equal`, linear); fewer go through a plain ``np.sort`` (vectorised,
    unlike an argsort) and a binary search of each value among the distinct ones, complex
    numbers as the pair of their parts' codes.  Anything else (strings) goes through
    ``np.unique``.  NaN is never passed (pandas would code it -1; numpy's path takes
    ``np.unique`` for it, one value).
    """
    values = np.asarray(values)
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    kind = values.dtype.kind
    if kind in "biu":
        low, high = int(values.min()), int(values.max())
        span = high - low + 1
        if span <= 4 * n + (1 << 16):
            return _by_position(values.astype(np.int64) - low, span)
    nan = kind in "fc" and bool(np.isnan(values).any())
    if kind in "biufc" and not nan and _hashed(n):
        few = _few_floats(values) if kind == "f" else None
        return few or _first_occurrences(_first_equal(_hash_keys(values)))
    if kind == "c":
        real, real_of = distinct(values.real)
        imag, imag_of = distinct(values.imag)
        return distinct(real_of * len(imag) + imag_of)
    if nan or kind not in "biuf":
        _, index, inverse = np.unique(values, return_index=True, return_inverse=True)
        return _by_position(inverse.reshape(-1).astype(np.int64), len(index))
    present = sorted_distinct(values)
    return _by_position(np.searchsorted(present, values), len(present))


def distinct_pair(real: np.ndarray, imag: np.ndarray,
                  period: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distinct` of the pairs ``(real[i], imag[i])`` of two float arrays: that of
    ``real + 1j * imag``, to the bit, without building the complex array.  Finite pairs,
    :data:`HASHED_VALUES` or more, are hashed as the two arrays' patterns (:func:`_first_equal`
    reads only which rows are equal, and ``real + 1j * imag`` has exactly these parts, -0.0 as
    0.0); anything else (NaN, an infinity, which ``1j * inf`` turns into a NaN part, or few
    rows) goes through :func:`distinct` of the complex numbers.  ``period`` (> 0): rows that
    repeat the pair ``period`` rows before are likely (a (core row, knob combination) table
    read row by row, ``period`` combinations wide), and only the others are hashed
    (:func:`_distinct_beyond_repeats`)."""
    real, imag = np.asarray(real, dtype=np.float64), np.asarray(imag, dtype=np.float64)
    if not _hashed(len(real)) or not (np.isfinite(real).all() and np.isfinite(imag).all()):
        return distinct(real + 1j * imag)
    if 0 < period < len(real):
        return _distinct_beyond_repeats(real, imag, period)
    return _first_occurrences(_first_equal([*_hash_keys(real), *_hash_keys(imag)]))


def _distinct_beyond_repeats(real: np.ndarray, imag: np.ndarray,
                             period: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distinct_pair` of finite pairs, the rows equal to the row ``period`` before
    (a repeat; -0.0 equal to 0.0, as hashed) taking that row's position: the first occurrence
    of each pair is never a repeat, so the other rows (the heads, in order) hold every pair in
    the same order of first appearance, and a repeat's pair is that of the last head before it
    ``period`` rows apart (a chain of equal rows)."""
    n = len(real)
    repeat = np.zeros(n, dtype=bool)
    np.equal(real[period:], real[:-period], out=repeat[period:])
    repeat[period:] &= imag[period:] == imag[:-period]
    heads = np.flatnonzero(~repeat)
    first, inverse = distinct_pair(real[heads], imag[heads])
    # per row, its last head at or before it in its residue class mod ``period``: the head's
    # position among the heads, carried down each column of the rows laid out ``period`` wide
    rows = -(-n // period)
    head_of = np.zeros(rows * period, dtype=np.int64)
    head_of[heads] = np.arange(len(heads))
    np.maximum.accumulate(head_of.reshape(rows, period), axis=0, out=head_of.reshape(rows, period))
    return heads[first], inverse[head_of[:n]]


def distinct_bit_patterns(arrays: list[np.ndarray],
                          count: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distinct` of the ``count`` rows of several 1-D arrays (numbers), two rows equal
    where every array holds the same bits at both (-0.0 and 0.0 apart, a NaN equal to the
    same NaN): rows any computation reads alike.  No array: one row kind."""
    if not arrays:
        return np.zeros(min(count, 1), dtype=np.int64), np.zeros(count, dtype=np.int64)
    parts = [part for values in map(np.asarray, arrays) for part in
             ((values.real, values.imag) if values.dtype.kind == "c" else (values,))]
    return _first_occurrences(_first_equal([
        np.ascontiguousarray(part, dtype=np.float64 if part.dtype.kind == "f" else np.int64)
        .view(np.uint64) for part in parts]))


# At most this many distinct floats are found by comparison (:func:`_few_floats`).
FEW_FLOATS = 4


def _few_floats(values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`distinct` of floats (no NaN) holding at most :data:`FEW_FLOATS` values (a knob's
    fractions), by comparison: the first row not yet seen starts the next value, every row
    equal to it (0.0 and -0.0 alike, as hashed) takes its position.  None where there are more
    (hashing serves then; found at once where some 256 evenly spaced rows hold more)."""
    if len(sorted_distinct(values[::max(len(values) // 256, 1)] + 0.0)) > FEW_FLOATS:
        return None
    seen = np.zeros(len(values), dtype=bool)
    inverse = np.zeros(len(values), dtype=np.int8)  # positions below FEW_FLOATS
    first = []
    start = 0
    for position in range(FEW_FLOATS):
        first.append(start)
        equal = values == values[start]
        if position:
            inverse += np.multiply(equal, position, dtype=np.int8)
        seen |= equal
        start = int(np.argmin(seen))
        if seen[start]:  # every row seen
            return np.array(first, dtype=np.int64), inverse.astype(np.int64)
    return None


def _first_occurrences(first_equal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distinct`'s ``(first, inverse)`` from each row's first equal row."""
    own = first_equal == np.arange(len(first_equal))  # the first occurrences, in order
    position = np.cumsum(own) - 1
    return np.flatnonzero(own), position[first_equal]


# odd 64-bit multipliers of the hash (:func:`_first_equal`), one per level of collisions
_HASH_MULTIPLIERS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                     0xD6E8FEB86659FD93)


def _hash_keys(values: np.ndarray) -> list[np.ndarray]:
    """Numbers as 64-bit patterns (a complex number as two), equal exactly when the numbers
    are: a float plus 0.0 turns -0.0 into 0.0 and changes nothing else."""
    if values.dtype.kind == "c":
        return [*_hash_keys(values.real), *_hash_keys(values.imag)]
    if values.dtype.kind == "f":
        return [(values.astype(np.float64) + 0.0).view(np.uint64)]
    return [values.astype(np.int64).view(np.uint64)]


def _first_equal(keys: list[np.ndarray], level: int = 0) -> np.ndarray:
    """Per row, the index of the first row whose ``keys`` (64-bit patterns) all equal its own.

    Each row is hashed (multiplied by an odd constant, the top bits kept) into a table of at
    least as many slots as rows; a slot holds its first row.  A row equal to its slot's first
    row has found it: rows of one value share a slot, so the first row of the value is the
    first row of the slot unless another value's row came first there.  The rows that differ
    from their slot's first row (other values hashed to the slot) are the same question on
    fewer rows, answered with the next multiplier: exact, linear while collisions are few."""
    n = len(keys[0])
    if level >= 4 * len(_HASH_MULTIPLIERS):  # collisions that do not thin out: sort them
        _, index, inverse = np.unique(np.stack(keys, axis=1), axis=0, return_index=True,
                                      return_inverse=True)
        return index[inverse.reshape(-1)].astype(np.int64)
    bits = max(4, n.bit_length())
    multiplier = np.uint64(_HASH_MULTIPLIERS[level % len(_HASH_MULTIPLIERS)])
    mixed = keys[0] * multiplier
    for key in keys[1:]:
        mixed ^= key
        mixed *= multiplier
    slot = mixed >> np.uint64(64 - bits)
    owner = np.empty(1 << bits, dtype=np.int64)
    owner[slot[::-1]] = np.arange(n - 1, -1, -1)  # of repeated slots the last write stays
    first = owner[slot]
    found = keys[0][first] == keys[0]
    for key in keys[1:]:
        found &= key[first] == key
    if not found.all():
        rest = np.flatnonzero(~found)
        first[rest] = rest[_first_equal([key[rest] for key in keys], level + 1)]
    return first


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of ``values``, ascending: ``np.unique(values)`` (no NaN), without
    the ``numpy.ma`` import (about 20 ms) numpy 2's plain ``np.unique`` makes to ask whether
    the array is masked."""
    ordered = np.sort(np.asarray(values).ravel())
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    return ordered[first]


def _by_position(codes: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distinct` of values given as ``codes`` in ``0..count-1`` (equal values, equal
    codes): the first index of each code present, in order of appearance, and each element's
    position among them."""
    n = len(codes)
    first_at = np.full(count, n, dtype=np.int64)  # per code, its first index (n: absent)
    first_at[codes[::-1]] = np.arange(n - 1, -1, -1)  # of repeated indices the last write stays
    first = np.sort(first_at[first_at < n])
    position = np.empty(count, dtype=np.int64)
    position[codes[first]] = np.arange(len(first))
    return first, position[codes]
