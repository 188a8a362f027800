"""The triaged check, judged again on a triage run's trace: the same check family, the same
policies as the failed test (pure functions of the traces, no report side effects)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from harness.checks.distribution import (
    DISTRIBUTION_DISTANCE,
    DISTRIBUTION_FORCED,
    DistributionPolicy,
    compare_distributions,
)
from harness.checks.forcing import compare_forced
from harness.checks.ledger import check_ledger
from harness.checks.logprobs import LogprobPolicy, compare_logprobs
from harness.checks.self_consistency import check_self_consistency
from harness.checks.tokens import compare_traces, token_verdict
from harness.core.comparison import NearTiePolicy
from harness.core.trace import Trace
from harness.core.verdict import (
    FORCED_LOGPROBS,
    FORCED_TOKENS,
    KV_LEDGER,
    KV_LEDGER_UNRECORDED,
    LOGPROB_CLOSENESS,
    SELF_CONSISTENCY,
    TOKEN_EQUALITY,
    Verdict,
)

# The checks triage re-runs: token equality (free and forced), the free run's greedy
# self-consistency, logprob closeness and distribution distance (free and forced), and the
# KV ledger's invariants.
TOKEN_CHECKS = (TOKEN_EQUALITY, FORCED_TOKENS, SELF_CONSISTENCY, LOGPROB_CLOSENESS, FORCED_LOGPROBS,
                DISTRIBUTION_DISTANCE, DISTRIBUTION_FORCED)


def triaged(check: str) -> bool:
    """Whether a failed verdict of ``check`` is triaged."""
    if check.endswith(".negative_control") or check == KV_LEDGER_UNRECORDED:
        return False
    return check in TOKEN_CHECKS or check.split(".", 1)[0] == KV_LEDGER


@dataclass(frozen=True)
class Policies:
    """The failed test's rules, per trace label."""

    near_tie: Callable[[str], NearTiePolicy]
    logprob: Callable[[str], LogprobPolicy]
    distribution: Callable[[str], DistributionPolicy]


def only(trace: Trace, request_ids: Iterable[str]) -> Trace:
    """``trace`` cut to ``request_ids`` (a triage run may run one request alone)."""
    keep = set(request_ids)
    return replace(trace, requests={k: v for k, v in trace.requests.items() if k in keep})


def judge(check: str, trace: Trace, reference: Trace | None, policies: Policies) -> Verdict:
    """``check`` (a triaged check) on ``trace``: the first failed verdict of its family, else a
    passed one."""
    if check.split(".", 1)[0] == KV_LEDGER:
        return check_ledger(trace)
    if reference is None:
        return Verdict.failed(check, "triage: no reference to judge the run against")
    ref = only(reference, [*trace.requests, *trace.forced])
    label = trace.target
    if check == TOKEN_EQUALITY:
        return token_verdict(compare_traces(ref, trace, policy=policies.near_tie(label)))
    if check == SELF_CONSISTENCY:
        return check_self_consistency(trace, greedy=True)
    if check == LOGPROB_CLOSENESS:
        return compare_logprobs(ref, trace, policies.logprob(label)).verdict()
    if check in (DISTRIBUTION_DISTANCE, DISTRIBUTION_FORCED):
        return compare_distributions(ref, trace, policies.distribution(label),
                                     forced=check == DISTRIBUTION_FORCED).verdict()
    forced = compare_forced(ref, trace, policies.near_tie(label), policies.logprob(label))
    verdicts = [v for v in forced.verdicts() if v.check == check]
    return next((v for v in verdicts if not v.ok), Verdict.passed(check))
