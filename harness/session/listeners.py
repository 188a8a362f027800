"""SessionListener: what the session tells observers (the report) about a test's run.

Listeners see what the session ran and saw; they never change a run, and a
listener that raises is logged and ignored, so a report problem cannot fail a test.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.trace import KvSnapshot, Trace
from harness.core.verdict import Verdict

if TYPE_CHECKING:
    from harness.checks.forcing import ForcedComparison
    from harness.core.comparison import TraceComparison
    from harness.core.config import EngineConfig
    from harness.core.triage import TriageResult
    from harness.scenario.prompts import Scenario
    from harness.session.precision import Rules

log = logging.getLogger("harness")


class SessionListener:
    """Override the events you need; every method is a no-op here."""

    def on_scenario(self, config: EngineConfig, scenario: Scenario) -> None:
        """A scenario is about to be sent to the engine of ``config``."""

    def on_engine(self, config: EngineConfig, log_path: Path, log_offset: int) -> None:
        """A call to an engine begins; its log grows from ``log_offset``."""

    def on_trace(self, config: EngineConfig, scenario: Scenario, trace: Trace) -> None:
        """The engine answered the scenario with ``trace``."""

    def on_kv_snapshot(self, config: EngineConfig, snapshots: list[KvSnapshot]) -> None:
        """The engine's KV ledgers were read outside a run."""

    def on_comparison(
        self,
        scenario: Scenario,
        reference: Trace,
        trace: Trace,
        comparison: TraceComparison,
        decode: Callable[[list[int]], str] | None,
    ) -> None:
        """``trace`` was compared token by token with ``reference``."""

    def on_forced(self, scenario: Scenario, reference: Trace, trace: Trace,
                  forced: ForcedComparison) -> None:
        """``trace``'s teacher-forced run was judged against ``reference``."""

    def on_verdict(self, verdict: Verdict, trace: Trace | None) -> None:
        """A check ran (on ``trace`` where it had one); recorded whether it held or not."""

    def on_triage(self, result: TriageResult) -> None:
        """A failed verdict of the running test was triaged (harness.triage)."""

    def on_rules(self, trace: Trace, rules: Rules) -> None:
        """``trace`` is judged by ``rules`` (its precision's policies, and the calibration
        they came from where it computes in fp16 or bf16)."""


class Listeners(SessionListener):
    """The session's listeners: each event goes to every one, in the order they were added."""

    def __init__(self) -> None:
        self._listeners: list[SessionListener] = []

    def add(self, listener: SessionListener) -> None:
        self._listeners.append(listener)

    def remove(self, listener: SessionListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def __bool__(self) -> bool:
        return bool(self._listeners)

    def _each(self, call: Callable[[SessionListener], None], event: str) -> None:
        for listener in list(self._listeners):
            try:
                call(listener)
            except Exception:  # a report problem must never fail or alter a test
                log.exception("session listener failed on %s", event)

    def on_scenario(self, config: EngineConfig, scenario: Scenario) -> None:
        self._each(lambda x: x.on_scenario(config, scenario), "scenario")

    def on_engine(self, config: EngineConfig, log_path: Path, log_offset: int) -> None:
        self._each(lambda x: x.on_engine(config, log_path, log_offset), "engine")

    def on_trace(self, config: EngineConfig, scenario: Scenario, trace: Trace) -> None:
        self._each(lambda x: x.on_trace(config, scenario, trace), "trace")

    def on_kv_snapshot(self, config: EngineConfig, snapshots: list[KvSnapshot]) -> None:
        self._each(lambda x: x.on_kv_snapshot(config, snapshots), "kv_snapshot")

    def on_comparison(
        self,
        scenario: Scenario,
        reference: Trace,
        trace: Trace,
        comparison: TraceComparison,
        decode: Callable[[list[int]], str] | None,
    ) -> None:
        self._each(
            lambda x: x.on_comparison(scenario, reference, trace, comparison, decode), "comparison"
        )

    def on_forced(self, scenario: Scenario, reference: Trace, trace: Trace,
                  forced: ForcedComparison) -> None:
        self._each(lambda x: x.on_forced(scenario, reference, trace, forced), "forced")

    def on_verdict(self, verdict: Verdict, trace: Trace | None) -> None:
        self._each(lambda x: x.on_verdict(verdict, trace), "verdict")

    def on_triage(self, result: TriageResult) -> None:
        self._each(lambda x: x.on_triage(result), "triage")

    def on_rules(self, trace: Trace, rules: Rules) -> None:
        self._each(lambda x: x.on_rules(trace, rules), "rules")
