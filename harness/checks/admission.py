"""Admission by KV blocks: a scheduler that reserves what a request can need admits a newcomer
only when the pool can hold it, and then without delay. Pure checks over a step-driven Trace.

sendnn-inference 2.x admits a waiting request only when the free blocks, less every block it
has promised the requests it runs, can hold the newcomer's prompt and max_tokens; it never
preempts. vllm-spyre 1.x continuous batching reserves a joining request's worst case from the
batch's TKV (its runner's ``req_ids2num_reserved_blocks``) against the free count its runner
reports. Two invariants of the ledger path (``check_ledger``), both computed from the step's
own state (the previous step's ledger, the requests' prompt lengths and max_tokens), never from
the plugin's arithmetic:

- ``overcommit``: at the step a request is admitted, the blocks it takes from the pool (its
  own blocks not shared with a request already running, and what it is promised or reserves)
  fit in the room before the step: free blocks less what is still promised (2.x, its promises
  as the requests' prompt and max_tokens make them), or the free count the runner reported
  plus the reservations it drops at this step (1.x).
- ``hold_back`` (2.x): the request at the head of the queue is not held back at a step where
  the scheduler had room for it: fewer than max_num_seqs running, no prefill under way, the
  previous step no prefill beside decoding requests (the plugin interleaves a decode step
  after each prefill), nobody paused, the batch TKV limit unable to bind
  (``tkv_limit_may_bind``) and its prompt + max_tokens fitting the room. 1.x also holds a
  request back when its output would pass max_model_len from the batch's TKV, and reserves
  by that TKV: the reservation the room must hold is the plugin's formula, so 1.x is judged
  on ``overcommit`` only.

What a step records for this (``StepRecord.arrived``, ``prefilled``, ``prefilling``,
``RequestTrace.max_tokens``) is None in older traces, and then these checks say nothing.
``check_blocks_limited_admission`` is the precondition of the block-admission suite: some
newcomer was held back because the blocks, not the batch, were short.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from harness.checks.promises import request_need
from harness.checks.tkv import TKV_LIMIT_INFO
from harness.core.trace import KvSnapshot, StepRecord, Trace
from harness.core.verdict import FULL_BATCH, Verdict, Violation
from harness.render.ledger_table import format_step_table

OVERCOMMIT = "overcommit"
HOLD_BACK = "hold_back"
# The precondition's check: filed with the full-batch precondition (the run never exercised
# what the test is about).
BLOCKS_LIMITED = f"{FULL_BATCH}.blocks_limited"


def step_ranges(steps: Iterable[int]) -> str:
    """Step numbers as ranges: ``0-41, 45, 50-52`` (``-`` for none)."""
    ordered = sorted(set(steps))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(parts) or "-"


def _count(n: int, noun: str = "block") -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# -- the ledger each generation admits by


def promise_ledger(record: StepRecord) -> KvSnapshot | None:
    """The snapshot holding a 2.x scheduler's promises (vLLM's scheduler pool)."""
    return next((s for s in record.kv if s.promised is not None), None)


def reservation_ledger(record: StepRecord) -> KvSnapshot | None:
    """The snapshot holding a 1.x runner's reservations and the free count it reports."""
    return next((s for s in record.kv if s.reserved is not None and s.reported_free is not None
                 and s.promised is None), None)


def expected_promise(trace: Trace, s: KvSnapshot, req_id: str) -> int:
    """What request ``req_id`` should still be promised in ``s``: its ``blocks_to_serve`` less
    the blocks it owns; the recorded promise where the trace lacks its max_tokens, or the
    scheduler no longer serves it (a promise kept for a gone request still holds blocks
    back: ``promises`` reports it)."""
    recorded = (s.promised or {}).get(req_id, 0)
    need = request_need(trace, req_id, s.block_size)
    served = s.serving is None or req_id in s.serving
    if need is None or not served:
        return recorded
    return max(0, need - len(s.owned.get(req_id, [])))


