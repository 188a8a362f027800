"""The session's side of triage: what each test ran (to re-run it), the facts a triage plan
needs about the engine, and the failure text with the triage verdict added.

``TriageDesk`` remembers, per test, every trace the session produced with the engine,
scenario and teacher behind it, and the references computed; when ``HilSession.expect`` raises
on a triaged check (``harness.triage.judge.triaged``) of such a trace, the desk hands the
failed run to the ``TriageRunner``, keeps the result, and returns the verdict the test raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from harness.core.config import EngineConfig
from harness.core.trace import Trace
from harness.core.triage import TriageResult
from harness.core.verdict import Verdict
from harness.engine.pool import prefix_caching_on
from harness.scenario.prompts import Scenario
from harness.stacks import host as host_stack
from harness.stacks.spec import load_stack, variant_problem
from harness.targets import kind
from harness.targets.variants import VARIANTS
from harness.triage.judge import triaged
from harness.triage.plan import Facts, FailedRun
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
    results: list[TriageResult] = field(default_factory=list)
    _runs: dict[int, tuple[Trace, _Ran]] = field(default_factory=dict)
    _refs: dict[str, Trace] = field(default_factory=dict)

    def begin_test(self) -> None:
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
        return budget.refusal() if budget.enabled else None

    def failed(self, nodeid: str, verdict: Verdict, trace: Trace | None) -> TriageResult | None:
        """Triage ``verdict`` (failed on ``trace``) when it is a triaged check of a run this
        test made and the budget allows; the result, or None."""
        if trace is None or not triaged(verdict.check) or id(trace) not in self._runs:
            return None
        if self.runner.budget.refusal() is not None:
            return None
        _, ran = self._runs[id(trace)]
        run = FailedRun(ran.cfg, ran.scenario, ran.op, verdict.check,
                        named_request(verdict, ran.scenario), ran.teacher,
                        self._refs.get(ran.scenario.name, ran.teacher))
        result = self.runner.triage(nodeid, run, facts_of(ran.cfg))
        self.results.append(result)
        return result


def with_untriaged(verdict: Verdict, why: str) -> Verdict:
    """``verdict`` whose text ends with why it was not triaged."""
    return replace(verdict, details=f"{verdict.details or verdict.why}\n\ntriage: {why}")


def with_triage(verdict: Verdict, result: TriageResult) -> Verdict:
    """``verdict`` whose text ends with the triage's verdict and runs (its first line, which
    files it in the report, unchanged)."""
    runs = "\n".join(f"  {r.factor:9} {r.arm}: {r.outcome}" + (f" ({r.why})" if r.why else "")
                     for r in result.runs)
    text = f"{verdict.details or verdict.why}\n\ntriage: {result.verdict}\n{runs}"
    return replace(verdict, details=text)
