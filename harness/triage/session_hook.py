"""The session's side of triage: what each test ran (to re-run it), the facts a triage plan
needs about the engine, and the failure text with the triage verdict added.

``TriageDesk`` remembers, per test, every trace the session produced with the engine,
scenario and teacher behind it, and the references computed; when ``HilSession.expect`` raises
on a triaged check (``harness.triage.judge.triaged``) of such a trace, the desk hands the
failed run to the ``TriageRunner``, keeps the result, and returns the verdict the test raises.

A known failure (a test the quarantine marks known on this stack) costs the session's budget
nothing: its triage is recorded once (``harness.triage.record``) and reused while nothing it
depends on has changed; without a valid record it is triaged on a budget of its own and
recorded then. Either way ``--triage-max`` and ``--triage-budget`` are left for the failures
nobody knows yet.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from harness.core.config import EngineConfig
from harness.core.trace import Trace
from harness.core.triage import TriageResult
from harness.core.verdict import Verdict
from harness.engine.pool import prefix_caching_on
from harness.lab.quarantine import KnownFailure, quarantined_by
from harness.scenario.prompts import Scenario
from harness.stacks import host as host_stack
from harness.stacks.spec import load_stack, variant_problem
from harness.targets import kind
from harness.targets.variants import VARIANTS
from harness.triage.budget import TriageBudget
from harness.triage.judge import triaged
from harness.triage.plan import Facts, FailedRun
from harness.triage.record import TriageRecords
from harness.triage.runner import TriageRunner


@dataclass
class _Ran:
    cfg: EngineConfig
    scenario: Scenario
    op: str
    teacher: Trace | None


def previous_stack(cfg: EngineConfig) -> tuple[str | None, str]:
    """The stack before ``cfg``'s (its stack file's ``previous``) when it can run the
    engine's variant here, else (None, why not)."""
    if cfg.stack == host_stack.HOST:
        return None, "the host stack names no previous stack"
    prev = load_stack(cfg.stack).previous
    if prev is None:
        return None, f"stack {cfg.stack} names no previous stack"
    problem = variant_problem(load_stack(prev), cfg.variant_id)
    return (None, problem) if problem else (prev, "")


def facts_of(cfg: EngineConfig) -> Facts:
    k = kind(cfg.target)
    variant = VARIANTS.get(cfg.variant_id)
    prev, missing = previous_stack(cfg)
    return Facts(
        prefix_on=prefix_caching_on(cfg),
        chunks_prefill=k.chunks_prefill or bool(variant and variant.chunked),
        sized_pool=k.full_batch_pool(cfg.max_model_len, cfg.max_num_seqs, cfg.stack),
        previous=prev, previous_missing=missing)


def named_request(verdict: Verdict, scenario: Scenario) -> str:
    """The first request of ``scenario`` the verdict's text names (else its first request)."""
    text = f"{verdict.why}\n{verdict.details}"
    hits = [(m.start(), r.request_id) for r in scenario.requests
            if (m := re.search(rf"(?<![\w-]){re.escape(r.request_id)}(?![\w-])", text))]
    return min(hits)[1] if hits else scenario.requests[0].request_id


