"""The verdicts a suite asks of its session: token equality (with greedy self-consistency),
logprob closeness, distribution distance, the teacher-forced run, the KV ledgers, aborts; and
``expect``, which records every verdict for the report and raises the first failed one, triaged
first where triage applies (``harness.triage``).

``SessionVerdicts`` is the judging half of ``HilSession`` (``harness.session.facade``), which
runs the engines and the reference these verdicts read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from harness.checks.aborts import check_aborts
from harness.checks.agreement import AgreementTally
from harness.checks.distribution import compare_distributions
from harness.checks.forcing import compare_forced
from harness.checks.ledger import check_idle_ledgers, check_ledger
from harness.checks.logprobs import compare_logprobs
from harness.checks.self_consistency import check_self_consistency
from harness.checks.tokens import compare_traces, token_verdict
from harness.core.comparison import NearTiePolicy
from harness.core.config import EngineConfig
from harness.core.trace import KvSnapshot, Trace
from harness.core.verdict import FORCED_TOKENS, Verdict, VerdictFailed
from harness.engine.hygiene import EngineHygiene, judge_snapshots, judge_trace
from harness.scenario.catalog import Model
from harness.scenario.prompts import Scenario
from harness.session.listeners import Listeners
from harness.session.precision import PrecisionDesk, Rules
from harness.session.stats import Timers
from harness.targets import kind_of_label
from harness.triage.session_hook import TriageDesk, with_triage, with_untriaged

if TYPE_CHECKING:
    from harness.session.options import SessionOptions


class SessionVerdicts:
    """The checks of a session, each returning a ``Verdict``; ``expect`` raises on a failed one.
    Mixed into ``HilSession``, which sets the parts declared here."""

    opts: SessionOptions
    timers: Timers
    listeners: Listeners
    precision: PrecisionDesk
    hygiene: EngineHygiene
    triage: TriageDesk
    agreement: AgreementTally
    near_ties: list[str]
    current_test: str
    _near_tie_given: dict[str, float]
    reference: Callable[[Model, Scenario], Trace]
    kv_snapshot: Callable[[EngineConfig], list[KvSnapshot]]

    def check_tokens(
        self, model: Model, scenario: Scenario, trace: Trace, reference: Trace | None = None
    ) -> Verdict:
        """Token equality of ``trace`` against the CPU reference (computed when not given);
        accepted near-ties are kept for the run summary. When the device's own logprobs say a
        chosen token is not its top-1 (``_self_consistency``), that verdict is returned instead:
        a sampler error, whether or not token equality let it pass as a near-tie."""
        scenario = scenario.completing()  # an aborted request returns no output to compare
        reference = self.reference(model, scenario) if reference is None else reference
        policy = self.rules(trace, model).near_tie
        with self.timers.timed("checks"):
            comparison = compare_traces(reference, trace, policy=policy)
            verdict = token_verdict(comparison, model.decode, scenario.prompts_by_id())
            greedy = self._self_consistency(trace, verdict)
        for d in comparison.near_ties:
            self.near_ties.append(
                f"{trace.target} {scenario.name} request {d.request_id} position {d.position}"
            )
        self.listeners.on_comparison(scenario, reference, trace, comparison, model.decode)
        return verdict if greedy is None else greedy

    @staticmethod
    def _self_consistency(trace: Trace, tokens: Verdict) -> Verdict | None:
        """The greedy self-consistency verdict of ``trace``'s free run when it failed, with the
        token-equality outcome appended; None when it held. Every engine call of the harness
        samples greedily (temperature 0, ``harness.in_engine.process``). It runs where the trace
        recorded top-k logprobs: without them the near-tie rule accepts no difference, so a
        sampler error cannot hide behind it."""
        if not any(s.top_logprobs for r in trace.requests.values() for s in r.steps):
            return None
        v = check_self_consistency(trace, greedy=True)
        if v.ok:
            return None
        return Verdict.failed(v.check, v.why, at=v.at, details=(
            f"{v.details}\n\ntoken equality against the reference: {tokens.why}"))

    def rules(self, trace: Trace, model: Model | None = None) -> Rules:
        """The rules ``trace`` is judged by: near-tie, logprob and distribution policies of
        the precision its engine computes in (calibrated for fp16 and bf16, measured on first
        use: ``harness.session.precision``)."""
        with self.timers.timed("calibration"):
            rules = self.precision.rules(trace.target, model, trace.info)
        self.listeners.on_rules(trace, rules)
        return rules

    def _near_tie_of(self, label: str) -> NearTiePolicy:
        """The kind's flat near-tie rule for ``label`` (its backend's tolerance, the dtypes)."""
        return kind_of_label(label).near_tie_policy(self.opts.near_tie, label,
                                                    self._near_tie_given)

    def check_logprobs(self, scenario: Scenario, trace: Trace, reference: Trace,
                       model: Model | None = None) -> Verdict:
        """Logprob closeness of the free run: every token both sides chose after the same
        history has the reference's logprob within the rules of the engine's precision."""
        rules = self.rules(trace, model)
        with self.timers.timed("checks"):
            return compare_logprobs(reference, trace, rules.logprob).verdict()

    def check_distribution(self, model: Model, scenario: Scenario, trace: Trace,
                           reference: Trace) -> list[Verdict]:
        """Distribution distance: at every compared position the device's top-k distribution
        is within the KL its precision allows of the reference's (free run, and the
        teacher-forced run where the trace has one)."""
        rules = self.rules(trace, model)
        with self.timers.timed("checks"):
            verdicts = [compare_distributions(reference, trace, rules.distribution).verdict()]
            if trace.forced:
                verdicts.append(compare_distributions(reference, trace, rules.distribution,
                                                      forced=True).verdict())
        return verdicts

    def check_forced(self, model: Model, scenario: Scenario, trace: Trace,
                     reference: Trace) -> list[Verdict]:
        """The teacher-forced run of ``trace`` (``hil.generate(..., teacher=reference)``): every
        position's argmax equal to the reference's or a near-tie there, and its logprob of the
        reference's token within tolerance. Where the engine cannot force, one passing verdict
        saying so (the run summary lists it too)."""
        reason = trace.info.get("teacher_forcing_unsupported")
        if not self.opts.teacher_forcing:
            reason = "off (--no-teacher-forcing)"
        if reason or not trace.forced:
            why = f"teacher forcing not run on {trace.target}: {reason or 'no forced output'}"
            self.agreement.unsupported(trace.target, model.label, why)
            if reason:
                return [Verdict.passed(FORCED_TOKENS, why)]
        rules = self.rules(trace, model)
        with self.timers.timed("checks"):
            forced = compare_forced(reference, trace, rules.near_tie, rules.logprob)
            verdicts = forced.verdicts()
        self.agreement.add(trace.target, model.label, forced)
        self.listeners.on_forced(scenario, reference, trace, forced)
        return verdicts

    def check_ledger(self, trace: Trace) -> Verdict:
        """Every KV ledger invariant at every step of a step-driven ``trace``."""
        with self.timers.timed("checks"):
            verdict = check_ledger(trace)
        inherited = self.hygiene.inherited(self.current_test, trace.target)
        return verdict if inherited is None else judge_trace(trace, inherited, verdict)

    def check_aborts(self, scenario: Scenario, trace: Trace) -> Verdict:
        """The requests ``scenario`` aborts were aborted at their step and not served after
        (their blocks' return is ``check_ledger``'s)."""
        return check_aborts(scenario.aborts(), trace)

    def check_idle_ledgers(self, cfg: EngineConfig, when: str = "after warmup") -> Verdict:
        """Every block of the engine of ``cfg`` is free now (an idle point)."""
        snapshots = self.kv_snapshot(cfg)
        verdict = check_idle_ledgers(snapshots, when)
        inherited = self.hygiene.inherited(self.current_test, cfg.label)
        return verdict if inherited is None else judge_snapshots(snapshots, inherited, verdict)

    def expect(self, *verdicts: Verdict, trace: Trace | None = None) -> None:
        """Record each verdict for the report; raise ``VerdictFailed`` on the first that failed,
        triaged first where it is a token-equality or KV verdict (``harness.triage``): its text
        then ends with the triage's verdict."""
        __tracebackhide__ = True
        for v in verdicts:
            self.listeners.on_verdict(v, trace)
        for v in verdicts:
            if not v.ok:
                untriaged = self.triage.refused(v, trace)
                result = None if untriaged else self.triage.failed(self.current_test, v, trace)
                if result is not None:
                    self.timers.add("triage", result.seconds)
                    self.listeners.on_triage(result)
                    v = with_triage(v, result)
                elif untriaged:
                    v = with_untriaged(v, untriaged)
                raise VerdictFailed(self.with_faults(v))

    def with_faults(self, verdict: Verdict) -> Verdict:
        """``verdict`` whose text ends with the faults this run injected, if any: a failure
        a fault caused must not read as the stack's own bug."""
        faults = [*self.opts.faults, *self.opts.device_faults]
        if not faults:
            return verdict
        text = f"{verdict.details or verdict.why}\n\nfaults injected in this run: {', '.join(faults)}"
        return replace(verdict, details=text)

    def expect_failure(self, verdict: Verdict, mentioning: str = "",
                       trace: Trace | None = None) -> None:
        """Negative control: ``verdict`` must have failed, saying ``mentioning``; the control's
        own verdict (``<check>.negative_control``) is what gets recorded."""
        __tracebackhide__ = True
        tripped = not verdict.ok and mentioning in verdict.details
        check = f"{verdict.check}.negative_control"
        control = (
            Verdict.passed(check, f"the check tripped: {verdict.why}") if tripped
            else Verdict.failed(check, f"negative control: check {verdict.check} did not fail"
                                f" saying {mentioning!r} (detector blind?): {verdict.why}")
        )
        self.expect(control, trace=trace)
