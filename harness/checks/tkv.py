"""The batch TKV limit, exactly: pure checks of a step-driven Trace of sendnn-inference 2.x.

A decode step runs its batch at one TKV (tokens per sequence, the width of the batch's
attention), and the Spyre compiler bounds batch size x TKV by the batch TKV limit
(``VLLM_DT_MAX_BATCH_TKV_LIMIT``). The 2.x scheduler keeps the limit by pausing decoding
requests (they keep their blocks and leave the batch) and resumes them once the batch has
room; with pausing off it applies the limit at admission instead. What these checks read:
the limit the scheduler really uses (``Trace.info["max_batch_tkv_limit"]``), its pausing
switch and chunk and the TKV it predicts for its next decode (on the scheduler's
``KvSnapshot``, read by the Spyre probe, ``harness.targets.spyre.ledger``); the runner's TKV
per step (``StepRecord.tkv``); the tokens each request ran per step
(``StepRecord.executed``), from which each request's length at every step follows (its
prefix-cache hit, ``RequestTrace.num_cached_tokens``, counts as computed when it starts; a
step with a request the trace has no record of, an aborted one, is not judged).

The runner's TKV rule (sendnn-inference 2.6.3, ``_prepare_decode``): at a decode step each
request holds the blocks for its tokens including the one it runs now (``n`` tokens:
``ceil(n / block_size)`` blocks); the batch is made rectangular by left-padding every request
with whole pad blocks up to the largest block count, and the TKV is the furthest position
any request reaches: ``max(pad_blocks(r) * block_size + n(r))``. ``batch_tkv`` computes it
from the lengths alone, so the TKV a batch *would* have had (with a paused request put back,
with a newcomer joined) is computed the same way as the one it had.

The invariants, each at the steps where the trace holds what it needs (none on stacks that
record no limit: vLLM's own scheduler, vllm-spyre 1.x):

- ``tkv_limit``: at every decode step, batch size x the runner's TKV stays within the limit
  (never missing a pause);
- ``runner_tkv``: the runner's TKV is the one its rule gives for the batch's lengths (what the
  other checks compute with);
- ``paused_with_room``: no request is paused at a decode step where putting it back into the
  batch would have kept batch size x TKV within the limit (never pausing early: since adding
  a request never lowers a batch's TKV, a scheduler that pauses only what does not fit never
  leaves such a request out);
- ``tkv_prediction``: the TKV the scheduler predicted, after a step, for the requests then
  decoding equals the runner's TKV at the next decode step that runs exactly those requests;
- ``held_back_with_room``: with pausing on, a newcomer at the head of the waiting queue is not
  held back at a step where nothing was prefilling or paused, the previous step was no prefill
  (the scheduler interleaves a decode between prefill chunks), the batch had room, the free
  blocks not promised held its prompt and max_tokens, and its joining would not pass the limit
  (its first decode computed the same way, the decoders one token further per chunk it needs).
  It judges only the steps where the limit could bind at all (the batch with the newcomer, at
  max_model_len each, passes it): the others are ``hold_back``'s in harness.checks.admission,
  which judges the blocks and leaves these steps to this check.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from harness.checks.computed import ComputedTokens
from harness.core.trace import KvSnapshot, StepRecord, Trace
from harness.core.verdict import KV_LEDGER, KV_LEDGER_UNRECORDED, Verdict, Violation

PREFILL, DECODE, UNKNOWN = "prefill", "decode", "unknown"
# The key of Trace.info under which the engine process records the scheduler's batch TKV limit.
TKV_LIMIT_INFO = "max_batch_tkv_limit"
# The invariants of this module (kv_ledger.<name>), filed as scheduling failures.
TKV_INVARIANTS = ("tkv_limit", "runner_tkv", "paused_with_room", "tkv_prediction",
                  "held_back_with_room")


def batch_tkv(lengths: Iterable[int], block_size: int) -> int:
    """The TKV of a decode step whose requests hold ``lengths`` tokens each (the token each
    runs now included): every request left-padded with whole blocks to the largest block
    count; the furthest position any request then reaches. 0 for an empty batch."""
    lens = list(lengths)
    if not lens:
        return 0
    blocks = [math.ceil(n / block_size) for n in lens]
    top = max(blocks)
    return max((top - b) * block_size + n for n, b in zip(lens, blocks, strict=True))


def scheduler_limits(record: StepRecord) -> KvSnapshot | None:
    """The snapshot of ``record`` that carries what the scheduler keeps the batch TKV limit
    with (its pausing switch, its prediction), if any."""
    return next((k for k in record.kv if k.pausing is not None), None)


@dataclass
class StepState:
    """What a step-driven trace says about one engine step, for the TKV checks.

    ``before`` holds each started request's computed tokens when the step began (its
    prefix-cache hit plus everything it ran before); ``kind`` is PREFILL (a request ran
    prompt tokens), DECODE (every request that ran was past its prompt) or UNKNOWN (a request
    whose prompt length the trace lacks, or nothing ran).
    """

    record: StepRecord
    previous: StepRecord | None
    before: dict[str, int] = field(default_factory=dict)
    kind: str = UNKNOWN
    known: frozenset[str] = frozenset()  # the requests the trace has a record of

    @property
    def batch(self) -> list[str]:
        return list(self.record.executed)


def step_states(trace: Trace) -> list[StepState]:
    """Every engine step of ``trace`` with its requests' lengths and its kind (the step's own
    record of the requests it prefilled, ``StepRecord.prefilled``, where it has one). Every
    request the run ran has a length, an aborted one included (``Trace.ran``); a preempted
    one's is counted again from where it computes again (``harness.checks.computed``)."""
    ran = trace.ran()
    prompts = {r: len(t.prompt_token_ids) for r, t in ran.items()}
    computed = ComputedTokens.of(trace)
    out: list[StepState] = []
    previous = trace.initial
    known = frozenset(ran)
    for record in trace.steps:
        computed.preempted(record.preempted)
        before = {**computed.position, **{r: computed.start(r) for r in record.executed}}
        state = StepState(record, previous, before=before, known=known)
        if record.prefilled:
            state.kind = PREFILL
        elif record.executed:
            if any(r not in known for r in record.executed):
                state.kind = UNKNOWN  # no length to judge it by
            elif any(before[r] < prompts[r] for r in record.executed):
                state.kind = PREFILL
            else:
                state.kind = DECODE
        for r, n in record.executed.items():
            computed.ran(r, n)
        out.append(state)
        previous = record
    return out


