"""Per-step KV snapshots that cost what changed in the step, not the pool size.

A full snapshot walks the pool's free list and every block's ref count: O(pool).
On pools larger than ``FULL_PROBE_MAX_BLOCKS`` a step-driven run instead sends,
between full snapshots, a delta: the blocks that became owned since the previous
snapshot (``free_taken``, they left the free list) and the blocks no request owns
any more whose ref count is 0 (``free_returned``, they joined it), with the ref
counts of just those blocks. Cost: O(owned blocks) for the owned-map diff plus the
pool's O(1) free counter. The host follows the free list from the deltas
(``harness.core.kv_delta``).

A full snapshot is still taken at the start, at the last step (idle), at checkpoints
(every ``CHECKPOINT_EVERY`` snapshots, or every ``num_blocks / BLOCKS_PER_CHECKPOINT_STEP``
on larger pools, so that a checkpoint's cost spread over the steps between two of them
stays the same at any pool size), and at any step where the pool's free counter
differs from the count the deltas predict: a block put into (or dropped from) the
free list behind the owners' backs, such as a double free or a freed pad block,
moves the counter, so the per-step invariants see it at the step it happens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

# Pools up to this size get a full snapshot every step (cheap there: a few ms).
FULL_PROBE_MAX_BLOCKS = 4096  # default of HIL_FULL_PROBE_MAX_BLOCKS
# A full snapshot every this many snapshots of one pool (at least) ...
CHECKPOINT_EVERY = 32  # default of HIL_PROBE_CHECKPOINT_EVERY
# ... or every num_blocks / this many on larger pools: a full read and check costs about
# a microsecond per block, so a checkpoint then adds about 1 ms per step at any pool size.
BLOCKS_PER_CHECKPOINT_STEP = 1024


def checkpoint_every(num_blocks: int) -> int:
    """Snapshots between two full ones of a pool of ``num_blocks`` (delta probes only)."""
    every = int(os.environ.get("HIL_PROBE_CHECKPOINT_EVERY", CHECKPOINT_EVERY))
    return max(every, -(-num_blocks // BLOCKS_PER_CHECKPOINT_STEP))


@dataclass
class _PoolState:
    owned: set[int]
    counted_free: int
    since_full: int = 0


@dataclass
class Delta:
    """What changed in one pool since its previous snapshot."""

    taken: list[int]
    returned: list[int]
    ref_counts: dict[int, int]


@dataclass
class DeltaTracker:
    """Per-run state of the delta probe: the previous snapshot's owned blocks per pool.

    ``force_full`` makes the next snapshot of every pool a full one (set it before the
    last step of a run). Create one per run: the first snapshot of each pool is full.
    """

    force_full: bool = False
    _pools: dict[str, _PoolState] = field(default_factory=dict)

    def delta(self, source: str, pool: Any, owned_ids: set[int], counted_free: int) -> Delta | None:
        """The delta of ``pool`` since the previous snapshot, or None when a full one is due.

        ``owned_ids`` are the non-pad blocks owned now. Call ``record_full`` after
        taking a full snapshot instead.
        """
        blocks = pool.blocks
        prev = self._pools.get(source)
        if (
            prev is None
            or self.force_full
            or len(blocks) <= int(os.environ.get("HIL_FULL_PROBE_MAX_BLOCKS", FULL_PROBE_MAX_BLOCKS))
            or prev.since_full + 1 >= checkpoint_every(len(blocks))
        ):
            return None
        n = len(blocks)
        if any(b < 0 or b >= n for b in owned_ids):
            return None  # ids outside the pool: the full checks say so
        taken = sorted(owned_ids - prev.owned)
        gone = prev.owned - owned_ids
        returned = sorted(b for b in gone if blocks[b].ref_cnt == 0)
        if counted_free != prev.counted_free - len(taken) + len(returned):
            return None  # the free list moved apart from the owners: look at all of it
        prev.owned = owned_ids
        prev.counted_free = counted_free
        prev.since_full += 1
        refs = {b: int(blocks[b].ref_cnt) for b in owned_ids | gone}
        return Delta(taken=taken, returned=returned, ref_counts=refs)

    def record_full(self, source: str, owned_ids: set[int], counted_free: int) -> None:
        """Remember a full snapshot's owned blocks and free count as the next delta's base."""
        self._pools[source] = _PoolState(owned=set(owned_ids), counted_free=counted_free)
