"""How much triage one pytest process may do: the first ``max_tests`` failed tests, and no
triage run started once ``seconds`` of triage have been spent."""

from __future__ import annotations

from dataclasses import dataclass

TRIAGE_MAX = 3  # failed tests triaged per pytest process (--triage-max)
TRIAGE_BUDGET = 600.0  # seconds of triage per pytest process (--triage-budget)
RAN_OUT = "the triage budget ran out (--triage-budget)"  # why a run was not made


@dataclass
class TriageBudget:
    max_tests: int = TRIAGE_MAX
    seconds: float = TRIAGE_BUDGET
    enabled: bool = True
    tests: int = 0  # tests triaged so far
    spent: float = 0.0  # seconds spent so far

    def refusal(self) -> str | None:
        """Why the next failed test is not triaged, or None when it is."""
        if not self.enabled:
            return "triage is off (--no-triage)"
        if self.tests >= self.max_tests:
            return (f"not triaged: the first {self.max_tests} failed test(s) of this process were"
                    " (--triage-max)")
        if self.spent >= self.seconds:
            return f"not triaged: the triage budget of {self.seconds:g} s is spent (--triage-budget)"
        return None

    def left(self) -> float:
        return max(0.0, self.seconds - self.spent)