def _ids(ids: Iterable[str]) -> str:
    return ", ".join(ids) or "none"


def _lengths(ids: Iterable[str], before: dict[str, int]) -> dict[str, int]:
    # a decode step runs each request's next token: its length is what it computed, plus one
    return {r: before[r] + 1 for r in ids}


def _v(invariant: str, step: int, snap: KvSnapshot, message: str) -> Violation:
    return Violation(invariant, message, step, snap.source)


def check_decode_limit(state: StepState, snap: KvSnapshot, limit: int) -> list[Violation]:
    """``tkv_limit`` and ``runner_tkv`` at one decode step."""
    record = state.record
    if state.kind != DECODE or record.tkv is None:
        return []
    out: list[Violation] = []
    size, tkv = len(state.batch), record.tkv
    if size * tkv > limit:
        out.append(_v("tkv_limit", record.step, snap,
                      f"the decode batch of {size} ({_ids(state.batch)}) ran at TKV {tkv}:"
                      f" {size} x {tkv} = {size * tkv} tokens, over the batch TKV limit {limit}"))
    bs = snap.block_size
    if bs:
        lengths = _lengths(state.batch, state.before)
        rule = batch_tkv(lengths.values(), bs)
        if rule != tkv:
            shown = ", ".join(f"{r}: {n}" for r, n in lengths.items())
            out.append(_v("runner_tkv", record.step, snap,
                          f"the runner ran the decode batch at TKV {tkv}, but its requests'"
                          f" lengths ({shown}), left-padded to whole {bs}-token blocks, give"
                          f" {rule}"))
    return out


def check_paused_with_room(state: StepState, snap: KvSnapshot, limit: int) -> list[Violation]:
    """``paused_with_room`` at one decode step."""
    record, bs = state.record, snap.block_size
    if state.kind != DECODE or not bs or snap.pausing is False:
        return []
    out: list[Violation] = []
    for p in record.paused:
        if p not in state.before or p not in state.known:
            continue  # no length to put back
        lengths = _lengths([*state.batch, p], state.before)
        size, tkv = len(lengths), batch_tkv(lengths.values(), bs)
        if size * tkv <= limit:
            out.append(_v("paused_with_room", record.step, snap,
                          f"request {p} was paused although the batch had room: with it, the"
                          f" batch of {size} ({_ids(lengths)}) would have run at TKV {tkv}:"
                          f" {size} x {tkv} = {size * tkv} tokens, within the batch TKV limit"
                          f" {limit}"))
    return out


