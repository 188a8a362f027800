"""KV block ledger invariants: pure checks of ``KvSnapshot``s and a step-driven Trace.

Each invariant is a function of one snapshot returning ``Violation``s (empty:
it holds). ``check_ledger`` is the one driver over a Trace: every per-step
invariant on every snapshot, the idle invariant at the idle points (after
start-up and, when the run drained, the last step), and the dummy-return rule;
it returns one ``Verdict`` naming the first broken invariant, its step, and a
per-step table marking that step.

Deferred freeing: vLLM hands finished request ids to the worker in the next
scheduler output, so a runner still holds a finished request's blocks until the
engine schedules one more step. The idle check applies only at a step taken
after that (when ``scheduler.has_requests()`` is false: ``Trace.idle_at_end``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from harness.checks.admission import admission_details, admission_violations
from harness.checks.block_timing import check_freed_on_finish
from harness.checks.device_blocks import check_device_counts, check_device_ids
from harness.checks.promises import (
    check_idle_promises,
    check_promises,
    check_runner_lag,
    check_runner_table,
    promise_violations,
)
from harness.checks.ranks import check_ranks_agree
from harness.checks.tkv import tkv_violations
from harness.core.trace import KvSnapshot, StepRecord, Trace, is_dummy_id
from harness.core.verdict import KV_LEDGER, KV_LEDGER_UNRECORDED, Verdict, Violation
from harness.render.ledger_table import format_step_table

# How many violations a failure message lists.
MAX_LISTED = 20

def _count(n: int, noun: str = "block") -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"

def _blocks(ids: Iterable[int]) -> str:
    return "[" + ", ".join(str(b) for b in ids) + "]"

def _holders(s: KvSnapshot) -> dict[int, list[str]]:
    # block id -> owner ids, one entry per listing (so a repeat shows twice)
    holders: dict[int, list[str]] = defaultdict(list)
    for req_id, ids in s.owned.items():
        for b in ids:
            holders[b].append(req_id)
    return holders

def _free_members(s: KvSnapshot) -> set[int] | frozenset[int]:
    """The free list as a set, for membership tests of owned, pad and touched blocks.

    For a delta snapshot only those blocks can have moved since the previous snapshot,
    and its view says which of them are free, so the checks cost O(blocks touched).
    """
    return s.delta_view.free_hits if s.delta_view is not None else set(s.free_blocks)


def _nowhere(s: KvSnapshot, free: set[int] | frozenset[int], holders: dict[int, list[str]]) -> list[int]:
    """Non-pad block ids of the pool that are neither free nor owned, sorted."""
    if s.delta_view is not None:
        return sorted(s.delta_view.nowhere)
    return sorted(set(range(s.num_blocks)).difference(free, holders, s.pad_blocks))


def _v(invariant: str, s: KvSnapshot, message: str) -> Violation:
    return Violation(invariant=invariant, message=message, source=s.source)

def check_conservation(s: KvSnapshot) -> list[Violation]:
    """Free, owned and pad blocks together are exactly ``range(num_blocks)``, each in one place.

    Flags blocks that are nowhere, ids outside the pool, a block both free and owned,
    a block owned by two requests (unless prefix caching is on and the pool's ref
    count equals its number of holders), and a block listed twice by one request.
    Pad blocks in the free list or owned, and repeats within the free list, are left
    to ``check_pad_never_owned`` and ``check_no_double_free``.
    """
    name = "conservation"
    out: list[Violation] = []
    pad = set(s.pad_blocks)
    free = _free_members(s)
    holders = _holders(s)

    for req_id, ids in s.owned.items():
        for b, n in sorted(Counter(ids).items()):
            if n > 1 and b not in pad:
                out.append(_v(name, s, f"request {req_id} lists block {b} {n} times"))

    for b in sorted(holders):
        if b in pad:
            continue
        owners = holders[b]
        distinct = list(dict.fromkeys(owners))
        if b in free:
            out.append(
                _v(name, s, f"block {b} is in the free list and owned by {', '.join(distinct)}")
            )
        if len(distinct) > 1:
            shared_ok = (
                s.prefix_caching and s.ref_counts is not None and s.ref_counts.get(b) == len(owners)
            )
            if not shared_ok:
                rc = "" if s.ref_counts is None else f" (ref count {s.ref_counts.get(b, 0)})"
                out.append(
                    _v(name, s, f"block {b} is owned by {' and '.join(distinct)} at once{rc}")
                )

    valid = range(s.num_blocks)
    stray = {b for b in [*holders, *pad] if b not in valid}
    if free and (min(free) < 0 or max(free) >= s.num_blocks):  # a full scan only when needed
        stray |= {b for b in free if b not in valid}
    for b in sorted(stray):
        places = []
        if b in free:
            places.append("in the free list")
        if b in holders:
            places.append(f"owned by {', '.join(dict.fromkeys(holders[b]))}")
        if b in pad:
            places.append("a pad block")
        out.append(
            _v(
                name,
                s,
                f"block {b} ({'; '.join(places)}) is outside the pool of "
                f"{s.num_blocks} blocks (ids 0..{s.num_blocks - 1})",
            )
        )

    missing = _nowhere(s, free, holders)
    if missing:
        out.append(
            _v(
                name,
                s,
                f"{len(missing)} of {s.num_blocks} blocks are neither free, owned nor pad: "
                f"{_blocks(missing)}",
            )
        )
    return out

def check_pad_never_owned(s: KvSnapshot) -> list[Violation]:
    """No pad block is owned by any request or sits in the free list."""
    name = "pad_never_owned"
    out: list[Violation] = []
    holders = _holders(s)
    pads = set(s.pad_blocks)
    listed = s.delta_view.free_hits if s.delta_view is not None else s.free_blocks
    free = Counter(b for b in listed if b in pads)
    for b in s.pad_blocks:
        if b in holders:
            owners = ", ".join(dict.fromkeys(holders[b]))
            out.append(_v(name, s, f"pad block {b} is owned by {owners}"))
        if free[b]:
            times = "" if free[b] == 1 else f" {free[b]} times"
            out.append(_v(name, s, f"pad block {b} is in the free list{times}"))
    return out

def check_no_double_free(s: KvSnapshot) -> list[Violation]:
    """No block id appears twice in the free list."""
    if s.delta_view is not None or len(set(s.free_blocks)) == len(s.free_blocks):
        return []  # a delta's free list is rebuilt without repeats: they show in full reads
    return [
        _v("no_double_free", s, f"block {b} appears {n} times in the free list")
        for b, n in sorted(Counter(s.free_blocks).items())
        if n > 1
    ]

def check_free_counter(s: KvSnapshot) -> list[Violation]:
    """Where the pool keeps a free count, it equals the length of its free list.

    A block appended to vLLM's linked free list while already in it unlinks the
    blocks after it but still bumps the counter, so the two drift apart.
    """
    if s.counted_free is None or s.counted_free == s.free_len():
        return []
    return [
        _v(
            "free_counter",
            s,
            f"the pool counts {_count(s.counted_free, 'free block')} but its free list holds "
            f"{s.free_len()}",
        )
    ]

def check_ref_counts(s: KvSnapshot) -> list[Violation]:
    """Where ref counts are known, each non-pad block's count equals how often it is held.

    A free block must have count 0; a block held by k listings must have count k.
    """
    if s.ref_counts is None:
        return []
    name = "ref_counts"
    out: list[Violation] = []
    pad = set(s.pad_blocks)
    holders = _holders(s)
    for b in sorted((set(s.ref_counts) | set(holders)) - pad):
        held = holders.get(b, [])
        count = s.ref_counts.get(b, 0)
        if count != len(held):
            who = f"held by {', '.join(held)}" if held else "held by no request"
            out.append(_v(name, s, f"block {b} has ref count {count} but is {who}"))
    return out

def check_within_reservation(s: KvSnapshot) -> list[Violation]:
    """Where reservations are known, no request owns more blocks than it reserved.

    A request that owns blocks but has no reservation counts as having reserved 0.
    """
    if s.reserved is None:
        return []
    name = "within_reservation"
    out: list[Violation] = []
    for req_id, ids in s.owned.items():
        limit = s.reserved.get(req_id)
        if limit is None:
            out.append(
                _v(
                    name,
                    s,
                    f"request {req_id} owns {_count(len(ids))} {_blocks(ids)} "
                    "but has no reservation",
                )
            )
        elif len(ids) > limit:
            out.append(
                _v(
                    name,
                    s,
                    f"request {req_id} owns {_count(len(ids))} {_blocks(ids)} but reserved {limit}",
                )
            )
    return out

def expected_reported_free(s: KvSnapshot) -> int:
    """Usable free blocks minus blocks still promised to requests the runner serves.

    A promise is a reservation minus the blocks its request already owns; it counts only
    for a request in the runner's request table (``serving``, read apart from the
    reservations), so a reservation left behind by a finished request is not a promise.
    Where the table is unknown, every reservation counts.
    """
    serving = None if s.serving is None else set(s.serving)
    outstanding = sum(
        max(0, n - len(s.owned.get(req_id, [])))
        for req_id, n in (s.reserved or {}).items()
        if serving is None or req_id in serving
    )
    return s.free_count() - outstanding


def check_reported_free(s: KvSnapshot) -> list[Violation]:
    """Where a reported free count is known, it equals the ledger's.

    The ledger's count is the distinct non-pad blocks in the free list minus the blocks
    still promised to the requests the runner serves (``expected_reported_free``). The
    two sources are independent: the free list and the request table against the count
    the runner reports (vllm-spyre 1.x CB: its block count minus its reservations), so a
    reservation kept for a request the runner no longer serves breaks this invariant
    alone, at the step the runner drops the request.
    """
    if s.reported_free is None:
        return []
    expected = expected_reported_free(s)
    if s.reported_free == expected:
        return []
    free = s.free_count()
    detail = f"{free} free" if expected == free else f"{free} free - {free - expected} promised"
    unserved = sorted(r for r, n in (s.reserved or {}).items()
                      if n and s.serving is not None and r not in s.serving)
    leaked = f"; reservations of requests not served: {', '.join(unserved)}" if unserved else ""
    return [
        _v(
            "reported_free",
            s,
            f"reported {_count(s.reported_free, 'free block')} but the ledger has {expected}"
            f" ({detail}){leaked}",
        )
    ]


def check_idle_all_free(s: KvSnapshot) -> list[Violation]:
    """At idle every non-pad block is free and no request, dummy or not, owns or reserves any."""
    name = "idle_all_free"
    out: list[Violation] = []
    dummies = set(s.dummy_ids)
    for req_id, ids in s.owned.items():
        if ids:
            kind = "dummy request" if req_id in dummies or is_dummy_id(req_id) else "request"
            out.append(_v(name, s, f"at idle, {kind} {req_id} still owns blocks {_blocks(ids)}"))
    for req_id, n in (s.reserved or {}).items():
        if n:
            out.append(_v(name, s, f"at idle, request {req_id} still reserves {_count(n)}"))
    holders = _holders(s)
    lost = _nowhere(s, _free_members(s), holders)
    if lost:
        out.append(_v(name, s, f"at idle, blocks {_blocks(lost)} are not free and not owned"))
    return out

STEP_CHECKS = (
    check_conservation,
    check_device_ids,
    check_pad_never_owned,
    check_no_double_free,
    check_free_counter,
    check_ref_counts,
    check_within_reservation,
    check_reported_free,
    check_promises,
    check_runner_table,
    check_ranks_agree,
)

def _at(violations: list[Violation], step: int | None) -> list[Violation]:
    return [
        Violation(invariant=v.invariant, message=v.message, step=step, source=v.source)
        for v in violations
    ]

def check_step(s: KvSnapshot, step: int | None) -> list[Violation]:
    """Every per-step invariant (all but idle) on one snapshot, each violation tagged ``step``."""
    out: list[Violation] = []
    for check in STEP_CHECKS:
        out.extend(check(s))
    return _at(out, step)

def check_idle(s: KvSnapshot, step: int | None) -> list[Violation]:
    """``check_idle_all_free`` with ``step`` set."""
    return _at(check_idle_all_free(s) + check_idle_promises(s), step)

def check_dummy_returned(steps: list[StepRecord]) -> list[Violation]:
    """Dummy blocks (legacy minimum-decode-batch padding) are back in the pool by the step
    where a second real request runs, or the batch empties: a dummy may hold blocks only at
    a step whose batch held exactly one real request (still running, or finishing in it:
    the runner hears of a finish one step later, as with every freed block)."""
    out: list[Violation] = []
    for d in steps:
        batch = {*d.running, *d.finished}
        running = sorted(r for r in batch if not is_dummy_id(r))
        if len(running) == 1:
            continue
        for s in d.kv:
            for dummy in s.dummy_ids:
                held = s.owned.get(dummy) or []
                if held:
                    why = "the batch is empty" if not running else f"{len(running)} real requests run"
                    out.append(Violation(
                        "dummy_returned",
                        f"dummy {dummy!r} still holds blocks {sorted(held)} although {why}",
                        d.step,
                        s.source,
                    ))
    return out

# ------------------------------------------------------------------ driver

def ledger_violations(trace: Trace) -> list[Violation]:
    """Every ledger invariant over a step-driven trace, each violation tagged with its step.

    Per-step invariants on every snapshot of ``trace.ledger_steps()``; the idle
    invariant at ``trace.idle_steps()``; the dummy-return rule on the engine steps; block
    timing (``harness.checks.block_timing``) on the steps where requests finished; exact
    promises (``harness.checks.promises``) and admission by blocks
    (``harness.checks.admission``, first within its step) and the batch TKV limit
    (``harness.checks.tkv``) where the trace records what they need. Sorted by step (stable
    within a step).
    """
    idle = trace.idle_steps()
    # Admission by blocks first within a step: an overcommit is the cause of the promises
    # that step finds beyond the free blocks.
    out: list[Violation] = admission_violations(trace)
    for record in trace.ledger_steps():
        for s in record.kv:
            out.extend(check_step(s, record.step))
    out.extend(check_dummy_returned(trace.steps))
    out.extend(check_runner_lag(trace.ledger_steps()))
    out.extend(check_device_counts(trace.ledger_steps()))  # once where it appears, not per step
    out.extend(check_freed_on_finish(trace.ledger_steps(), idle))
    out.extend(promise_violations(trace))  # exact promises (sendnn-inference 2.x)
    out.extend(tkv_violations(trace))  # the batch TKV limit, exactly (harness.checks.tkv)
    for record in trace.ledger_steps():
        if record.step in idle:
            for s in record.kv:
                out.extend(check_idle(s, record.step))
    out.sort(key=lambda v: v.step if v.step is not None else -2)
    return out

def _violation_lines(violations: list[Violation]) -> list[str]:
    lines = [
        "invariants broken: " + ", ".join(sorted({v.invariant for v in violations})),
        f"{len(violations)} violation(s):",
    ]
    lines += [f"  step {v.step}: [{v.invariant}]{'' if v.source is None else ' ' + v.source + ':'}"
              f" {v.message}" for v in violations[:MAX_LISTED]]
    if len(violations) > MAX_LISTED:
        lines.append(f"  ... {len(violations) - MAX_LISTED} more")
    return lines

def _reads_line(trace: Trace) -> str:
    """How the ledgers were read, where some step was read as a delta (large pools)."""
    deltas = sum(1 for r in trace.ledger_steps() for s in r.kv if s.delta_view is not None)
    if not deltas:
        return ""
    full = sum(1 for r in trace.ledger_steps() for s in r.kv if s.delta_view is None)
    return f"KV ledgers read as {deltas} per-step deltas and {full} full snapshots"


def check_ledger(trace: Trace) -> Verdict:
    """The KV ledger verdict of a step-driven run: check ``kv_ledger.<first broken
    invariant>`` with its step, the per-step table around it, and every violation."""
    if not any(record.kv for record in trace.ledger_steps()):
        return Verdict.failed(
            KV_LEDGER_UNRECORDED,
            "kv ledger: no KV snapshots were recorded (was the probe switched off?)",
        )
    violations = ledger_violations(trace)
    reads = _reads_line(trace)
    if not violations:
        return Verdict.passed(KV_LEDGER, "all invariants held" + (f" ({reads})" if reads else ""))
    first = violations[0]
    why = f"kv invariant {first.invariant} broken at step {first.step}: {first.message}"
    at = first.step if first.step is not None else -1
    details = "\n".join(
        [why, format_step_table(trace.ledger_steps(), at), *_violation_lines(violations),
         *admission_details(trace, violations), *([reads] if reads else [])]
    )
    return Verdict.failed(f"{KV_LEDGER}.{first.invariant}", why, at=at, details=details)

def check_idle_ledgers(snapshots: list[KvSnapshot], when: str = "after warmup") -> Verdict:
    """Every block is free in each snapshot taken at an idle point (``when`` says which)."""
    problems = [v for s in snapshots for v in check_idle(s, step=-1)]
    if not snapshots:
        return Verdict.failed(KV_LEDGER_UNRECORDED, f"{when}: the engine reported no KV ledger")
    if not problems:
        return Verdict.passed(KV_LEDGER, f"{when}: every block is free")
    why = f"{when}: " + "; ".join(f"[{v.invariant}] {v.message}" for v in problems)
    details = "\n".join([why, *(s.summary() for s in snapshots)])
    return Verdict.failed(f"{KV_LEDGER}.{problems[0].invariant}", why, at=-1, details=details)
