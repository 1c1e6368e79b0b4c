"""Which GPU counts and GPU types a sizing sweep visits.

``--gpus`` takes one count, a range ``8-256``, a list ``8,16,32`` or ``auto``:

* a range visits every count verl can place in it: whole nodes (multiples of the GPUs per
  node) and, below one node, the parts of one node (1, 2, 4 GPUs of an 8-GPU server);
* a list visits exactly its counts, each of which must be such a count;
* ``auto`` doubles from one GPU (1, 2, 4, one node, 2 nodes, 4 nodes, ...) until every GPU type
  has passed its knee (a doubling that gains less than ``--min-scaling``) or
  :data:`AUTO_MAX_GPUS`.

``--gpu-type`` takes one catalog name or a comma-separated list.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.catalog.hardware import GpuSpec, get_gpu
from planner.errors import PlanInputError

AUTO = "auto"
AUTO_MAX_GPUS = 1024
MAX_COUNTS = 256  # counts one sweep visits; more is a typo or a job for a list
MAX_GPUS = 131_072


@dataclass(frozen=True)
class GpuCounts:
    """The counts a sweep visits: ``counts`` in order, or ``auto`` (decided as it goes)."""

    counts: tuple[int, ...] = ()
    auto: bool = False
    text: str = ""
    skipped: tuple[int, ...] = ()  # a range's ends it does not visit (:func:`skipped_ends`)


def allowed(count: int, gpus_per_node: int) -> bool:
    """Whole nodes, or a part of one node that divides it."""
    if count >= gpus_per_node:
        return count % gpus_per_node == 0
    return count >= 1 and gpus_per_node % count == 0


def _allowed_text(gpus_per_node: int) -> str:
    parts = [c for c in range(1, gpus_per_node) if gpus_per_node % c == 0]
    nodes = [gpus_per_node * k for k in (1, 2, 3)]
    return ", ".join(map(str, parts + nodes)) + ", ..."


def _integer(text: str, flag_text: str) -> int:
    cleaned = text.strip().replace("_", "")
    if not cleaned.isdigit() or len(cleaned) > 7:
        raise PlanInputError(f"--gpus {flag_text!r}: {text.strip()!r} is not a GPU count; "
                             f"valid: N, A-B (a range), A,B,C (a list) or auto")
    value = int(cleaned)
    if not 1 <= value <= MAX_GPUS:
        raise PlanInputError(f"--gpus {flag_text!r}: {value} is outside 1..{MAX_GPUS:,}")
    return value


def is_sweep_text(text: str) -> bool:
    """Whether ``--gpus`` asks for more than one count (a range, a list or auto)."""
    text = str(text).strip().lower()
    return text == AUTO or "-" in text.lstrip("-") or "," in text


def parse_counts(text: str, gpus_per_node: int) -> GpuCounts:
    """``--gpus``: a count, a range, a list or ``auto`` (see the module docstring)."""
    raw = str(text).strip()
    if raw.lower() == AUTO:
        return GpuCounts(auto=True, text=AUTO)
    if "," in raw:
        counts = [_integer(part, raw) for part in raw.split(",")]
        bad = [c for c in counts if not allowed(c, gpus_per_node)]
        if bad:
            raise PlanInputError(f"--gpus {raw!r}: {bad[0]} GPUs is not whole nodes of "
                                 f"{gpus_per_node} (--gpus-per-node) nor a part of one node; "
                                 f"valid: {_allowed_text(gpus_per_node)}")
        if len(set(counts)) != len(counts):
            raise PlanInputError(f"--gpus {raw!r} lists a count twice")
        if len(counts) > MAX_COUNTS:
            raise PlanInputError(f"--gpus {raw!r} lists {len(counts)} counts; at most "
                                 f"{MAX_COUNTS} per sweep")
        return GpuCounts(counts=tuple(sorted(counts)), text=raw)
    low_text, sep, high_text = raw.partition("-")
    if not sep:
        count = _integer(raw, raw)
        if not allowed(count, gpus_per_node):
            raise PlanInputError(f"--gpus {count} is not whole nodes of {gpus_per_node} "
                                 f"(--gpus-per-node); valid: {_allowed_text(gpus_per_node)}")
        return GpuCounts(counts=(count,), text=raw)
    low, high = _integer(low_text, raw), _integer(high_text, raw)
    if low > high:
        raise PlanInputError(f"--gpus {raw!r}: the range runs backwards; write {high}-{low}")
    parts = [c for c in range(low, min(high, gpus_per_node - 1) + 1) if allowed(c, gpus_per_node)]
    first_node = max(-(-low // gpus_per_node), 1) * gpus_per_node
    nodes = range(first_node, high + 1, gpus_per_node)
    if len(parts) + len(nodes) > MAX_COUNTS:
        raise PlanInputError(f"--gpus {raw!r} holds {len(parts) + len(nodes):,} counts of whole "
                             f"nodes ({gpus_per_node} per node); at most {MAX_COUNTS} per sweep: "
                             f"narrow the range or list the counts (e.g. 8,16,32,64)")
    counts = tuple(parts) + tuple(nodes)
    if not counts:
        raise PlanInputError(f"--gpus {raw!r} holds no count of whole nodes ({gpus_per_node} "
                             f"per node); e.g. --gpus {first_node - gpus_per_node or 1}-"
                             f"{first_node}")
    skipped = tuple(end for end in dict.fromkeys((low, high)) if end not in counts)
    return GpuCounts(counts=counts, text=raw, skipped=skipped)


def skipped_ends(counts: GpuCounts, gpus_per_node: int) -> str | None:
    """A range's ends the sweep does not visit (not whole nodes nor a part of one node), as
    a note: ``--gpus 8-20`` visits 8 and 16, and says that 20 is left out.  None for a count,
    a list, ``auto`` or a range whose ends are visited."""
    left = counts.skipped
    if not left:
        return None
    shown = counts.counts if len(counts.counts) <= 6 else (*counts.counts[:3], "...",
                                                          counts.counts[-1])
    visited = ", ".join(map(str, shown))
    return (f"--gpus {counts.text}: {' and '.join(map(str, left))} "
            f"{'is' if len(left) == 1 else 'are'} not whole nodes of {gpus_per_node} GPUs nor a "
            f"part of one node, the counts verl places; the sweep visits {visited}")


def auto_counts(gpus_per_node: int, limit: int = AUTO_MAX_GPUS) -> tuple[int, ...]:
    """``auto``'s ladder: the doubling parts of one node, then doubling whole nodes."""
    ladder = [c for c in (1 << k for k in range(32)) if c < gpus_per_node
              and gpus_per_node % c == 0]
    count = gpus_per_node
    while count <= max(limit, gpus_per_node):
        ladder.append(count)
        count *= 2
    return tuple(ladder)


def parse_gpu_types(text: str) -> tuple[GpuSpec, ...]:
    """``--gpu-type h100,h200,h20``: catalog names or aliases, each once."""
    names = [part.strip() for part in str(text).split(",")]
    if not all(names):
        raise PlanInputError(f"--gpu-type {text!r} has an empty name; e.g. --gpu-type h100,h200")
    gpus = [get_gpu(name) for name in names]
    seen: dict[str, str] = {}
    for name, gpu in zip(names, gpus):
        if gpu.name in seen:
            raise PlanInputError(f"--gpu-type {text!r} names {gpu.name} twice ({seen[gpu.name]!r}"
                                 f" and {name!r})")
        seen[gpu.name] = name
    return tuple(gpus)
