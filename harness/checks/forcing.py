"""Teacher-forced comparison: every position judged given the reference's history.

In a teacher-forced run (``harness.in_engine.teacher_forcing``) the device decodes with the
reference's token fed back at each position, and records its own distribution
first. So position N of the forced run is the device's prediction after the
same history as the reference's position N, for every N, even past a free run's
first divergence.

Per position: the device's argmax agrees with the reference token, or the
disagreement must pass the near-tie rule of ``harness.checks.tokens`` at that
position (the device's argmax standing in for its token); the reference
token's rank and logprob on the device, and the device's gap (its argmax's
probability minus the reference token's) are recorded. Per request: the first
disagreement, the agreement rate, the largest logprob deviation and where.
Logprob closeness over all positions is ``harness.checks.logprobs``'s rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.checks.logprobs import (
    LogprobComparison,
    LogprobPolicy,
    RequestDeviations,
    forced_deviations,
)
from harness.checks.tokens import _near_tie_failures
from harness.core.comparison import NearTiePolicy
from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.core.verdict import FORCED_LOGPROBS, FORCED_TOKENS, Verdict


@dataclass(frozen=True)
class ForcedPosition:
    """One position of a forced run. ``dev_token`` is the device's argmax; ``ref_rank``
    the reference token's 1-based rank on the device (None: not reported)."""

    position: int
    ref_token: int
    dev_token: int
    ref_logprob: float  # the reference's own
    ref_logprob_on_dev: float | None
    ref_rank: int | None
    gap: float | None  # p_dev(dev_token) - p_dev(ref_token)
    ref_near_tie: bool  # the reference's top-2 are within the near-tie tolerance here
    problems: tuple[str, ...] = ()  # why a disagreement is not a near-tie

    @property
    def agrees(self) -> bool:
        return self.dev_token == self.ref_token

    @property
    def accepted(self) -> bool:
        return self.agrees or not self.problems


@dataclass
class ForcedRequest:
    """One request's forced run against the reference."""

    request_id: str
    positions: list[ForcedPosition] = field(default_factory=list)
    deviations: RequestDeviations | None = None
    error: str = ""  # the forced run is unusable (missing, forcing not applied)

    @property
    def first_divergence(self) -> int | None:
        return next((p.position for p in self.positions if not p.agrees), None)

    @property
    def agreement_rate(self) -> float:
        n = len(self.positions)
        return sum(p.agrees for p in self.positions) / n if n else 1.0

    @property
    def rejected(self) -> list[ForcedPosition]:
        return [p for p in self.positions if not p.accepted]


