"""Ledger invariants of a scheduler that owns the KV pool and promises blocks ahead
(sendnn-inference 2.x), and of the runner's own copy of the block table.

sendnn-inference admits a request only when the pool can hold all of it (prompt and
max_tokens) and keeps the blocks not yet allocated as a promise (``reserved_blocks``,
``total_reserved_blocks``). The runner keeps its own block table per request and pads a
batch on the left with block 0, vLLM's null block. Pure functions over ``KvSnapshot``.

``promise_exact`` also compares the amounts with what each request needs: a request the
scheduler serves owns and is promised, together, the blocks of its prompt and max_tokens
(``blocks_to_serve``), its promise only shrinks, and it is gone when the request finishes.
It reads the request's max_tokens from the trace (``RequestTrace.max_tokens``) and says
nothing where a trace lacks it.
"""

from __future__ import annotations

import math

from harness.core.trace import KvSnapshot, StepRecord, Trace
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
    finish one step later) must not belong to another request meanwhile, unless prefix
    caching is on (the other may hold it as a hit on the same prefix).
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
            # with prefix caching the others may hold it as a hit on the same prefix: shared
            if others and b not in pad and not s.prefix_caching:
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


# -- exact promises: what each request needs, from its prompt and max_tokens


def blocks_to_serve(prompt_len: int, max_tokens: int, block_size: int) -> int:
    """The blocks a request's prompt and max_tokens fill: ceil((prompt_len + max_tokens) /
    block_size).

    The last sampled token is never written to the KV cache, so a request can use one block
    fewer (ceil((prompt_len + max_tokens - 1) / block_size)) when prompt_len + max_tokens is
    one more than a multiple of the block size. sendnn-inference 2.x reserves this amount (its
    admission asks the pool for the blocks of the prompt and every output token): that one
    block is promised and never handed out, a safe over-reservation (it can hold a newcomer
    back one block early, never run the pool short), and it is the amount these checks accept.
    Prefix-cache hits do not lower it: a request's own blocks include the cached ones.
    """
    return math.ceil((prompt_len + max_tokens) / block_size)


def request_need(trace: Trace, req_id: str, block_size: int | None) -> int | None:
    """``blocks_to_serve`` of request ``req_id``; None where the trace lacks its max_tokens
    (a trace recorded before they were); an aborted request is judged too (``Trace.ran``)."""
    req = trace.ran().get(req_id)
    if req is None or req.max_tokens is None or not block_size:
        return None
    return blocks_to_serve(len(req.prompt_token_ids), req.max_tokens, block_size)


def check_promise_exact(trace: Trace, step: int, s: KvSnapshot) -> list[Violation]:
    """Every request the scheduler has admitted and still serves owns and is promised, together,
    exactly the blocks its prompt and max_tokens fill (``blocks_to_serve``): one too few and
    the pool can run short under it, one too many holds back a newcomer that fits."""
    if s.promised is None or not s.block_size:
        return []
    out: list[Violation] = []
    for req_id, promised in sorted(s.promised.items()):
        if s.serving is not None and req_id not in s.serving:
            continue  # a leaked reservation: ``promises`` reports it
        need = request_need(trace, req_id, s.block_size)
        req = trace.ran().get(req_id)
        if need is None or req is None:
            continue
        owned = len(s.owned.get(req_id, []))
        if owned + promised == need:
            continue
        off = owned + promised - need
        effect = ("the pool can run short under it" if off < 0
                  else "a newcomer that fits can be held back")
        total = len(req.prompt_token_ids) + (req.max_tokens or 0)
        out.append(Violation(
            "promise_exact",
            f"request {req_id} owns {owned} and is promised {promised} block(s), {owned + promised}"
            f" in all, but its prompt of {len(req.prompt_token_ids)} tokens and max_tokens"
            f" {req.max_tokens} need ceil({total}/{s.block_size}) = {need}: {abs(off)} block(s)"
            f" too {'few' if off < 0 else 'many'} promised ({effect})", step, s.source))
    return out


def check_promises_spent(prev: KvSnapshot, s: KvSnapshot, step: int,
                         finished: list[str]) -> list[Violation]:
    """``promise_exact`` between two steps, where the trace may lack what a request needs: a
    request's promise only shrinks while it runs (the blocks handed out are discounted), and a
    request that finished at this step is promised nothing after it."""
    if s.promised is None or prev.promised is None:
        return []
    out: list[Violation] = []
    for req_id, n in sorted(s.promised.items()):
        before = prev.promised.get(req_id)
        if before is not None and n > before:
            out.append(Violation("promise_exact", f"the promise to request {req_id} grew from"
                                 f" {before} to {n} blocks (a promise only shrinks as its blocks"
                                 " are handed out)", step, s.source))
    for req_id in sorted(finished):
        n = s.promised.get(req_id, 0)
        if n and (s.serving is None or req_id in s.serving):  # else ``promises`` reports it
            out.append(Violation("promise_exact", f"request {req_id} finished at this step but"
                                 f" is still promised {n} blocks", step, s.source))
    return out


def promise_violations(trace: Trace) -> list[Violation]:
    """``promise_exact`` at every step and between consecutive steps, on the ledgers that hold
    a scheduler's promises (sendnn-inference 2.x)."""
    out: list[Violation] = []
    prev: dict[str, KvSnapshot] = {}
    for record in trace.ledger_steps():
        for s in record.kv:
            if s.promised is None:
                continue
            out.extend(check_promise_exact(trace, record.step, s))
            if s.source in prev:
                out.extend(check_promises_spent(prev[s.source], s, record.step, record.finished))
            prev[s.source] = s
    return out