def check_prediction(state: StepState) -> list[Violation]:
    """``tkv_prediction`` at one decode step, against the previous record's prediction."""
    record, prev = state.record, state.previous
    snap = None if prev is None else scheduler_limits(prev)
    if (state.kind != DECODE or record.tkv is None or snap is None
            or snap.predicted_tkv is None or snap.predicted_batch is None
            or set(snap.predicted_batch) != set(state.batch)):
        return []
    if snap.predicted_tkv == record.tkv:
        return []
    return [_v("tkv_prediction", record.step, snap,
               f"after step {prev.step if prev else '-'} the scheduler predicted TKV"
               f" {snap.predicted_tkv} for the next decode of {_ids(snap.predicted_batch)}, but"
               f" the runner ran that batch at TKV {record.tkv}")]


@dataclass(frozen=True)
class Admission:
    """What the hold-back check needs beyond the steps: the engine's ``max_num_seqs`` and
    ``max_model_len``, and each finished request's prompt length and max_tokens (as sent,
    else its output length: the harness ignores EOS, so a request that ran to its length
    produced max_tokens tokens)."""

    max_num_seqs: int
    max_model_len: int
    prompts: dict[str, int]
    max_tokens: dict[str, int]

    @classmethod
    def of(cls, trace: Trace) -> Admission | None:
        seqs, length = trace.info.get("max_num_seqs"), trace.info.get("max_model_len")
        if not seqs or not length:
            return None
        ran = trace.ran()  # an aborted request was a newcomer or in the batch as any other
        sent = {r: t.max_tokens if t.max_tokens is not None else len(t.steps)
                for r, t in ran.items()
                if t.max_tokens is not None or t.finish_reason == "length"}
        return cls(int(seqs), int(length),
                   {r: len(t.prompt_token_ids) for r, t in ran.items()}, sent)


def _held_back_reason(state: StepState, adm: Admission, kinds: dict[int, str]) -> str | None:
    """Why the scheduler may hold a newcomer back at this step other than the batch TKV
    limit and the blocks, or None if nothing else may."""
    prev = state.previous
    if prev is None:
        return "no state before the step"
    if prev.paused:
        return "paused requests resume first"
    if prev.prefilling or any(r not in adm.prompts or state.before.get(r, 0) < adm.prompts[r]
                              for r in prev.running):
        return "a prefill is under way"
    if kinds.get(prev.step) == PREFILL and prev.running:
        return "a decode follows a prefill step"
    if len(prev.running) >= adm.max_num_seqs:
        return "the batch is full"
    return None


def check_held_back(state: StepState, snap: KvSnapshot, limit: int, adm: Admission,
                    kinds: dict[int, str]) -> list[Violation]:
    """``held_back_with_room`` at one step where no prefill ran."""
    record, bs = state.record, snap.block_size
    if state.kind == PREFILL or snap.pausing is not True or not record.waiting or not bs:
        return []
    head = record.waiting[0]
    if head in record.executed or head not in adm.prompts or head not in adm.max_tokens:
        return []
    if _held_back_reason(state, adm, kinds) is not None:
        return []
    assert state.previous is not None
    if (len(state.previous.running) + 1) * adm.max_model_len <= limit:
        return []  # the limit cannot bind here: harness.checks.admission judges this step
    prev_snap = scheduler_limits(state.previous)
    if prev_snap is None:
        return []
    prompt, max_tokens = adm.prompts[head], adm.max_tokens[head]
    free = prev_snap.free_count() - (prev_snap.promised_total or 0)
    need = math.ceil((prompt + max_tokens) / bs)
    if need > free:
        return []
    # its first decode comes after its chunks, one interleaved decode of the others per chunk
    chunks = math.ceil(prompt / snap.chunk_size) if snap.chunk_size else 1
    if any(r not in state.known for r in state.previous.running):
        return []
    decoders = {r: state.before.get(r, 0) + 1 + chunks for r in state.previous.running}
    lengths = {**decoders, head: prompt + 1}
    size, tkv = len(lengths), batch_tkv(lengths.values(), bs)
    if size * tkv > limit:
        return []
    return [_v("held_back_with_room", record.step, snap,
               f"request {head} was held back although nothing was prefilling or paused, the"
               f" batch had room ({len(state.previous.running)} of {adm.max_num_seqs} running),"
               f" blocks sufficed ({free} free and not promised, {need} for its prompt of"
               f" {prompt} and max_tokens {max_tokens}) and with it the batch of {size} would"
               f" run at TKV {tkv} at most: {size} x {tkv} = {size * tkv} tokens, within the"
               f" batch TKV limit {limit}")]


