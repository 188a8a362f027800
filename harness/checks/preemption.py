"""No recompute at full batch: pure checks over a step-driven Trace.

Two things are asserted, separately, because each alone can lie:
- the precondition: the batch really reached ``max_num_seqs`` running requests
  at once (a run that never fills the batch proves nothing about a full batch);
- zero preemptions, by three independent signals: the engine's
  ``vllm:num_preemptions`` counter, each request's preemption count, and the
  ids the scheduler listed as preempted at each step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.checks.verdict import FULL_BATCH, NO_PREEMPTION, PREEMPTION_SEEN, Verdict
from harness.render.ledger_table import format_step_table
from harness.trace import StepRecord, Trace

PREEMPTION_METRIC = "vllm:num_preemptions"


@dataclass
class PreemptionCount:
    """What each signal says about preemption in one run."""

    metric: float | None
    per_request: dict[str, int] = field(default_factory=dict)
    per_step: dict[int, list[str]] = field(default_factory=dict)

    @property
    def total_by_request(self) -> int:
        return sum(self.per_request.values())

    @property
    def total_by_step(self) -> int:
        return sum(len(v) for v in self.per_step.values())

    def any(self) -> bool:
        return bool((self.metric or 0) > 0 or self.total_by_request or self.total_by_step)

    def all_signals_agree_preempted(self) -> bool:
        """Every signal (the counter, where present) saw at least one preemption."""
        metric_ok = self.metric is None or self.metric > 0
        return metric_ok and self.total_by_request > 0 and self.total_by_step > 0

    def describe(self) -> str:
        steps = ", ".join(f"step {s}: {ids}" for s, ids in sorted(self.per_step.items())) or "none"
        reqs = {k: v for k, v in self.per_request.items() if v} or "none"
        metric = "not reported" if self.metric is None else f"{self.metric:g}"
        return f"{PREEMPTION_METRIC}={metric}; per-request counts {reqs}; preempted ids per step: {steps}"


def count_preemptions(trace: Trace) -> PreemptionCount:
    """The three preemption signals of a step-driven trace."""
    metric = trace.metrics.get(PREEMPTION_METRIC)
    per_request = {rid: r.num_preemptions for rid, r in trace.requests.items()}
    per_step = {s.step: list(s.preempted) for s in trace.steps if s.preempted}
    return PreemptionCount(metric=metric, per_request=per_request, per_step=per_step)


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
    """No signal saw a preemption; else every signal's count and the first preempting step."""
    count = count_preemptions(trace)
    if not count.any():
        return Verdict.passed(NO_PREEMPTION, "no signal saw a preemption")
    why = f"recompute: requests were preempted and recomputed: {count.describe()}"
    at = min(count.per_step) if count.per_step else None
    details = why if at is None else why + "\n" + format_step_table(trace.steps, at)
    return Verdict.failed(NO_PREEMPTION, why, at=at, details=details)


def check_preemption_seen(trace: Trace) -> Verdict:
    """Every signal saw a preemption (negative controls: the detectors are not blind)."""
    count = count_preemptions(trace)
    if count.all_signals_agree_preempted():
        return Verdict.passed(PREEMPTION_SEEN, count.describe())
    return Verdict.failed(PREEMPTION_SEEN, f"a signal missed the preemption: {count.describe()}")