@dataclass(frozen=True)
class Room:
    """What the pool could hold before a step: ``free`` blocks less ``held`` (promised or
    reserved and not yet handed out), with the words that say how it was counted."""

    free: int
    held: int
    how: str

    @property
    def blocks(self) -> int:
        return self.free - self.held


def room_before(trace: Trace, prev: StepRecord, record: StepRecord) -> Room | None:
    """The room the scheduler had when it admitted at ``record``'s step, from the ledger after
    the step before (``prev``); None where the trace records no promises or reservations."""
    s = promise_ledger(prev)
    if s is not None:
        held = sum(expected_promise(trace, s, r) for r in s.promised or {})
        return Room(s.free_count(), held, f"{s.free_count()} free - {held} promised")
    s = reservation_ledger(prev)
    if s is not None and s.reported_free is not None:
        # The runner drops the reservations of the requests this step's output tells it of.
        dropped = sum((s.reserved or {}).get(d, 0) for d in record.delivered_finished)
        how = f"{s.reported_free} reported free" + (f" + {dropped} released" if dropped else "")
        return Room(s.reported_free + dropped, 0, how)
    return None


def _admitted(prev: StepRecord, record: StepRecord) -> list[tuple[str, KvSnapshot]]:
    """Requests that got a promise (2.x) or a reservation (1.x) at ``record``'s step."""
    now, before = promise_ledger(record), promise_ledger(prev)
    if now is not None and before is not None:
        return [(r, now) for r in now.promised or {} if r not in (before.promised or {})]
    now, before = reservation_ledger(record), reservation_ledger(prev)
    if now is not None and before is not None:
        return [(r, now) for r in now.reserved or {} if r not in (before.reserved or {})]
    return []


def _taken(trace: Trace, prev: StepRecord, s: KvSnapshot, req_id: str) -> tuple[int, str]:
    """Blocks request ``req_id`` took from the pool at its admission, and how they add up."""
    if s.promised is None:  # 1.x: the reservation covers its own blocks too
        n = (s.reserved or {}).get(req_id, 0)
        return n, f"reserves {_count(n)}"
    before = promise_ledger(prev)
    others = {b for r, ids in (before.owned if before else {}).items() if r != req_id for b in ids}
    own = s.owned.get(req_id, [])
    shared = len([b for b in own if b in others])  # prefix-cache hits on running requests' blocks
    need = request_need(trace, req_id, s.block_size)
    req = trace.ran().get(req_id)
    if need is not None and req is not None:
        total = len(req.prompt_token_ids) + (req.max_tokens or 0)
        how = f"needs ceil({total}/{s.block_size}) = {_count(need)}"
        return need - shared, how + (f", {shared} shared from the prefix cache" if shared else "")
    n = len(own) + (s.promised or {}).get(req_id, 0) - shared
    return n, f"takes {_count(n)} (owned and promised)"


def check_overcommit(trace: Trace) -> list[Violation]:
    """At the step a request is admitted, the blocks it takes fit in the room before it."""
    out: list[Violation] = []
    records = trace.ledger_steps()
    for prev, record in zip(records, records[1:], strict=False):
        if record.aborted:  # an abort frees blocks between the two snapshots
            continue
        room = room_before(trace, prev, record)
        if room is None:
            continue
        left = room.blocks
        for req_id, s in _admitted(prev, record):
            taken, how = _taken(trace, prev, s, req_id)
            if taken > left:
                out.append(Violation(
                    OVERCOMMIT,
                    f"request {req_id} was admitted: it {how}, but the pool had room for"
                    f" {_count(left)} ({room.how}): admission overcommitted the pool",
                    record.step, s.source))
            left -= taken
    return out


# -- hold-back


def tkv_limit(trace: Trace) -> int | None:
    """The batch TKV limit: what the engine reported, else max_model_len x max_num_seqs (the
    plugin's default); None where the trace knows neither."""
    limit = trace.info.get(TKV_LIMIT_INFO)
    if limit:
        return int(limit)
    seqs, length = trace.info.get("max_num_seqs"), trace.info.get("max_model_len")
    return int(seqs) * int(length) if seqs and length else None


