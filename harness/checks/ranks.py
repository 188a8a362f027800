"""A tensor-parallel engine's ranks hold one state: a ledger invariant over ``KvSnapshot.ranks``.

Each rank of a tensor-parallel engine runs in a process of its own and keeps its own copy of
the runner's state: the request table with each request's block ids, the KV cache it
allocated (its share of every block's heads), the prefix-cache use per request. The
scheduler decides once for all ranks, so every rank must hold exactly what rank 0 holds at
every step: a rank whose table lags or differs writes a request's KV into blocks the others
read for another one, and the output (gathered from all ranks) goes wrong without any single
rank's ledger breaking. Rank 0's part is what the other ledger checks judge (it stands on the
scheduler's snapshot as a one-rank engine's runner would); this check holds the others to it.
Pure functions; a snapshot without ranks (a one-rank engine) holds trivially.
"""

from __future__ import annotations

from typing import Any

from harness.core.trace import KvSnapshot
from harness.core.verdict import Violation

RANKS_AGREE = "ranks_agree"

# What a rank's facts are compared by, and how a message names each.
_PARTS = (("table", "request block table"), ("runner_blocks", "runner block table"),
          ("device_blocks", "KV cache block count"), ("runner_cached", "prefix-cache use"))


def _part(facts: dict[str, Any], key: str) -> Any:
    return facts.get("table") if key == "table" else (facts.get("fields") or {}).get(key)


def _difference(ours: Any, theirs: Any) -> str:
    """Where two values of a part differ, in a line (the first request that differs, for a
    table)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for req in sorted(set(ours) | set(theirs)):
            if ours.get(req) != theirs.get(req):
                return (f"request {req!r}: {theirs.get(req, 'absent')} against rank 0's"
                        f" {ours.get(req, 'absent')}")
    return f"{theirs!r} against rank 0's {ours!r}"


def check_ranks_agree(s: KvSnapshot) -> list[Violation]:
    """Every rank of ``s.ranks`` holds what rank 0 holds (each part that rank 0 reports), and
    the ranks are 0..N-1 in order, each once."""
    if not s.ranks:
        return []
    out: list[Violation] = []
    numbers = [r.get("rank") for r in s.ranks]
    if numbers != list(range(len(s.ranks))):
        out.append(Violation(RANKS_AGREE, f"the engine's ranks answered as {numbers}, not"
                             f" 0..{len(s.ranks) - 1} each once", source=s.source))
    first = s.ranks[0]
    for facts in s.ranks[1:]:
        for key, what in _PARTS:  # the first part that differs (one table shows in two)
            ours, theirs = _part(first, key), _part(facts, key)
            if ours is not None and ours != theirs:
                out.append(Violation(RANKS_AGREE, f"rank {facts.get('rank')}'s {what} differs"
                                     f" from rank 0's: {_difference(ours, theirs)}",
                                     source=s.source))
                break
    return out
