"""The one input-validation layer: bounds and type checks every boundary shares.

Whatever a user hands the planner -- a flag, a ``config.json``, a Hydra YAML, a launch script, a
profiler trace, a sweep folder -- passes through these helpers before anything else reads it.
A value that breaks a rule raises :class:`~planner.errors.PlanInputError` naming the field, the
value (truncated) and what would be valid; a resource bound that trips raises
:class:`~planner.errors.ResourceLimitError` naming the bound.  The CLI prints either as one line
and exits 2.

Sizes are checked before parsing (``stat`` before ``read``, a JSON nesting scan before
``json.loads``), so a hostile input costs at most the bound, never the parser's worst case.
"""

from __future__ import annotations

import io
import json
import math
import numbers
import unicodedata
from pathlib import Path
from typing import Any

from planner.errors import PlanInputError, ResourceLimitError

# --- the bounds (docs/security.md, "One validation layer", states them) ----------------------
# Counts (stated in --help): the largest GPU clusters announced hold about 10^5 GPUs; no verl
# batch, length or stage count comes near these.
MAX_GPUS = 131_072
MAX_GPUS_PER_NODE = 1024
MAX_PARALLEL = 4096  # TP, PP, CP, EP, ETP, rollout sizes
MAX_VPP = 64
MAX_BATCH = 1 << 24  # prompts, micro-batches, max_num_seqs
MAX_TOKENS = 1 << 24  # prompt/response lengths, token budgets (16M tokens)
MAX_LAYERS = 4096
CLUSTER_LIMITS = {"num_gpus": (1, MAX_GPUS), "gpus_per_node": (1, MAX_GPUS_PER_NODE)}
# Files
MAX_JSON_BYTES = 16 << 20  # config.json, plan.json, sweep.json, calibration files
MAX_TRACE_BYTES = 1 << 30  # one profiler trace, after gunzip (traces of a step run to ~100s MB)
MAX_SCRIPT_BYTES = 4 << 20  # a launch script or Hydra YAML
MAX_JSON_DEPTH = 64  # nesting of any JSON/YAML document (real ones nest < 10 deep)
MAX_NAME_CHARS = 4096  # a model name, path, GPU type, override value (PATH_MAX on Linux)
MAX_EXPANSION_DEPTH = 64  # nested ${X:-${Y:-...}} and $(( )) inside expansions
MAX_ARITHMETIC_CHARS = 10_000  # one $((...)) expression after variable substitution
MAX_ARITHMETIC_NESTING = 32  # parentheses, unary operators and variables inside $((...))
MAX_VARIABLE_CHARS = 1 << 20  # one shell variable's value (self-doubling `A=$A$A` stops here)
MAX_EXPANDED_CHARS = 64 << 20  # all variable expansions of one script together


def shown(value: Any, limit: int = 60) -> str:
    """``repr`` of a value, cut to ``limit`` characters (a 10k-character name stays readable)."""
    text = value if isinstance(value, str) else repr(value)
    if isinstance(value, str):
        return repr(text if len(text) <= limit else text[:limit] + "...")
    return text if len(text) <= limit else text[:limit] + "..."


def invalid(field: str, value: Any, valid: str) -> PlanInputError:
    """The input error for ``field = value``: the value (truncated) and what would be valid."""
    return PlanInputError(f"{field} {shown(value)} is not valid; valid: {valid}")


# --- text ------------------------------------------------------------------------------------


def control_characters(text: str) -> list[str]:
    """The control characters in ``text`` (newline, carriage return, escape, NUL ...)."""
    return sorted({c for c in text if unicodedata.category(c) == "Cc"})


def check_text(field: str, value: str, *, max_chars: int = MAX_NAME_CHARS,
               allow_empty: bool = False, what: str = "a name") -> str:
    """A name or path given by the user: not empty, no control characters, bounded length.

    Any other unicode is fine (verl, Hydra and the file system take it)."""
    if not isinstance(value, str):
        raise invalid(field, value, f"{what} (text)")
    if not value.strip() and not allow_empty:
        raise PlanInputError(f"{field} is empty; give {what}")
    if len(value) > max_chars:
        raise ResourceLimitError(f"{field} {shown(value)} is {len(value):,} characters; the "
                                 f"bound is {max_chars:,}")
    bad = control_characters(value)
    if bad:
        names = ", ".join(repr(c) for c in bad[:3])
        raise PlanInputError(f"{field} {shown(value)} holds control characters ({names}); "
                             f"valid: {what} without newlines, carriage returns or other "
                             f"control characters")
    return value


# --- numbers ---------------------------------------------------------------------------------


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def check_number(field: str, value: Any, low: float, high: float, *,
                 integer: bool = False) -> float | int:
    """A number from a file: a real number (not a bool, not a string), finite, in
    ``low..high``; an integer when ``integer`` (``4096.0`` is taken as 4096)."""
    kind = "an integer" if integer else "a number"
    valid = f"{kind} in {_number(low)}..{_number(high)}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's count too
        raise invalid(field, value, valid)
    if not isinstance(value, numbers.Integral):
        value = float(value)
        if not math.isfinite(value):
            raise invalid(field, value, valid)
        if integer:
            if not value.is_integer():
                raise invalid(field, value, valid)
    if not low <= value <= high:
        raise invalid(field, value, valid)
    return int(value) if integer else value


# --- files -----------------------------------------------------------------------------------