def tkv_limit_may_bind(trace: Trace, prev: StepRecord, record: StepRecord) -> bool:
    """Whether the batch TKV limit may have held a newcomer back at ``record``'s step.

    Conservative: a pause at the step or the one before binds (paused requests go first);
    with pausing off (the scheduler's snapshot says so) the scheduler applies the limit at
    admission by its own estimate of the batch's future TKVs, which may bind whenever the
    batch is not empty; otherwise the limit cannot bind where the batch with the newcomer,
    every request at max_model_len, stays within it. Where it may bind this module says
    nothing: the TKV checks (``harness.checks.tkv``, ``held_back_with_room``) compute the
    batch's real TKVs there.
    """
    if prev.paused or record.paused:
        return True
    snap = promise_ledger(prev)
    if snap is not None and getattr(snap, "pausing", None) is False:  # recorded by the TKV probe
        return bool(prev.running)
    limit, length = tkv_limit(trace), trace.info.get("max_model_len")
    if limit is None or not length:
        return True
    return (len(prev.running) + 1) * int(length) > limit


def _queue_before(prev: StepRecord, record: StepRecord) -> list[str]:
    """The waiting queue the scheduler saw at ``record``'s step, in order."""
    arrived = [r for r in record.arrived or [] if r not in prev.waiting]
    return [r for r in [*prev.waiting, *arrived] if r not in record.aborted]


def _why_waiting(trace: Trace, prev: StepRecord, record: StepRecord,
                 head: str) -> str | None:
    """Why the scheduler may hold ``head`` back at ``record``'s step (None: no reason)."""
    seqs = trace.info.get("max_num_seqs")
    if seqs and len(prev.running) >= int(seqs):
        return "the batch is full"
    if prev.prefilling:
        return f"the prefill of {', '.join(prev.prefilling)} is under way"
    if prev.prefilled and prev.running:
        return "a decode step follows a prefill step (interleaving)"
    if tkv_limit_may_bind(trace, prev, record):
        return "the batch TKV limit may bind"
    return None


def check_hold_back(trace: Trace) -> list[Violation]:
    """2.x: the head of the queue is admitted at every step where the scheduler had room for
    it (``_why_waiting`` finds no reason and its blocks fit)."""
    out: list[Violation] = []
    if not trace.info.get("max_num_seqs"):
        return out
    records = trace.ledger_steps()
    for prev, record in zip(records, records[1:], strict=False):
        s = promise_ledger(prev)
        if (s is None or record.aborted or record.arrived is None or prev.prefilling is None
                or prev.prefilled is None):
            continue
        queue = _queue_before(prev, record)
        if not queue or queue[0] not in record.waiting:
            continue
        head = queue[0]
        need = request_need(trace, head, s.block_size)
        if need is None or _why_waiting(trace, prev, record, head) is not None:
            continue
        room = room_before(trace, prev, record)
        if room is None or need > room.blocks:
            continue
        out.append(Violation(
            HOLD_BACK,
            f"request {head} was held back although the scheduler had room for it:"
            f" {len(prev.running)} of {trace.info['max_num_seqs']} running, no prefill under"
            f" way, nobody paused, and its {_count(need)} fit in {_count(room.blocks)}"
            f" ({room.how})", record.step, s.source))
    return out


def admission_violations(trace: Trace) -> list[Violation]:
    """``overcommit`` and ``hold_back`` over ``trace``."""
    return check_overcommit(trace) + check_hold_back(trace)


# -- the suite's precondition, and the table a failure prints


def _held_steps(trace: Trace) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for record in trace.steps:
        for r in record.waiting:
            out.setdefault(r, []).append(record.step)
    return out


