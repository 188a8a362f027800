"""Rebuild full KV snapshots from the per-step deltas a large pool's probe sends.

The engine (``harness.engine.probe_delta``) sends a full snapshot at the start, at
checkpoints and at the last step, and between them only the blocks that left
(``free_taken``) and joined (``free_returned``) the free list, with the ref counts
of the blocks that changed hands. Walking a run's records in order, this keeps
each pool's free list as an insertion-ordered dict (O(changed) per step) and gives
every delta snapshot a free list and ref counts, so every check reads full
snapshots. A step that changed no block shares the previous step's list object.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.trace import KvSnapshot, Trace


class DeltaWithoutBase(ValueError):
    """A delta snapshot arrived with no full snapshot of its pool before it."""


@dataclass
class _Pool:
    free: dict[int, None]
    listed: list[int]
    refs: dict[int, int]


def _apply(pool: _Pool, s: KvSnapshot) -> None:
    taken, returned = s.free_taken or [], s.free_returned or []
    if taken or returned:
        for b in taken:
            pool.free.pop(b, None)
        for b in returned:
            pool.free[b] = None
        pool.listed = list(pool.free)
    owned = {b for ids in s.owned.values() for b in ids}
    refs = dict(pool.refs)
    for b, n in (s.ref_counts or {}).items():
        if n or b in owned:
            refs[b] = n
        else:
            refs.pop(b, None)
    pool.refs = refs
    s.free_blocks = pool.listed
    s.ref_counts = refs
    s.free_taken = s.free_returned = None


def expand_deltas(trace: Trace) -> None:
    """Give every delta snapshot of ``trace`` (initial record first) its full free list
    and ref counts, in place. Raises ``DeltaWithoutBase`` for a delta with no full
    snapshot of its pool earlier in the run."""
    pools: dict[str, _Pool] = {}
    records = ([trace.initial] if trace.initial is not None else []) + list(trace.steps)
    for record in records:
        for s in record.kv:
            if s.free_taken is None and s.free_returned is None:
                pools[s.source] = _Pool(
                    free=dict.fromkeys(s.free_blocks),
                    listed=s.free_blocks,
                    refs=dict(s.ref_counts or {}),
                )
                continue
            pool = pools.get(s.source)
            if pool is None:
                raise DeltaWithoutBase(
                    f"step {record.step}: a KV delta of {s.source} came before any full"
                    " snapshot of that pool; the engine side must send a full one first"
                )
            _apply(pool, s)
