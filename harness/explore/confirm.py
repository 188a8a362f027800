"""A finding is confirmed before it is reported: its shrunk example runs again on fresh engines.

A failure the search found and shrank may need what an earlier example left in its engine, or
be rare: a report upstream built on it costs an engineer a morning. So the shrunk example is
replayed ``replays`` times (``--confirm``; by default as often as triage repeats a failure,
``harness.triage.plan.REPEATS``), each on an engine started for that replay alone, as its
regression test runs it. A replay confirms the finding only when the same check fails with the
same cause (``cause``: the verdict's first line with what moves from run to run made alike).
Confirmed in every replay, the finding is a defect; otherwise it is **flaky**, reported with
each replay's verdict line, and not as a defect.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.core.verdict import Verdict
from harness.explore.example import Example, Identity
from harness.triage.plan import REPEATS

if TYPE_CHECKING:
    from harness.explore.runner import ExampleRunner, Outcome

CONFIRM_REPLAYS = REPEATS  # replays of a finding on fresh engines (--confirm): as triage's repeats

CONFIRMED, FLAKY, UNCONFIRMED = "confirmed", "flaky", "not confirmed"
SAME, OTHER_CAUSE, OTHER_CHECK, PASSED, REFUSED = (
    "failed the same way", "failed with another cause", "failed another check", "passed",
    "refused")

# What moves between runs of one failure, made alike in ``cause`` (in this order): paths (a
# log, a temporary folder), hexadecimal ids and addresses, numbers (steps, counts, request
# numbers, block ids, pids, seconds), then a list of numbers of any length.
_PATH = re.compile(r"(?:/[\w.+@-]+){2,}/?")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_NUMBERS = re.compile(r"#(?:\s*,\s*#)+")
_SPACE = re.compile(r"\s+")


def cause(verdict: Verdict) -> str:
    """What makes two failures of one check the same failure: the verdict's first line with
    its paths, hex ids, numbers and lists of numbers made alike (``request r4 ... step 11``
    and ``request r2 ... step 9`` are one cause; ``conservation`` and ``freed_on_finish``,
    ``EngineTimeout`` and ``EngineCrashed`` are not)."""
    line = verdict.why.strip().splitlines()[0] if verdict.why.strip() else ""
    line = _HEX.sub("#", _PATH.sub("PATH", line))
    line = _NUMBERS.sub("#", _NUMBER.sub("#", line))
    return _SPACE.sub(" ", line).strip()


@dataclass(frozen=True)
class Replay:
    """One replay of a finding's example on a fresh engine: how it ended (``SAME`` ... ``REFUSED``)
    and its verdict line."""

    outcome: str
    line: str
    seconds: float = 0.0

    @property
    def reproduced(self) -> bool:
        return self.outcome == SAME


@dataclass(frozen=True)
class Confirmation:
    """The replays of a finding: ``asked`` of them (0: none asked, ``--confirm 0``)."""

    asked: int
    replays: tuple[Replay, ...] = ()

    @property
    def reproduced(self) -> int:
        return sum(r.reproduced for r in self.replays)

    @property
    def status(self) -> str:
        """CONFIRMED (every replay failed the same way), FLAKY, or UNCONFIRMED (none asked)."""
        if not self.asked:
            return UNCONFIRMED
        return CONFIRMED if self.reproduced == self.asked == len(self.replays) else FLAKY

    def summary(self) -> str:
        """One sentence: what the replays say of the finding."""
        if self.status == UNCONFIRMED:
            return ("not confirmed: no replay was asked (--confirm 0); the failure was seen in"
                    " the search and its shrinking only")
        counted = (f"failed the same way (the same check, the same cause) in {self.reproduced}"
                   f" of {self.asked} replays on fresh engines")
        if self.status == CONFIRMED:
            return f"confirmed: {counted}"
        return f"flaky: {counted}; not reported as a defect until it reproduces"

    def lines(self) -> list[str]:
        """Each replay's verdict line: ``replay 2: passed: ...``."""
        return [f"replay {i}: {r.outcome}: {r.line}" for i, r in enumerate(self.replays, 1)]


@dataclass
class Finding:
    """A failed example, shrunk: the check that failed first, the example, its outcome, how
    long finding and shrinking took, and what its replays on fresh engines said."""

    check: str
    example: Example
    outcome: Outcome
    identity: Identity
    found_after: float  # seconds from the search's start to the first failing example
    examples_before: int  # examples run before it (it included)
    shrink_seconds: float
    shrink_runs: int
    original: Example  # the first failing example, before shrinking
    reproduced: bool = True  # hypothesis saw the shrunk example fail again
    confirmation: Confirmation | None = None  # None: not replayed (yet)

    @property
    def verdict(self) -> Verdict:
        failure = self.outcome.failure
        assert failure is not None
        return failure

    @property
    def key(self) -> str:
        return self.example.key

    @property
    def flaky(self) -> bool:
        """Whether its replays did not all fail the same way: reported, not as a defect."""
        return self.confirmation is not None and self.confirmation.status == FLAKY

    @property
    def held(self) -> list[Verdict]:
        """The verdicts of its example that passed: the checks that held on it."""
        return [v for v in self.outcome.verdicts if v.ok]


def verdict_line(v: Verdict) -> str:
    return f"[check {v.check}] {v.why}"


def judge_replay(finding: Finding, outcome: Outcome, seconds: float) -> Replay:
    """What one replay's ``outcome`` says of ``finding``: the same check failed with the same
    cause, or not (another cause, another check, passed, refused)."""
    from harness.explore.runner import REJECTED

    if outcome.status == REJECTED:
        return Replay(REFUSED, outcome.reason, seconds)
    same = [v for v in outcome.failures if v.check == finding.check]
    hit = next((v for v in same if cause(v) == cause(finding.verdict)), None)
    if hit is not None:
        return Replay(SAME, verdict_line(hit), seconds)
    if same:
        return Replay(OTHER_CAUSE, verdict_line(same[0]), seconds)
    if outcome.failure is not None:
        return Replay(OTHER_CHECK, verdict_line(outcome.failure), seconds)
    known = f"; known failures met: {', '.join(k.reason for k in outcome.known)}" \
        if outcome.known else ""
    return Replay(PASSED, f"{len(outcome.verdicts)} check(s) held{known}", seconds)


def confirm(finding: Finding, runner: ExampleRunner, replays: int = CONFIRM_REPLAYS,
            log: Callable[[str], None] = print,
            clock: Callable[[], float] = time.monotonic) -> Finding:
    """Replay ``finding``'s example ``replays`` times, each on a fresh engine, and record what
    each said (``finding.confirmation``); every replay runs, so a flaky finding says how often
    it failed. Returns ``finding``."""
    made: list[Replay] = []
    for n in range(1, replays + 1):
        t0 = clock()
        outcome = runner.run(finding.example, fresh=True)
        replay = judge_replay(finding, outcome, round(clock() - t0, 1))
        made.append(replay)
        log(f"hil explore: replay {n} of {replays} on a fresh engine: {replay.outcome}:"
            f" {replay.line}")
    finding.confirmation = Confirmation(replays, tuple(made))
    if replays:
        log(f"hil explore: finding {finding.key}: {finding.confirmation.summary()}")
    return finding
