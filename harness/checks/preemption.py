"""No recompute at full batch: pure checks over a step-driven Trace.

Two things are asserted, separately, because each alone can lie:
- the precondition: the batch really reached ``max_num_seqs`` running requests
  at once (a run that never fills the batch proves nothing about a full batch);
- zero preemptions, by four signals: the engine's ``vllm:num_preemptions``
  counter, each request's preemption count and the ids the scheduler listed as
  preempted at each step (all three written by the scheduler's preemption path),
  and, outside that path, the tokens the model executor ran per request: a request
  runs its prompt (less what the prefix cache served at admission) plus its output
  minus one token exactly once, and a recomputed request runs tokens again.
A fifth signal, where the scheduler can pause a request (sendnn-inference 2.x): the
requests it paused at each step; a pause keeps the blocks but leaves the batch.
A signal the trace does not carry (the counter missing from the engine's metrics,
no executed-token counts) is an error, never a zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from harness.core.trace import StepRecord, Trace
from harness.core.verdict import (
    FULL_BATCH,
    NO_PREEMPTION,
    PREEMPTION_SEEN,
    PREEMPTION_UNRECORDED,
    Verdict,
)
from harness.render.ledger_table import format_step_table

PREEMPTION_METRIC = "vllm:num_preemptions"


@dataclass
class PreemptionCount:
    """What each signal says about preemption in one run.

    ``metric`` is None when the engine did not report the counter; ``recomputed`` maps
    each finished request to the tokens the executor ran beyond its prompt + output - 1
    (negative: fewer than that), None when the trace has no executed-token counts.
    """

    metric: float | None
    per_request: dict[str, int] = field(default_factory=dict)
    per_step: dict[int, list[str]] = field(default_factory=dict)
    recomputed: dict[str, int] | None = None
    # Requests the scheduler paused, per step (sendnn-inference 2.x): no preemption counter
    # moves, the request keeps its blocks, but it leaves the batch: at full batch in a pool
    # sized for it, a pause is the same failure as a preemption.
    paused: dict[int, list[str]] = field(default_factory=dict)

    @property
    def total_by_request(self) -> int:
        return sum(self.per_request.values())

    @property
    def total_by_step(self) -> int:
        return sum(len(v) for v in self.per_step.values())

    @property
    def total_recomputed(self) -> int:
        return sum(v for v in (self.recomputed or {}).values() if v > 0)

    def missing(self) -> list[str]:
        """The signals the trace does not carry (each one an error, not a zero)."""
        out = []
        if self.metric is None:
            out.append(f"the {PREEMPTION_METRIC} counter (not in the engine's metrics: is"
                       " disable_log_stats off?)")
        if self.recomputed is None:
            out.append("the tokens the executor ran per request (no step recorded them)")
        return out

    def any(self) -> bool:
        return bool((self.metric or 0) > 0 or self.total_by_request or self.total_by_step
                    or any(self.recomputed.values() if self.recomputed else ()) or self.paused)

    def only_paused(self) -> bool:
        """Requests were paused, and no preemption signal moved."""
        return bool(self.paused) and not replace(self, paused={}).any()

    def all_signals_agree_preempted(self) -> bool:
        """Every signal saw at least one preemption (a missing signal saw nothing)."""
        return (self.metric is not None and self.metric > 0 and self.total_by_request > 0
                and self.total_by_step > 0 and self.total_recomputed > 0)

    def describe(self) -> str:
        steps = ", ".join(f"step {s}: {ids}" for s, ids in sorted(self.per_step.items())) or "none"
        reqs = {k: v for k, v in self.per_request.items() if v} or "none"
        metric = "not reported" if self.metric is None else f"{self.metric:g}"
        if self.recomputed is None:
            rerun = "not recorded"
        else:
            rerun = str({k: v for k, v in self.recomputed.items() if v} or "none")
        paused = ", ".join(f"step {s}: {ids}" for s, ids in sorted(self.paused.items())) or "none"
        return (f"{PREEMPTION_METRIC}={metric}; per-request counts {reqs}; preempted ids per"
                f" step: {steps}; tokens run again per request (executor): {rerun};"
                f" paused ids per step: {paused}")


def recomputed_tokens(trace: Trace) -> dict[str, int] | None:
    """Per finished request: tokens the executor ran minus prompt + output - 1, less the
    prompt tokens the prefix cache served (None when no step recorded executed tokens)."""
    if not any(s.executed for s in trace.steps):
        return None
    ran: dict[str, int] = {}
    for s in trace.steps:
        for rid, n in s.executed.items():
            ran[rid] = ran.get(rid, 0) + n
    return {rid: ran.get(rid, 0)
            - (len(r.prompt_token_ids) - r.num_cached_tokens + len(r.steps) - 1)
            for rid, r in trace.requests.items()}


def count_preemptions(trace: Trace) -> PreemptionCount:
    """The four preemption signals of a step-driven trace."""
    metric = trace.metrics.get(PREEMPTION_METRIC)
    # an aborted request's preemptions count too; its tokens run again do not (``recomputed``
    # needs the whole output: one aborted before or during its prompt ran fewer than that)
    per_request = {rid: r.num_preemptions for rid, r in trace.ran().items()}
    per_step = {s.step: list(s.preempted) for s in trace.steps if s.preempted}
    paused = {s.step: list(s.paused) for s in trace.steps if s.paused}
    return PreemptionCount(metric=metric, per_request=per_request, per_step=per_step,
                           recomputed=recomputed_tokens(trace), paused=paused)


def _unrecorded(count: PreemptionCount) -> Verdict:
    return Verdict.failed(
        PREEMPTION_UNRECORDED,
        f"preemption signal missing: {'; '.join(count.missing())}; a missing signal proves"
        f" nothing, so it is not read as zero ({count.describe()})",
    )


def largest_batch(steps: list[StepRecord]) -> tuple[int, int | None]:
    """(most requests running at once, the first step where that was seen)."""
    best, at = 0, None
    for s in steps:
        if len(s.running) > best:
            best, at = len(s.running), s.step
    return best, at


def check_full_batch(trace: Trace, max_num_seqs: int) -> Verdict:
    """The batch reached ``max_num_seqs`` running requests at some step."""
    best, at = largest_batch(trace.steps)
    if best >= max_num_seqs:
        return Verdict.passed(FULL_BATCH, f"{best} requests ran at once from step {at}")
    where = f" (first at step {at})" if at is not None else ""
    waiting = max((len(s.waiting) for s in trace.steps), default=0)
    why = (
        f"full batch never reached: max_num_seqs={max_num_seqs} but the largest batch seen"
        f" was {best} running requests{where}, with up to {waiting} waiting; the run proves"
        " nothing about a full batch (is the KV cache one block short?)"
    )
    details = why if at is None else why + "\n" + format_step_table(trace.steps, at)
    return Verdict.failed(FULL_BATCH, why, at=at, details=details)


def check_no_preemption(trace: Trace) -> Verdict:
    """No signal saw a preemption; else every signal's count and the first preempting step.
    A missing signal fails as ``no_preemption.unrecorded``."""
    count = count_preemptions(trace)
    if count.missing():
        return _unrecorded(count)
    if not count.any():
        return Verdict.passed(NO_PREEMPTION, "no signal saw a preemption")
    if count.only_paused():
        why = (f"pause: requests were paused (taken out of the batch, blocks kept) although the"
               f" pool was sized for the batch: {count.describe()}")
    else:
        why = f"recompute: requests were preempted and recomputed: {count.describe()}"
    firsts = [min(d) for d in (count.per_step, count.paused) if d]
    at = min(firsts) if firsts else None
    details = why if at is None else why + "\n" + format_step_table(trace.steps, at)
    return Verdict.failed(NO_PREEMPTION, why, at=at, details=details)


def check_no_recompute(trace: Trace) -> Verdict:
    """No request was preempted and recomputed; pauses (blocks kept, the batch left) are the
    scheduler's answer to a binding batch TKV limit, not a recompute, and pass here (their
    timing is the TKV checks')."""
    count = count_preemptions(trace)
    if count.missing():
        return _unrecorded(count)
    if not replace(count, paused={}).any():
        paused = f" ({len(count.paused)} steps paused requests)" if count.paused else ""
        return Verdict.passed(NO_PREEMPTION, f"no signal saw a preemption{paused}")
    why = f"recompute: requests were preempted and recomputed: {count.describe()}"
    at = min(count.per_step) if count.per_step else None
    details = why if at is None else why + "\n" + format_step_table(trace.steps, at)
    return Verdict.failed(NO_PREEMPTION, why, at=at, details=details)


def check_preemption_seen(trace: Trace) -> Verdict:
    """Every signal saw a preemption (negative controls: the detectors are not blind)."""
    count = count_preemptions(trace)
    if count.missing():
        return _unrecorded(count)
    if count.all_signals_agree_preempted():
        return Verdict.passed(PREEMPTION_SEEN, count.describe())
    return Verdict.failed(PREEMPTION_SEEN, f"a signal missed the preemption: {count.describe()}")


def check_pausing_seen(trace: Trace) -> Verdict:
    """The scheduler paused a request and the trace shows it (the pausing negative control:
    the pause signal is not blind)."""
    count = count_preemptions(trace)
    if count.paused:
        return Verdict.passed(PREEMPTION_SEEN, f"pausing seen: {count.describe()}")
    return Verdict.failed(PREEMPTION_SEEN, f"no request was paused: {count.describe()}")
