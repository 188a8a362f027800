"""The pool's blocks exist on the device: a ledger invariant over ``KvSnapshot.device_blocks``.

The scheduler's pool (or a runner's own pool) hands out block ids; the model runner reads
and writes the KV of a block id in the KV cache tensors it allocated, whose block dimension
is read from their shape (``KvSnapshot.device_blocks``). The two are decided apart: on
sendnn-inference 2.x vLLM sizes the scheduler's pool from ``num_gpu_blocks_override`` and
the runner sizes its tensors from the plugin's own count. A block id at or above the device's
count has no memory behind it: the request's KV lands out of bounds or in another request's
block. Pure functions over ``KvSnapshot``; where the device's count is unknown they hold.
``check_device_ids`` runs on every snapshot (harness.checks.ledger's per-step checks);
``check_device_counts`` reports a count mismatch once per run, where it appears, since both
counts are fixed at start.
"""

from __future__ import annotations

from collections.abc import Iterable

from harness.core.trace import KvSnapshot, StepRecord
from harness.core.verdict import Violation

DEVICE_BLOCKS = "device_blocks"

# How many block ids a message lists before it says how many more there are.
LISTED_IDS = 8


def _ids(ids: Iterable[int]) -> str:
    shown = sorted(ids)
    more = len(shown) - LISTED_IDS
    text = ", ".join(str(b) for b in shown[:LISTED_IDS])
    return f"[{text}{f', ... {more} more' if more > 0 else ''}]"


def _range(n: int) -> str:
    return f"ids 0..{n - 1}" if n > 0 else "no ids"


def _v(s: KvSnapshot, message: str) -> Violation:
    return Violation(invariant=DEVICE_BLOCKS, message=message, source=s.source)


POOL, RUNNER, PAD = "the pool", "the runner's table", "pad"


def missing_ids(s: KvSnapshot) -> list[tuple[str, str | None, list[int]]]:
    """The snapshot's block ids beyond the device's KV cache, as (where, request, ids):
    ``POOL`` or ``RUNNER`` with the request holding them, or ``PAD`` with None; ids sorted.
    Empty where the device's count is unknown or every id exists."""
    n = s.device_blocks
    if n is None:
        return []
    out: list[tuple[str, str | None, list[int]]] = []
    for where, table in ((POOL, s.owned), (RUNNER, s.runner_blocks or {})):
        for req_id, ids in table.items():
            beyond = sorted({b for b in ids if b >= n})
            if beyond:
                out.append((where, req_id, beyond))
    pads = sorted({b for b in s.pad_blocks if b >= n})
    if pads:
        out.append((PAD, None, pads))
    return out


def check_device_ids(s: KvSnapshot) -> list[Violation]:
    """Every block id the pool gives a request, the runner's block table holds and the pad
    blocks is below the number of blocks the device allocated."""
    n = s.device_blocks
    if n is None:
        return []
    out: list[Violation] = []
    device = f"the device's KV cache of {n} blocks ({_range(n)})"
    for where, req_id, ids in missing_ids(s):
        if where == PAD:
            out.append(_v(s, f"pad blocks {_ids(ids)} lie beyond {device}: a padded batch"
                             " reads memory the device never allocated"))
        else:
            out.append(_v(s, f"{where} gives request {req_id} blocks {_ids(ids)} beyond"
                             f" {device}: the request's KV there has no memory behind it"))
    return out


def check_device_count(s: KvSnapshot) -> list[Violation]:
    """The pool counts exactly the blocks the device allocated.

    A pool larger than the device's KV cache is a defect: the scheduler can hand out ids with
    no memory behind them. A pool smaller is a waste: the device holds blocks no request can
    ever get, so admission holds requests back, or preempts them, with memory to spare.
    """
    n = s.device_blocks
    if n is None or s.num_blocks == n:
        return []
    holds = f"the pool has {s.num_blocks} blocks but the device's KV cache holds {n} ({_range(n)})"
    if s.num_blocks > n:
        return [_v(s, f"{holds}: the scheduler can hand out blocks {_ids(range(n, s.num_blocks))},"
                      " which do not exist on the device (a defect: their KV is written out of"
                      " bounds)")]
    return [_v(s, f"{holds}: blocks {_ids(range(s.num_blocks, n))} are allocated and never"
                  " handed out (a waste: admission runs short with device memory to spare)")]


def check_device_blocks(s: KvSnapshot) -> list[Violation]:
    """The whole invariant on one snapshot: ``check_device_ids`` and ``check_device_count``."""
    return check_device_ids(s) + check_device_count(s)


def check_device_counts(records: list[StepRecord]) -> list[Violation]:
    """``check_device_count`` over a run, each ledger's mismatch reported at the step it
    appears and again only where the pool's or the device's count changes: the two are sized
    once, at start, so a mismatch would otherwise repeat at every step."""
    out: list[Violation] = []
    seen: dict[str, tuple[int, int | None]] = {}
    for record in records:
        for s in record.kv:
            counts = (s.num_blocks, s.device_blocks)
            if seen.get(s.source) == counts:
                continue
            seen[s.source] = counts
            out.extend(Violation(v.invariant, v.message, record.step, v.source)
                       for v in check_device_count(s))
    return out