def file_size(path: Path, field: str, limit_bytes: int) -> int:
    """The size of ``path``, checked against ``limit_bytes`` before anything reads it."""
    try:
        size = Path(path).stat().st_size
    except OSError as error:
        raise PlanInputError(f"{field}: cannot read {str(path)!r} ({error.strerror or error})"
                             ) from None
    if size > limit_bytes:
        raise ResourceLimitError(f"{field}: {str(path)!r} is {size:,} bytes; the bound is "
                                 f"{limit_bytes:,} bytes ({limit_bytes / 2**20:g} MiB)")
    return size


def read_bytes(path: Path, field: str, limit_bytes: int) -> bytes:
    """A file's bytes, bounded; ``.gz`` content is decompressed, bounded too."""
    file_size(path, field, limit_bytes)
    try:
        raw = Path(path).read_bytes()
        if raw[:2] == b"\x1f\x8b":
            import gzip  # here: every plan imports this module, few read a gzipped file

            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
                raw = stream.read(limit_bytes + 1)
            if len(raw) > limit_bytes:
                raise ResourceLimitError(f"{field}: {str(path)!r} decompresses to more than "
                                         f"the bound of {limit_bytes:,} bytes")
    except (OSError, EOFError) as error:
        raise PlanInputError(f"{field}: cannot read {str(path)!r} ({error})") from None
    return raw


def read_text(path: Path, field: str, limit_bytes: int = MAX_SCRIPT_BYTES) -> str:
    """A text file (UTF-8), bounded."""
    raw = read_bytes(path, field, limit_bytes)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PlanInputError(f"{field}: {str(path)!r} is not UTF-8 text (byte {error.start})"
                             ) from None


# --- JSON and nesting ------------------------------------------------------------------------


def json_depth(text: str | bytes) -> int:
    """The deepest ``[``/``{`` nesting of a JSON text, found without parsing it (strings
    skipped), so a deeply nested document is refused before ``json.loads`` recurses."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def parse_json(text: str | bytes, field: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` after the nesting check; NaN and Infinity literals are refused."""
    depth = json_depth(text)
    if depth > max_depth:
        raise ResourceLimitError(f"{field}: JSON nested {depth} levels deep; the bound is "
                                 f"{max_depth}")

    def constant(name: str):
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, parse_constant=constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise PlanInputError(f"cannot read {field}: not valid JSON ({str(error)[:120]})"
                             ) from None


def load_json(path: Path, field: str, limit_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH, kind: type | None = dict) -> Any:
    """A JSON file: size checked before reading, depth before parsing, and (``kind``) the type
    of the document."""
    data = parse_json(read_bytes(path, field, limit_bytes), f"{field} {str(path)!r}", max_depth)
    if kind is not None and not isinstance(data, kind):
        what = {dict: "a JSON object", list: "a JSON list"}.get(kind, kind.__name__)
        held = "null" if data is None else type(data).__name__
        raise PlanInputError(f"{field}: {str(path)!r} holds {held}, not {what}")
    return data


def nesting_depth(data: Any, max_depth: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of parsed data (dicts and lists), walked without recursion and
    stopping one past ``max_depth``."""
    deepest = 0
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > max_depth:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_fields(where: str, values: dict, limits: dict[str, tuple[float, float]],
                 integer: bool = True) -> dict:
    """``values[key]`` for each key of ``limits`` that is present, checked to lie in its
    ``(low, high)``; the message names ``where.key``."""
    if not isinstance(values, dict):
        raise invalid(where, values, "a JSON object")
    for key, (low, high) in limits.items():
        if key in values:
            check_number(f"{where}.{key}", values[key], low, high, integer=integer)
    return values


def check_depth(data: Any, field: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    depth = nesting_depth(data, max_depth)
    if depth > max_depth:
        raise ResourceLimitError(f"{field}: nested more than {max_depth} levels deep; the bound "
                                 f"is {max_depth}")
    return data


# --- output paths: checked before any work, so a bad one fails at once and writes nothing ------


def _writable_folder(folder: Path, flag: str, target: Path) -> None:
    """``folder`` (which holds or will hold ``target``) exists as a folder this process can
    write, or can be created: its nearest existing ancestor is a writable folder."""
    import os

    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise PlanInputError(f"{flag} {str(target)!r}: {str(probe)!r} is not a folder; valid: "
                             f"a path inside a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PlanInputError(f"{flag} {str(target)!r}: folder {str(probe)!r} is not writable")


def check_output_file(path: Path, flag: str, *, must_exist_folder: bool = True) -> None:
    """An output file path: not a folder, in a folder that exists (``must_exist_folder``; else
    one that can be created) and is writable.  Whether an existing file may be replaced is the
    caller's rule (``--force``)."""
    path = Path(path)
    if path.is_dir():
        raise PlanInputError(f"{flag} {str(path)!r} is a folder; valid: a file path")
    folder = path.parent
    if must_exist_folder and not folder.exists():
        raise PlanInputError(f"{flag} {str(path)!r}: folder {str(folder)!r} does not exist "
                             f"(create it first)")
    _writable_folder(folder, flag, path)


def check_output_folder(path: Path, flag: str) -> None:
    """An output folder: a folder (or a path where one can be created) that is writable."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PlanInputError(f"{flag} {str(path)!r} is a file, not a folder")
    _writable_folder(path, flag, path)
