"""Makes the probes of a triage (``harness.triage.plan``) on fresh engines of the session's
pool, judges each run with the failed check (``harness.triage.judge``) and decides
(``harness.triage.decide``).

Every probe starts its engine fresh (the pool's engine of that configuration is stopped
first) and stops it after, so a triage leaves no engine that served its runs behind. The runs
go through an engine driver of their own that tells the report nothing: the failed test's
evidence stays the failed run's. An engine that refuses a condition or fails is that arm's
``error`` row; the budget's end turns the arms not yet made into ``not run`` rows.
"""

from __future__ import annotations

import math
import time

from harness.checks.capacity import CapacityError, KvPool
from harness.core.config import ConfigError, EngineConfig
from harness.core.errors import EngineError
from harness.core.trace import Trace
from harness.core.triage import ERROR, FAILED, NOT_RUN, PASSED, TriageResult, TriageRun
from harness.engine.driver import EngineDriver
from harness.engine.pool import EnginePool
from harness.scenario.prompts import RequestSpec, Scenario
from harness.targets import target_for
from harness.triage.budget import RAN_OUT, TriageBudget
from harness.triage.decide import decide
from harness.triage.judge import Policies, judge, only
from harness.triage.plan import Cycle, Facts, FailedRun, Probe, Warm, plan

MAX_FILLER = 64  # filler requests a pool may need to be cycled; a larger pool is not cycled


class NotApplicable(Exception):
    """The probe cannot be made on this engine (its pool is too large to cycle...)."""


def filler(scenario: Scenario, cfg: EngineConfig, pool: KvPool) -> Scenario:
    """Requests of one token each whose prompts, together, take every block of ``pool`` once;
    each prompt differs from its first token on, so no prefix cache serves one from another."""
    target = target_for(cfg)
    length = cfg.max_model_len - 1
    while length > 1:
        try:
            target.check_request(length, 1)
            break
        except ConfigError:
            length -= pool.block_size
    per = math.ceil((length + 1) / pool.block_size)
    count = math.ceil(max(1, pool.num_blocks - pool.pad_blocks) / per) + 1
    if count > MAX_FILLER:
        raise NotApplicable(f"the pool of {pool.num_blocks} blocks would take {count} filler"
                            f" requests to cycle (more than {MAX_FILLER})")
    stream = [t for r in scenario.requests for t in r.prompt_token_ids] or [1]
    requests = []
    for i in range(count):
        ids = [stream[(i * 7 + j) % len(stream)] for j in range(length)]
        ids[0] = stream[i % len(stream)] + i + 1  # distinct from the first token on
        requests.append(RequestSpec(f"filler-{i}", tuple(ids), 1))
    return Scenario(f"{scenario.name}-filler", requests, scenario.limits, {"scenario": "filler"})


class TriageRunner:
    """Triages failed verdicts on the session's engine pool, within ``budget``."""

    def __init__(self, pool: EnginePool, driver: EngineDriver, policies: Policies,
                 budget: TriageBudget) -> None:
        self.pool = pool
        self.driver = driver
        self.policies = policies
        self.budget = budget

    def triage(self, nodeid: str, run: FailedRun, facts: Facts,
               budget: TriageBudget | None = None) -> TriageResult:
        """Make the probes of ``run``'s plan and decide; the test and its seconds count
        against ``budget`` (the runner's own when None: a known failure's triage passes a
        budget of its own, so it costs the session's nothing)."""
        budget = self.budget if budget is None else budget
        t0 = time.monotonic()
        budget.tests += 1
        runs: list[TriageRun] = []
        left_out = 0
        self.pool.purpose = "triage"  # a card's ledger records these starts as triage's
        try:
            for probe in plan(run, facts):
                left_out += self._make(probe, run, runs, t0, budget)
        finally:
            self.pool.purpose = None
        seconds = time.monotonic() - t0
        budget.spent += seconds
        key, verdict = decide(runs)
        note = (f"{left_out} probe(s) not made: the triage budget of {budget.seconds:g} s"
                " ran out" if left_out else "")
        return TriageResult(nodeid, run.check, key, verdict, tuple(runs), round(seconds, 2), note)

    def _make(self, probe: Probe, run: FailedRun, runs: list[TriageRun], t0: float,
              budget: TriageBudget) -> int:
        """Add ``probe``'s rows to ``runs`` (made, or why not); 1 when the budget left it out."""
        if probe.skip:
            runs.append(TriageRun(probe.factor, "-", probe.cfg.label, (), NOT_RUN, probe.skip))
        elif budget.spent + (time.monotonic() - t0) >= budget.seconds:
            runs += [TriageRun(probe.factor, arm, probe.cfg.label, (), NOT_RUN,
                               RAN_OUT)
                     for arm in probe.arms()]
            return 1
        else:
            runs += self._probe(probe, run)
        return 0

    def _probe(self, probe: Probe, run: FailedRun) -> list[TriageRun]:
        rows: list[TriageRun] = []
        self.pool.discard(probe.cfg.key)  # a fresh engine
        try:
            for step in probe.steps:
                t0 = time.monotonic()
                if isinstance(step, Cycle):
                    self._drive(probe.cfg, filler(run.scenario, probe.cfg,
                                                  self.driver.kv_pool(probe.cfg)), run, False)
                elif isinstance(step, Warm):
                    self._drive(probe.cfg, step.scenario, run, run.teacher is not None)
                else:
                    trace = self._drive(probe.cfg, step.scenario, run, step.teacher)
                    v = judge(run.check, trace, run.reference, self.policies)
                    rows.append(TriageRun(
                        probe.factor, step.arm, probe.cfg.label,
                        tuple(r.request_id for r in step.scenario.requests),
                        PASSED if v.ok else FAILED, v.why, round(time.monotonic() - t0, 2)))
        except (EngineError, ConfigError, CapacityError, NotApplicable) as e:
            outcome = NOT_RUN if isinstance(e, NotApplicable) else ERROR
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            done = {x.arm for x in rows}
            rows += [TriageRun(probe.factor, arm, probe.cfg.label, (), outcome, why)
                     for arm in probe.arms() if arm not in done]
        finally:
            self.pool.discard(probe.cfg.key)
        return rows

    def _drive(self, cfg: EngineConfig, scenario: Scenario, run: FailedRun,
               teacher: bool) -> Trace:
        if run.op == "run_steps":
            return self.driver.run_steps(cfg, scenario, probe=True)
        ids = [r.request_id for r in scenario.requests]
        forced = only(run.teacher, ids) if teacher and run.teacher is not None else None
        return self.driver.generate(cfg, scenario, forced)


__all__ = ["TriageRunner", "filler"]
