"""Triage judges a re-run by the failed test's rules, the distribution check included."""

from __future__ import annotations

import math

from harness.checks.distribution import (
    DISTRIBUTION_DISTANCE,
    DISTRIBUTION_FORCED,
    DistributionPolicy,
)
from harness.checks.logprobs import LogprobPolicy
from harness.core.comparison import NearTiePolicy
from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.triage.judge import Policies, judge, triaged


def trace(target: str, p: float) -> Trace:
    table = {10: math.log(p), 11: math.log((1 - p) * 0.6), 12: math.log((1 - p) * 0.3)}
    steps = [TokenStep(10, table[10], dict(table)) for _ in range(4)]
    t = Trace(target, {"r0": RequestTrace("r0", [1, 2], steps)})
    t.forced = {"r0": RequestTrace("r0", [1, 2], list(steps))}
    return t


def policies(limit: float) -> Policies:
    return Policies(lambda label: NearTiePolicy(), lambda label: LogprobPolicy(0.5),
                    lambda label: DistributionPolicy(limit, source="test"))


def test_distribution_failures_are_triaged_and_judged_by_the_tests_policy() -> None:
    assert triaged(DISTRIBUTION_DISTANCE) and triaged(DISTRIBUTION_FORCED)
    ref, dev = trace("cpu-ref", 0.9), trace("vllm-cpu-bf16", 0.6)
    for check in (DISTRIBUTION_DISTANCE, DISTRIBUTION_FORCED):
        strict = judge(check, dev, ref, policies(0.01))
        assert not strict.ok and strict.check == check
        assert judge(check, dev, ref, policies(1.0)).ok
    assert "teacher-forced" in judge(DISTRIBUTION_FORCED, dev, ref, policies(0.01)).why