def _argmax(step: TokenStep) -> int:
    return min(step.top_logprobs.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def _ref_near_tie(step: TokenStep, tol: float) -> bool:
    probs = sorted((math.exp(v) for v in step.top_logprobs.values()), reverse=True)
    return len(probs) >= 2 and probs[0] - probs[1] <= tol


def compare_forced_request(ref: RequestTrace, forced: RequestTrace | None,
                           near_tie: NearTiePolicy) -> ForcedRequest:
    """Judge every position of one forced run (see the module docstring)."""
    out = ForcedRequest(ref.request_id)
    if forced is None:
        out.error = "no teacher-forced output from the device"
        return out
    fed = forced.token_ids
    if fed != ref.token_ids:
        first = next((i for i, (a, b) in enumerate(zip(ref.token_ids, fed, strict=False))
                      if a != b), min(len(fed), len(ref.steps)))
        out.error = (f"forcing was not applied: the forced run's tokens differ from the"
                     f" reference's at position {first} ({len(fed)} forced tokens for"
                     f" {len(ref.steps)} reference tokens)")
        return out
    for pos, (r, f) in enumerate(zip(ref.steps, forced.steps, strict=False)):
        dev_top = _argmax(f) if f.top_logprobs else f.token_id
        lp_ref_on_dev = f.top_logprobs.get(r.token_id, f.logprob)
        rank = f.rank if f.rank is not None else f.rank_of(r.token_id)
        gap = math.exp(f.top_logprobs[dev_top]) - math.exp(lp_ref_on_dev) \
            if dev_top in f.top_logprobs else None
        problems: tuple[str, ...] = ()
        if dev_top != r.token_id:
            # The near-tie rule at this position, with the device's argmax as its token.
            dev_step = TokenStep(dev_top, f.top_logprobs[dev_top], dict(f.top_logprobs))
            problems = tuple(_near_tie_failures(r, dev_step, near_tie))
        out.positions.append(ForcedPosition(
            pos, r.token_id, dev_top, r.top_logprobs.get(r.token_id, r.logprob), lp_ref_on_dev,
            rank, gap, _ref_near_tie(r, near_tie.prob_tol), problems))
    out.deviations = forced_deviations(ref, forced)
    return out


@dataclass
class ForcedComparison:
    """Every request's forced run; its two verdicts (tokens, logprobs)."""

    dev_target: str
    near_tie: NearTiePolicy
    logprob: LogprobPolicy
    requests: list[ForcedRequest]

    def agreement_rate(self) -> float:
        n = sum(len(r.positions) for r in self.requests)
        return sum(sum(p.agrees for p in r.positions) for r in self.requests) / n if n else 1.0

    def num_positions(self) -> int:
        return sum(len(r.positions) for r in self.requests)

    def disagreements(self) -> int:
        return sum(not p.agrees for r in self.requests for p in r.positions)

    def summary(self) -> str:
        return (f"teacher-forced: {self.num_positions()} positions of {len(self.requests)}"
                f" requests, agreement {100 * self.agreement_rate():.1f} %,"
                f" {self.disagreements()} disagreements")

    def token_verdict(self) -> Verdict:
        broken = [r for r in self.requests if r.error]
        bad = [r for r in self.requests if not r.error and r.rejected]
        if not broken and not bad:
            return Verdict.passed(FORCED_TOKENS, self.summary() + " (all accepted)")
        lines: list[str] = []
        if broken:
            why = (f"teacher-forced run unusable on {self.dev_target}: request"
                   f" {broken[0].request_id}: {broken[0].error}")
        else:
            n = sum(len(r.rejected) for r in bad)
            p0 = bad[0].rejected[0]
            why = (f"token mismatch given the reference's history on {self.dev_target}:"
                   f" {n} positions in {len(bad)} requests are neither equal nor a near-tie;"
                   f" first at request {bad[0].request_id} position {p0.position}")
        lines += [why, self.summary(), f"near-tie policy: {self.near_tie.describe()}", ""]
        for r in broken:
            lines.append(f"request {r.request_id}: {r.error}")
        for r in bad:
            lines.append(self._request_line(r))
            for p in r.rejected[:8]:
                lines.append(
                    f"  position {p.position}: reference token {p.ref_token}, device argmax"
                    f" {p.dev_token}; reference token on the device: rank {p.ref_rank},"
                    f" logprob {_lp(p.ref_logprob_on_dev)} (reference {p.ref_logprob:.4f}),"
                    f" gap {_p(p.gap)}; " + "; ".join(p.problems))
        at = bad[0].rejected[0].position if bad else None
        return Verdict.failed(FORCED_TOKENS, why, at=at, details="\n".join(lines))

    def _request_line(self, r: ForcedRequest) -> str:
        worst = r.deviations.largest() if r.deviations else None
        where = "" if worst is None else (
            f", largest logprob deviation {worst.value:.4g} at position {worst.position}")
        return (f"request {r.request_id}: first divergence {r.first_divergence}, agreement"
                f" {100 * r.agreement_rate:.1f} % of {len(r.positions)}{where}")

    def logprob_comparison(self) -> LogprobComparison:
        reqs = [r.deviations for r in self.requests if r.deviations is not None]
        return LogprobComparison(self.dev_target, self.logprob, reqs, check=FORCED_LOGPROBS,
                                 run="teacher-forced")

    def verdicts(self) -> list[Verdict]:
        return [self.token_verdict(), self.logprob_comparison().verdict()]

    def request_lines(self) -> list[str]:
        """Per request: first divergence, agreement rate, largest deviation and where."""
        return [self._request_line(r) for r in self.requests if not r.error]


def _lp(x: float | None) -> str:
    return "?" if x is None else f"{x:.4f}"


def _p(x: float | None) -> str:
    return "?" if x is None else f"{x:.4f}"


def compare_forced(ref: Trace, dev: Trace, near_tie: NearTiePolicy,
                   logprob: LogprobPolicy) -> ForcedComparison:
    """Every reference request against the device's forced run of the same id."""
    reqs = []
    for rid, r in ref.requests.items():
        fr = compare_forced_request(r, dev.forced.get(rid), near_tie)
        fr.request_id = rid
        if fr.deviations is not None:
            fr.deviations.request_id = rid
        reqs.append(fr)
    return ForcedComparison(dev.target, near_tie, logprob, reqs)