def step_ranges(steps: Iterable[int]) -> str:
    """Step numbers as ranges: ``4-128, 131`` (``-`` for none)."""
    ordered = sorted(set(steps))
    parts: list[str] = []
    start = prev = None
    for n in [*ordered, None]:
        if n is not None and prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    return ", ".join(parts) or "-"


# The invariants whose repeats are told per request (the others per run).
_PER_REQUEST = ("paused_with_room", "held_back_with_room")


def _request_of(v: Violation) -> str:
    # "request ID was ..." opens every message of a per-request invariant
    return v.message.split(" ", 2)[1] if v.invariant in _PER_REQUEST else ""


def folded(violations: list[Violation]) -> list[Violation]:
    """One violation per invariant (and request, for pauses and hold-backs): the first, its
    message ending with the other steps where it broke again, as ranges."""
    groups: dict[tuple[str, str], list[Violation]] = {}
    for v in violations:
        groups.setdefault((v.invariant, _request_of(v)), []).append(v)
    out = []
    for group in groups.values():
        first, later = group[0], [v.step for v in group[1:] if v.step is not None]
        again = f" (again at steps {step_ranges(later)})" if later else ""
        out.append(Violation(first.invariant, first.message + again, first.step, first.source))
    return sorted(out, key=lambda v: v.step if v.step is not None else -2)


def tkv_violations(trace: Trace) -> list[Violation]:
    """Every batch-TKV invariant over a step-driven trace, in step order, each folded to its
    first step with the steps it broke again (``folded``); none where the trace records no
    limit or no step recorded the scheduler's side of it."""
    limit = trace.info.get(TKV_LIMIT_INFO)
    if not limit or not any(scheduler_limits(r) for r in trace.steps):
        return []
    states = step_states(trace)
    kinds = {s.record.step: s.kind for s in states}
    adm = Admission.of(trace)
    out: list[Violation] = []
    for state in states:
        snap = scheduler_limits(state.record)
        if snap is None:
            continue
        out.extend(check_decode_limit(state, snap, int(limit)))
        out.extend(check_paused_with_room(state, snap, int(limit)))
        out.extend(check_prediction(state))
        if adm is not None:
            out.extend(check_held_back(state, snap, int(limit), adm, kinds))
    return folded(out)


def check_tkv_recorded(trace: Trace) -> Verdict:
    """The precondition of a test about the batch TKV limit: the trace records the limit and
    the scheduler's side of it, and the TKV checks judged its decode steps (how many, how many
    with a pause, how many predictions they compared). A trace without them is a harness
    problem (``kv_ledger.unrecorded``), never a pass."""
    limit = trace.info.get(TKV_LIMIT_INFO)
    recorded = [r for r in trace.steps if scheduler_limits(r) is not None]
    if not limit or not recorded:
        missing = "the batch TKV limit (Trace.info)" if not limit else "the scheduler's side"
        return Verdict.failed(KV_LEDGER_UNRECORDED, f"batch TKV limit: the trace records no"
                              f" {missing} of it: nothing to judge the limit by")
    states = step_states(trace)
    decodes = [s for s in states if s.kind == DECODE and s.record.tkv is not None]
    if not decodes:
        return Verdict.failed(KV_LEDGER_UNRECORDED, "batch TKV limit: no decode step of the"
                              " run could be judged (no executed tokens, or lengths unknown)")
    paused = sum(1 for s in decodes if s.record.paused)
    compared = 0
    for s in decodes:
        snap = None if s.previous is None else scheduler_limits(s.previous)
        if (snap is not None and snap.predicted_batch is not None
                and set(snap.predicted_batch) == set(s.batch)):
            compared += 1
    return Verdict.passed(KV_LEDGER, f"batch TKV limit {limit}: {len(decodes)} decode steps"
                          f" judged, {paused} with a pause, {compared} predictions compared")
