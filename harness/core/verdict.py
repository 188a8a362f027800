"""Verdict: what every check returns, and the one way a suite asserts it.

A check is a pure function of records that returns a ``Verdict``: which check
(a dotted name such as ``kv_ledger.conservation``; the report files failures by
it), whether it held, why not in one line, where it first broke (an engine step
or a token position), and the full text a reader of the red test needs.
"""

from __future__ import annotations

from dataclasses import dataclass

# The check names the harness emits; the report maps each family to a category.
TOKEN_EQUALITY = "token_equality"
KV_LEDGER = "kv_ledger"  # "kv_ledger.<invariant>" when one broke
KV_LEDGER_UNRECORDED = "kv_ledger.unrecorded"  # no snapshot to check: a harness problem
DUMMY_PADDING = "dummy_padding"
FULL_BATCH = "full_batch"
NO_PREEMPTION = "no_preemption"
PREEMPTION_SEEN = "preemption_seen"
PREEMPTION_UNRECORDED = "no_preemption.unrecorded"  # a preemption signal missing: harness problem
CAPACITY = "capacity"
# A test ran on an engine an earlier test left dirty and that could not be replaced.
INHERITED_STATE = "inherited_state"
# The device's logprob of each compared token against the reference's (harness.checks.logprobs).
LOGPROB_CLOSENESS = "logprob_closeness"
# Teacher-forced runs (harness.checks.forcing): every position given the reference's history.
FORCED_TOKENS = "token_equality.forced"
FORCED_LOGPROBS = "logprob_closeness.forced"
# Greedy free run: each chosen token is the device's own top-1 (harness.checks.self_consistency).
SELF_CONSISTENCY = "greedy_self_consistency"
SELF_CONSISTENCY_UNRECORDED = "greedy_self_consistency.unrecorded"  # no top-k logprobs to check


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check.

    ``at`` is the first failing engine step (ledger and batch checks) or output
    position (token equality); None when it passed or has no place. ``details``
    is the full rendered text (its first line is ``why``).
    """

    check: str
    ok: bool
    why: str = ""
    at: int | None = None
    details: str = ""

    @classmethod
    def passed(cls, check: str, why: str = "") -> Verdict:
        return cls(check=check, ok=True, why=why)

    @classmethod
    def failed(cls, check: str, why: str, at: int | None = None, details: str = "") -> Verdict:
        return cls(check=check, ok=False, why=why, at=at, details=details or why)

    @property
    def family(self) -> str:
        """The check's family: ``kv_ledger`` for ``kv_ledger.conservation``."""
        return self.check.split(".", 1)[0]

    def message(self) -> str:
        """The failure text shown in the test report: tagged with the check name."""
        return f"[check {self.check}] {self.details or self.why}"

    def __bool__(self) -> bool:
        return self.ok


class VerdictFailed(AssertionError):
    """A suite's expectation failed; carries the verdict so the report can file it."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        super().__init__(verdict.message())


def first_failure(verdicts: list[Verdict]) -> Verdict | None:
    return next((v for v in verdicts if not v.ok), None)


@dataclass(frozen=True)
class Violation:
    """One broken invariant: a stable snake_case name and a sentence saying what was seen."""

    invariant: str
    message: str
    step: int | None = None
    source: str | None = None

    def __str__(self) -> str:
        where = "" if self.step is None else f"step {self.step}: "
        src = "" if self.source is None else f" [{self.source}]"
        return f"{where}{self.invariant}{src}: {self.message}"
