"""Units, in one place.  The cost model works in bytes, seconds and FLOP/s and converts to GiB
only for display (Megatron-LM's convention)."""

from __future__ import annotations

KIB = 1024
MIB = 1024**2
GIB = 1024**3
GIGA = 1e9
TERA = 1e12
SECONDS_PER_HOUR = 3600.0


def gib(nbytes: float) -> float:
    """Bytes as GiB (2**30 bytes), for display."""
    return float(nbytes) / GIB
