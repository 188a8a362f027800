"""Sharding one run over N hosts: shard I of N keeps a deterministic slice of the tests.

Tests are assigned by a stable hash of their engine group (target variant and
model), so every host starts each of its engines once and the N slices are
disjoint and together complete, whatever order pytest collected them in.
"""

from __future__ import annotations

import hashlib
from typing import Any


def parse_shard(spec: str) -> tuple[int, int] | None:
    """``"I/N"`` -> (I, N) with 1 <= I <= N; ``""`` -> None."""
    if not spec:
        return None
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard {spec!r}: expected I/N, e.g. 1/2") from None
    if n < 1 or not 1 <= i <= n:
        raise ValueError(f"--shard {spec!r}: I must be between 1 and N (N >= 1)")
    return i, n


def shard_key(item: Any) -> str:
    """The unit that stays on one host: the engine group of a test, else its node id."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "target_variant" in callspec.params:
        v = callspec.params["target_variant"]
        return f"{getattr(v, 'id', 'none')}|{callspec.params.get('model', '')}"
    return item.nodeid


def in_shard(key: str, shard: tuple[int, int]) -> bool:
    i, n = shard
    digest = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return digest % n == i - 1
