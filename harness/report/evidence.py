"""Evidence of one test: what the session ran and saw, collected from its listener events.

``CallEvidence`` is a ``SessionListener`` added to the session for the duration of
one test's call phase; the report plugin turns it into steps and attachments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.trace import KvSnapshot, Trace
from harness.core.triage import TriageResult
from harness.core.verdict import KV_LEDGER, Verdict
from harness.session.listeners import SessionListener


@dataclass
class ScenarioRun:
    """One scenario sent to one engine configuration, and what came of it."""

    config: Any
    scenario: Any
    trace: Trace | None = None  # once the engine answered
    reference: Trace | None = None
    comparison: Any = None  # harness.checks.tokens.TraceComparison
    decode: Callable[[list[int]], str] | None = None  # the model's, for the token diff page
    forced: Any = None  # harness.checks.forcing.ForcedComparison, when judged
    verdicts: list[Verdict] = field(default_factory=list)
    # harness.session.precision.Rules the trace was judged by (its precision's policies and the
    # calibration they came from), once the session looked them up.
    rules: Any = None

    @property
    def ledger(self) -> Verdict | None:
        """The KV ledger verdict of this run, once checked."""
        return next((v for v in self.verdicts if v.family == KV_LEDGER), None)


class CallEvidence(SessionListener):
    """Everything the session reported during one test."""

    def __init__(self) -> None:
        self.runs: list[ScenarioRun] = []
        self.snapshots: list[tuple[Any, list[KvSnapshot]]] = []
        # Engine log file -> byte offset when this test first called that engine.
        self.logs: dict[Path, int] = {}
        self.configs: list[Any] = []
        self.verdicts: list[Verdict] = []
        # Failed verdicts of this test re-run under varied conditions (harness.triage).
        self.triage: list[TriageResult] = []

    def on_scenario(self, config: Any, scenario: Any) -> None:
        self.runs.append(ScenarioRun(config=config, scenario=scenario))
        self._config(config)

    def on_engine(self, config: Any, log_path: Path, log_offset: int) -> None:
        self.logs.setdefault(Path(log_path), int(log_offset))
        self._config(config)

    def on_trace(self, config: Any, scenario: Any, trace: Trace) -> None:
        run = self._run_of_scenario(scenario, config)
        run.trace = trace

    def on_kv_snapshot(self, config: Any, snapshots: list[KvSnapshot]) -> None:
        self.snapshots.append((config, snapshots))
        self._config(config)

    def on_comparison(
        self, scenario: Any, reference: Trace, trace: Trace, comparison: Any,
        decode: Callable[[list[int]], str] | None,
    ) -> None:
        run = self._run_of_trace(trace) or self._run_of_scenario(scenario, None)
        run.reference, run.comparison, run.decode = reference, comparison, decode
        if run.trace is None:
            run.trace = trace

    def on_forced(self, scenario: Any, reference: Trace, trace: Trace, forced: Any) -> None:
        run = self._run_of_trace(trace) or self._run_of_scenario(scenario, None)
        run.forced = forced
        if run.reference is None:
            run.reference = reference

    def on_verdict(self, verdict: Verdict, trace: Trace | None) -> None:
        self.verdicts.append(verdict)
        if trace is None:
            return
        run = self._run_of_trace(trace)
        if run is None:
            run = ScenarioRun(config=None, scenario=None, trace=trace)
            self.runs.append(run)
        run.verdicts.append(verdict)

    def on_triage(self, result: TriageResult) -> None:
        self.triage.append(result)

    def on_rules(self, trace: Trace, rules: Any) -> None:
        run = self._run_of_trace(trace)
        if run is None:
            run = ScenarioRun(config=None, scenario=None, trace=trace)
            self.runs.append(run)
        run.rules = rules

    @property
    def failed_verdict(self) -> Verdict | None:
        """The first verdict that failed in this test."""
        return next((v for v in self.verdicts if not v.ok), None)

    # -- lookups ------------------------------------------------------------
    def _config(self, config: Any) -> None:
        if config is not None and all(c is not config for c in self.configs):
            self.configs.append(config)

    def _run_of_trace(self, trace: Any) -> ScenarioRun | None:
        return next((r for r in reversed(self.runs) if r.trace is trace), None)

    def _run_of_scenario(self, scenario: Any, config: Any) -> ScenarioRun:
        for r in reversed(self.runs):
            if r.scenario is scenario and r.trace is None:
                return r
        run = ScenarioRun(config=config, scenario=scenario)
        self.runs.append(run)
        return run

    @property
    def empty(self) -> bool:
        return not (self.runs or self.snapshots or self.logs or self.verdicts or self.triage)

    def first_scenario(self) -> tuple[Any, Any]:
        """(scenario, config) of the first run that has a scenario, else (None, None)."""
        for r in self.runs:
            if r.scenario is not None:
                return r.scenario, r.config
        return None, None

    def first_trace_info(self) -> dict[str, Any]:
        for r in self.runs:
            if r.trace is not None:
                return dict(r.trace.info or {})
        return {}


@dataclass
class StepInfo:
    """A report step: title, parameters, and a failure message when it failed."""

    title: str
    params: dict[str, str] = field(default_factory=dict)
    failure: str | None = None
    broken: bool = False
    children: list[StepInfo] = field(default_factory=list)


def run_steps_of(run: ScenarioRun) -> StepInfo:
    """A step for the scenario run with one child step per request: its shape, what the
    device produced and, when compared, the verdict."""
    scenario, config, trace = run.scenario, run.config, run.trace
    label = getattr(config, "label", None) or getattr(trace, "target", "?")
    name = getattr(scenario, "name", "?")
    requests = list(getattr(scenario, "requests", []) or [])
    diffs = {d.request_id: d for d in getattr(run.comparison, "diffs", [])}
    ledger = run.ledger
    head = StepInfo(title=f"run {name} on {label}: {len(requests)} requests")
    if trace is not None:
        steps = len(trace.steps)
        if steps:
            head.title += f", {steps} engine steps"
    else:
        head.title += " (no answer from the engine)"
        head.broken = True
    if ledger is not None:
        head.params["kv ledger"] = "all invariants held" if ledger.ok else ledger.why
    for r in requests:
        out = trace.requests.get(r.request_id) if trace is not None else None
        params = {
            "prompt tokens": str(len(r.prompt_token_ids)),
            "max_tokens": str(r.max_tokens),
            "arrival step": str(r.arrival_step),
        }
        title = (f"request {r.request_id}: {len(r.prompt_token_ids)} prompt tokens,"
                 f" max_tokens {r.max_tokens}, arrives at step {r.arrival_step}")
        step = StepInfo(title=title, params=params)
        if out is None:
            step.title += " -> no output"
            step.broken = trace is None
            if trace is not None:
                step.failure = f"request {r.request_id} missing from the {label} output"
        else:
            params["generated"] = str(len(out.steps))
            params["finish"] = str(out.finish_reason)
            params["preemptions"] = str(out.num_preemptions)
            step.title += f" -> {len(out.steps)} tokens ({out.finish_reason})"
            if out.num_preemptions:
                step.title += f", preempted {out.num_preemptions}x"
        d = diffs.get(r.request_id)
        if d is not None:
            params["verdict"] = d.outcome.value
            where = "" if d.position is None else f" at position {d.position}"
            step.title += f": {d.outcome.value}{where}"
            if not d.ok:
                step.failure = f"token mismatch: request {r.request_id!r}{where}: {d.detail}"
        head.children.append(step)
    failures = [c.failure for c in head.children if c.failure]
    failures[:0] = [v.why for v in run.verdicts if not v.ok and v.check != "token_equality"]
    head.failure = "; ".join(failures) or None
    return head
