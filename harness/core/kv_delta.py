"""Follow the per-step deltas a large pool's probe sends, at a cost per step that
does not grow with the pool.

The engine (``harness.in_engine.probe_delta``) sends a full snapshot at the start, at
checkpoints and at the last step, and between them only the blocks that left
(``free_taken``) and joined (``free_returned``) the free list, with the ref counts
of the blocks that changed hands. Walking a run's records in order, this keeps each
pool's free list as an insertion-ordered dict and the set of blocks that are nowhere
(not free, not owned, not pad), both updated from the blocks the step touched, and
gives every delta snapshot a ``DeltaView``: the free list's length, which of the
touched, owned and pad blocks are in it, and the blocks that are nowhere. A delta's
ref counts are those of the blocks owned now or at the previous snapshot (the only
ones that can have changed), which is what the ref-count check reads. The ledger
checks read that view where a full snapshot gives them the whole list
(``harness.checks.ledger``), so checking a delta step costs O(blocks touched) too.

What the view cannot see is what the deltas cannot carry: a free list that changes
behind the owners' backs. The engine answers any such step with a full snapshot (the
pool's free counter no longer matches the deltas), and every full snapshot is
checked in full.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.trace import DeltaView, KvSnapshot, Trace


class DeltaWithoutBase(ValueError):
    """A delta snapshot arrived with no full snapshot of its pool before it."""


@dataclass
class _Pool:
    free: dict[int, None]
    owned: set[int]
    nowhere: set[int]


def _owned(s: KvSnapshot) -> set[int]:
    return {b for ids in s.owned.values() for b in ids}


def _base(s: KvSnapshot) -> _Pool:
    """A pool's state from a full snapshot (O(pool): full snapshots are checked in full)."""
    free = dict.fromkeys(s.free_blocks)
    owned = _owned(s)
    nowhere = set(range(s.num_blocks)).difference(free, owned, s.pad_blocks)
    return _Pool(free=free, owned=owned, nowhere=nowhere)


def _apply(pool: _Pool, s: KvSnapshot) -> None:
    taken, returned = s.free_taken or [], s.free_returned or []
    for b in taken:
        pool.free.pop(b, None)
    for b in returned:
        pool.free[b] = None
    owned = _owned(s)
    pad = set(s.pad_blocks)
    touched = set(taken) | set(returned) | pool.owned | owned
    for b in touched:
        if 0 <= b < s.num_blocks and b not in pool.free and b not in owned and b not in pad:
            pool.nowhere.add(b)
        else:
            pool.nowhere.discard(b)
    pool.owned = owned
    s.delta_view = DeltaView(
        free_len=len(pool.free),
        free_hits=frozenset(b for b in touched | pad if b in pool.free),
        nowhere=frozenset(pool.nowhere),
    )


def expand_deltas(trace: Trace) -> None:
    """Give every delta snapshot of ``trace`` (initial record first) its ``DeltaView``,
    in place; idempotent. Raises ``DeltaWithoutBase`` for a delta with no full snapshot
    of its pool earlier in the run."""
    pools: dict[str, _Pool] = {}
    records = ([trace.initial] if trace.initial is not None else []) + list(trace.steps)
    if not any(s.is_delta() for r in records for s in r.kv):
        return  # a trace of full snapshots (every pool up to the delta threshold)
    for record in records:
        for s in record.kv:
            if not s.is_delta():
                pools[s.source] = _base(s)
                continue
            pool = pools.get(s.source)
            if pool is None:
                raise DeltaWithoutBase(
                    f"step {record.step}: a KV delta of {s.source} came before any full"
                    " snapshot of that pool; the engine side must send a full one first"
                )
            _apply(pool, s)