@dataclass
class TriageDesk:
    runner: TriageRunner
    # Where the triages of known failures are recorded and reused (None: made every time).
    records: TriageRecords | None = None
    # The quarantine entry that marks a test known on this run's stack, or None.
    known_failure: Callable[[str], KnownFailure | None] = quarantined_by
    results: list[TriageResult] = field(default_factory=list)
    _runs: dict[int, tuple[Trace, _Ran]] = field(default_factory=dict)
    _refs: dict[str, Trace] = field(default_factory=dict)
    _test: str = ""

    def begin_test(self, nodeid: str = "") -> None:
        self._test = nodeid
        self._runs.clear()
        self._refs.clear()

    def ran(self, cfg: EngineConfig, scenario: Scenario, op: str, teacher: Trace | None,
            trace: Trace) -> None:
        self._runs[id(trace)] = (trace, _Ran(cfg, scenario, op, teacher))

    def referenced(self, scenario: Scenario, reference: Trace) -> None:
        self._refs[scenario.name] = reference

    def refused(self, verdict: Verdict, trace: Trace | None) -> str | None:
        """Why a failure that triage would re-run is left untriaged by ``--triage-max`` or
        ``--triage-budget`` (said in its text, so nobody waits for a triage that never ran);
        None when it is triaged, not a triaged check, or triage is off."""
        if trace is None or not triaged(verdict.check) or id(trace) not in self._runs:
            return None
        budget = self.runner.budget
        if not budget.enabled or self.known_failure(self._test) is not None:
            return None  # a known failure is never refused: it costs the budget nothing
        return budget.refusal()

    def failed(self, nodeid: str, verdict: Verdict, trace: Trace | None) -> TriageResult | None:
        """Triage ``verdict`` (failed on ``trace``) when it is a triaged check of a run this
        test made and the budget allows (a known failure's: whenever triage is on); the
        result, or None."""
        if trace is None or not triaged(verdict.check) or id(trace) not in self._runs:
            return None
        budget = self.runner.budget
        known = self.known_failure(nodeid) if budget.enabled else None
        if known is None and budget.refusal() is not None:
            return None
        _, ran = self._runs[id(trace)]
        run = FailedRun(ran.cfg, ran.scenario, ran.op, verdict.check,
                        named_request(verdict, ran.scenario), ran.teacher,
                        self._refs.get(ran.scenario.name, ran.teacher))
        facts = facts_of(ran.cfg)
        if known is None:
            result = self.runner.triage(nodeid, run, facts)
        else:
            result = self._known(nodeid, known, run, facts)
        self.results.append(result)
        return result

    def _known(self, nodeid: str, known: KnownFailure, run: FailedRun,
               facts: Facts) -> TriageResult:
        """The triage of a known failure: its record while it holds (shown as reused, with
        the seconds this lookup took), else a triage on a budget of its own, recorded; the
        session's budget is not touched either way."""
        t0 = time.monotonic()
        key = None
        why = ""
        if self.records is not None:
            key = self.records.key(nodeid, known, run, facts, self.runner.policies)
            found = self.records.find(key)
            if found.result is not None:
                return replace(found.result, seconds=round(time.monotonic() - t0, 2))
            why = found.why
        own = TriageBudget(max_tests=1, seconds=self.runner.budget.seconds)
        result = self.runner.triage(nodeid, run, facts, budget=own)
        if key is not None and self.records is not None:
            not_kept = self.records.keep(key, result)
            said = (f"not recorded ({not_kept}): triaged again next time" if not_kept else
                    "recorded for the next runs")
            note = f"known failure (quarantined): {said}" + (f"; {why}" if why else "")
            result = replace(result, note="\n".join(x for x in (result.note, note) if x))
        return result


def with_untriaged(verdict: Verdict, why: str) -> Verdict:
    """``verdict`` whose text ends with why it was not triaged."""
    return replace(verdict, details=f"{verdict.details or verdict.why}\n\ntriage: {why}")


def with_triage(verdict: Verdict, result: TriageResult) -> Verdict:
    """``verdict`` whose text ends with the triage's verdict and runs (its first line, which
    files it in the report, unchanged); a reused triage says so, with the date it was made."""
    runs = "\n".join(f"  {r.factor:9} {r.arm}: {r.outcome}" + (f" ({r.why})" if r.why else "")
                     for r in result.runs)
    reused = (f"\n  (reused: triaged {result.reused_from}; nothing it depends on has changed"
              " since, the runs below are the record's)" if result.reused else "")
    text = f"{verdict.details or verdict.why}\n\ntriage: {result.verdict}{reused}\n{runs}"
    return replace(verdict, details=text)
