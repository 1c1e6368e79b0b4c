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


def kv_pool_text(pool: float, in_bytes: bool, per: str = " per GPU",
                 tokens: str = " KV tokens") -> str:
    """A rollout KV-cache pool as printed: ``86,500 KV tokens per GPU`` (``tokens`` and ``per``
    the words after the number), or, for a model that keeps no K/V growing per token
    (``kv_pool_in_bytes``: the pool counts bytes), ``2.64 GiB KV cache per GPU`` -- never
    bytes called tokens."""
    if in_bytes:
        return f"{gib(pool):.2f} GiB KV cache{per}"
    return f"{int(pool):,}{tokens}{per}"