def check_blocks_limited_admission(trace: Trace) -> Verdict:
    """The precondition of a pool smaller than a full batch: at some step the head of the
    queue waited while the batch had room (fewer than max_num_seqs running) and the pool did
    not (its blocks, 2.x, or the reservation it later got, 1.x, beyond the room)."""
    seqs = trace.info.get("max_num_seqs")
    records = trace.ledger_steps()
    seen_ledger = False
    for prev, record in zip(records, records[1:], strict=False):
        room = room_before(trace, prev, record)
        if room is None or not seqs or record.aborted:
            continue
        seen_ledger = True
        queue = _queue_before(prev, record)
        if not queue or queue[0] not in record.waiting or len(prev.running) >= int(seqs):
            continue
        head = queue[0]
        need = _eventual_need(trace, head)
        if need is not None and need > room.blocks:
            return Verdict.passed(BLOCKS_LIMITED, f"request {head} held back at step"
                                  f" {record.step}: {len(prev.running)} of {seqs} running,"
                                  f" its {_count(need)} beyond {_count(room.blocks)} ({room.how})")
    if not seen_ledger:
        return Verdict.failed(BLOCKS_LIMITED, "blocks never limited admission: the trace"
                              " records neither promises nor reservations (no block admission"
                              " to see)")
    waits = "; ".join(f"{r} waited at steps {step_ranges(s)}"
                      for r, s in sorted(_held_steps(trace).items())) or "no request waited"
    why = ("blocks never limited admission: no request was held back for lack of blocks while"
           f" the batch had room ({waits})")
    at = trace.steps[0].step if trace.steps else -1
    return Verdict.failed(BLOCKS_LIMITED, why, at=at,
                          details=why + "\n" + format_step_table(trace.ledger_steps(), at))


def _eventual_need(trace: Trace, req_id: str) -> int | None:
    """The blocks request ``req_id`` needs: by its prompt and max_tokens where the promises are
    recorded (2.x), else the reservation it got when admitted (1.x)."""
    for record in trace.ledger_steps():
        s = promise_ledger(record)
        if s is not None:
            return request_need(trace, req_id, s.block_size)
        s = reservation_ledger(record)
        if s is not None and (s.reserved or {}).get(req_id):
            return (s.reserved or {})[req_id]
    return None


def admission_lines(trace: Trace, request_ids: Iterable[str]) -> list[str]:
    """Per request: when it arrived, the steps it waited (ranges), when it was admitted and
    finished, and the blocks it needs; for the failure text of the admission checks."""
    lines = []
    waited = _held_steps(trace)
    for req_id in sorted(set(request_ids)):
        arrived = next((r.step for r in trace.steps if req_id in (r.arrived or [])), None)
        admitted = next((r.step for r in trace.steps
                         if req_id in r.running or req_id in r.paused), None)
        finished = next((r.step for r in trace.steps if req_id in r.finished), None)
        s = next((k for r in trace.ledger_steps() for k in r.kv if k.block_size), None)
        need = request_need(trace, req_id, s.block_size if s else None)
        lines.append(
            f"  {req_id}: arrived at step {'-' if arrived is None else arrived}, waited at"
            f" steps {step_ranges(waited.get(req_id, []))}, admitted at step"
            f" {'-' if admitted is None else admitted}, finished at step"
            f" {'-' if finished is None else finished}"
            + ("" if need is None else f"; needs {_count(need)}"))
    return lines


# The invariants whose failure text adds the per-request admission lines.
ADMISSION_INVARIANTS = frozenset({OVERCOMMIT, HOLD_BACK, "promise_exact"})


def admission_details(trace: Trace, violations: list[Violation]) -> list[str]:
    """The per-request admission lines (``admission_lines``) when an admission or promise
    invariant is among ``violations``; nothing otherwise."""
    if not any(v.invariant in ADMISSION_INVARIANTS for v in violations):
        return []
    ids = set(trace.ran()) | {r for s in trace.steps for r in (*s.waiting, *s.running)}
    return ["requests (admission):", *admission_lines(trace, ids)[:MAX_REQUEST_LINES]]


MAX_REQUEST_LINES = 20
