"""Ledger invariants of a scheduler that owns the KV pool and promises blocks ahead
(sendnn-inference 2.x), and of the runner's own copy of the block table.

sendnn-inference admits a request only when the pool can hold all of it (prompt and
max_tokens) and keeps the blocks not yet allocated as a promise (``reserved_blocks``,
``total_reserved_blocks``). The runner keeps its own block table per request and pads a
batch on the left with block 0, vLLM's null block. Pure functions over ``KvSnapshot``.
"""

from __future__ import annotations

from harness.core.trace import KvSnapshot, StepRecord
from harness.core.verdict import Violation


def _v(invariant: str, s: KvSnapshot, message: str) -> Violation:
    return Violation(invariant=invariant, message=message, source=s.source)


def check_promises(s: KvSnapshot) -> list[Violation]:
    """Promises are never negative, add up to the scheduler's own total, fit in the free
    blocks, and belong to requests the scheduler still has."""
    if s.promised is None:
        return []
    name = "promises"
    out: list[Violation] = []
    total = sum(s.promised.values())
    for req_id, n in sorted(s.promised.items()):
        if n < 0:
            out.append(_v(name, s, f"request {req_id} has a negative promise of {n} blocks"))
    if s.promised_total is not None and s.promised_total != total:
        out.append(_v(name, s, f"the scheduler's promise total is {s.promised_total} but its"
                               f" per-request promises add up to {total}"))
    free = s.free_count()
    if total > free:
        out.append(_v(name, s, f"{total} blocks are promised but only {free} are free: an"
                               " admitted request can run out of blocks"))
    if s.serving is not None:
        live = set(s.serving)
        for req_id, n in sorted(s.promised.items()):
            if n and req_id not in live:
                out.append(_v(name, s, f"{n} blocks are still promised to request {req_id},"
                                       " which the scheduler no longer has (a leaked reservation)"))
    return out


def check_idle_promises(s: KvSnapshot) -> list[Violation]:
    """At idle nothing is promised."""
    if not s.promised and not s.promised_total:
        return []
    held = {r: n for r, n in (s.promised or {}).items() if n}
    if not held and not s.promised_total:
        return []
    return [_v("idle_all_free", s, f"at idle, blocks are still promised: {held or {}}"
                                   f" (total {s.promised_total})")]


def check_runner_table(s: KvSnapshot) -> list[Violation]:
    """The runner's block table agrees with the pool.

    A request the pool still serves has the same blocks, in the same order, in the runner's
    table; the runner never stores a pad block (left padding is added when a batch is built);
    a block the runner still holds for a request the pool has freed (the runner hears of a
    finish one step later) must not belong to another request meanwhile.
    """
    if s.runner_blocks is None:
        return []
    name = "runner_table"
    out: list[Violation] = []
    pad = set(s.pad_blocks)
    holders: dict[int, list[str]] = {}
    for req_id, ids in s.owned.items():
        for b in ids:
            holders.setdefault(b, []).append(req_id)
    for req_id, ids in sorted(s.runner_blocks.items()):
        padded = sorted(set(ids) & pad)
        if padded:
            out.append(_v(name, s, f"the runner stores pad block(s) {padded} among request"
                                   f" {req_id}'s blocks {ids}"))
        pool_ids = s.owned.get(req_id)
        if pool_ids is not None:
            if list(pool_ids) != list(ids):
                out.append(_v(name, s, f"the runner's table gives request {req_id} blocks {ids}"
                                       f" but the pool gives it {list(pool_ids)}"))
            continue
        for b in ids:
            others = [r for r in holders.get(b, []) if r != req_id]
            if others and b not in pad:
                out.append(_v(name, s, f"the runner still holds block {b} for request {req_id},"
                                       f" which the pool freed, while the pool gave it to"
                                       f" {', '.join(others)}"))
    return out


def stale_runner_entries(s: KvSnapshot) -> set[str]:
    """Requests the runner still holds blocks for although the pool no longer serves them."""
    if s.runner_blocks is None:
        return set()
    return {r for r, ids in s.runner_blocks.items() if ids and r not in s.owned}


def check_runner_lag(records: list[StepRecord]) -> list[Violation]:
    """The runner drops a finished request's blocks at the next step: a stale entry seen at
    two consecutive engine steps, or at idle, is one the runner kept."""
    out: list[Violation] = []
    prev: dict[str, set[str]] = {}
    for record in records:
        now: dict[str, set[str]] = {}
        for s in record.kv:
            stale = stale_runner_entries(s)
            now[s.source] = stale
            for req_id in sorted(stale & prev.get(s.source, set())):
                blocks = (s.runner_blocks or {}).get(req_id, [])
                out.append(Violation("runner_table", f"the runner still holds blocks {blocks} of"
                                     f" request {req_id} a step after the pool freed them",
                                     record.step, s.source))
        prev = now
    return out
