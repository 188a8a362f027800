"""The result of a triage (``harness.triage``): its runs, one condition each, and the verdict
they support.

Plain values with a JSON form: the session writes them into its statistics file, the Allure
listener attaches them to the failed test, the run summary (terminal and summary.md) lists them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# TriageRun.outcome
PASSED = "passed"
FAILED = "failed"
ERROR = "error"  # the run could not be made (the engine refused the condition, crashed...)
NOT_RUN = "not run"  # not applicable here, or the time budget ran out

# TriageResult.key: one word per verdict, the value of the report's ``triage`` label.
BATCHING = "batching"
RECYCLED = "recycled-blocks"
CHUNKED = "chunked-prefill"
PREFIX = "prefix-caching"
FLAKY = "flaky"
STACK = "stack-regression"
DETERMINISTIC = "deterministic"
NOT_REPRODUCED = "not-reproduced"
INCONCLUSIVE = "inconclusive"
KEYS = (BATCHING, RECYCLED, CHUNKED, PREFIX, FLAKY, STACK, DETERMINISTIC, NOT_REPRODUCED,
        INCONCLUSIVE)


@dataclass(frozen=True)
class TriageRun:
    """One re-run: which factor it varies, which side of it (``arm``), on which engine, and
    whether the triaged check held there."""

    factor: str  # "repeat", "batching", "recycled", "chunked", "prefix", "stack"
    arm: str  # e.g. "as run #2", "alone (req-1)", "recycled blocks", "chunk 256 tokens"
    engine: str  # the engine's label (STACK:variant)
    requests: tuple[str, ...]
    outcome: str  # PASSED, FAILED, ERROR, NOT_RUN
    why: str = ""  # the check's one line, the error, or why the run was not made
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["requests"] = list(self.requests)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TriageRun:
        return cls(factor=str(d["factor"]), arm=str(d["arm"]), engine=str(d["engine"]),
                   requests=tuple(str(r) for r in d.get("requests", ())),
                   outcome=str(d["outcome"]), why=str(d.get("why", "")),
                   seconds=float(d.get("seconds", 0.0)))


@dataclass(frozen=True)
class TriageResult:
    """The triage of one failed test: the check it re-ran, the verdict, the runs behind it."""

    nodeid: str
    check: str  # the failed verdict's check (``token_equality``, ``kv_ledger.conservation``)
    key: str  # one of KEYS
    verdict: str  # "depends on batching: fails only when decoded with another request"
    runs: tuple[TriageRun, ...] = field(default_factory=tuple)
    seconds: float = 0.0  # what this triage cost the run that reports it (a reused one: ~0)
    note: str = ""  # e.g. what the budget left out
    # Reused: when the recorded triage was made ("2026-12-07 03:12:45 UTC"), its runs and
    # verdict taken from the record (harness.triage.record); "" for a triage made in this run.
    reused_from: str = ""

    @property
    def reused(self) -> bool:
        """Whether this is a recorded triage reused, not one made in this run."""
        return bool(self.reused_from)

    @property
    def runs_made(self) -> int:
        """The runs that judged the check (passed or failed): errors and runs not made are
        rows of the table, not runs."""
        return sum(1 for r in self.runs if r.outcome in (PASSED, FAILED))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["runs"] = [r.to_dict() for r in self.runs]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TriageResult:
        return cls(nodeid=str(d["nodeid"]), check=str(d["check"]), key=str(d["key"]),
                   verdict=str(d["verdict"]),
                   runs=tuple(TriageRun.from_dict(r) for r in d.get("runs", ())),
                   seconds=float(d.get("seconds", 0.0)), note=str(d.get("note", "")),
                   reused_from=str(d.get("reused_from", "")))

    def cost(self) -> str:
        """What the triage cost, in words: ``9 runs, 26.1 s``; a reused one says when it was
        made (``9 runs, reused: triaged 2026-12-07 03:12:45 UTC, 0.0 s now``)."""
        if self.reused:
            return (f"{self.runs_made} runs, reused: triaged {self.reused_from},"
                    f" {self.seconds:.1f} s now")
        return f"{self.runs_made} runs, {self.seconds:.1f} s"

    def table(self) -> str:
        """The runs as a Markdown table (the Allure attachment, ``hil triage``)."""
        lines = [f"triage of {self.check}: {self.verdict}", "",
                 "| factor | arm | engine | requests | outcome | s | why |",
                 "|---|---|---|---|---|---|---|"]
        for r in self.runs:
            why = r.why.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {r.factor} | {r.arm} | {r.engine} | {', '.join(r.requests)} |"
                         f" {r.outcome} | {r.seconds:.1f} | {why} |")
        if self.note:
            lines += ["", self.note]
        lines += ["", self.cost()]
        return "\n".join(lines)
