"""Distribution distance: the device's distribution at each step is near the reference's.

Logprob closeness (``harness.checks.logprobs``) looks at one token per position; a kernel
error can move the rest of the distribution first. This check compares the whole recorded
distribution: per compared position, KL(reference || device) in nats.

What the traces hold. Both sides record a top-k table per step (``TokenStep.top_logprobs``:
log-probabilities over the full vocabulary of the k most likely tokens, plus the step's own
token), not the full distribution. So the value is a lower bound of the full KL, computed
exactly from the two tables (``harness.calibration.topk_kl``): the reference's recorded
tokens one bucket each, everything else one "other" bucket; a reference token the device
did not record gets the device probability, within what its table allows (at most its
k-th), that makes the KL smallest. A value over the threshold is therefore evidence, never
an artefact of the truncation; a device that moves mass onto tokens the reference did not
record shows as mass missing from the reference's tokens.

Positions compared: in a free run, those before the first differing token (same history
on both sides); in a teacher-forced run (``Trace.forced``), every position.

Engines that compute in fp32 like the reference are held to ``KL_FP32`` at every position.
Reduced-precision thresholds come from calibration (``harness.calibration``: the same estimate measured on
the same prompts, reduced precision against fp32): a position over ``limit`` fails, and a
request or the run fails when more of its positions are over ``band`` (the measured p99)
than 1 % per position would give by chance (``allowed_over``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.calibration.thresholds import ALPHA, BAND_RATE, Thresholds, allowed_over
from harness.calibration.topk_kl import topk_kl
from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.core.verdict import Verdict

DISTRIBUTION_DISTANCE = "distribution_distance"
DISTRIBUTION_FORCED = "distribution_distance.forced"  # the teacher-forced run
# A compared step without alternatives to compare: a harness or engine problem, not drift.
DISTRIBUTION_UNRECORDED = "distribution_distance.unrecorded"
METRIC = "kl_topk"  # the calibration metric this check's thresholds come from
# The fp32 paths (vllm-cpu, Spyre eager) against the fp32 reference differ by summation order
# only: the largest KL measured on the suites is 9e-8 nats (vllm-cpu 0.28); the limit leaves
# three orders of magnitude for other checkpoints, while logits scaled by 2 % move a
# tiny model's distribution by 2e-4 nats.
KL_FP32 = 1e-4


@dataclass(frozen=True)
class DistributionPolicy:
    """How far (KL, nats) the device's distribution may be from the reference's."""

    limit: float
    band: float | None = None  # None: no rate criterion, the limit alone
    rate: float = BAND_RATE
    alpha: float = ALPHA
    source: str = ""  # where the numbers came from, shown in every verdict

    def __post_init__(self) -> None:
        if not self.limit >= 0.0 or (self.band is not None and not self.band >= 0.0):
            raise ValueError(f"KL thresholds must be >= 0, got limit={self.limit}"
                             f" band={self.band}")

    @classmethod
    def from_thresholds(cls, th: Thresholds) -> DistributionPolicy:
        t = th.metrics[METRIC]
        return cls(t.limit, t.band, th.rate, th.alpha,
                   f"calibrated {th.precision}, {t.n} positions")

    def allowed(self, n: int) -> int:
        return n if self.band is None else allowed_over(n, self.rate, self.alpha)

    def describe(self) -> str:
        band = "" if self.band is None else f", band {self.band:.4g}"
        src = f" ({self.source})" if self.source else ""
        return f"KL limit {self.limit:.4g}{band} nats{src}"


def step_kl(ref: TokenStep, dev: TokenStep) -> float:
    """The KL lower bound at one position (see the module docstring)."""
    return topk_kl(ref.top_logprobs, dev.top_logprobs, dev.token_id)


@dataclass
class RequestDistances:
    """One request's compared positions: KL per position, and positions with no table."""

    request_id: str
    kl: list[float] = field(default_factory=list)
    unrecorded: list[int] = field(default_factory=list)


def _no_alternatives(step: TokenStep) -> bool:
    return not any(t != step.token_id for t in step.top_logprobs)


def request_distances(ref: RequestTrace, dev: RequestTrace, forced: bool) -> RequestDistances:
    out = RequestDistances(ref.request_id)
    for pos, (r, d) in enumerate(zip(ref.steps, dev.steps, strict=False)):
        if not forced and r.token_id != d.token_id:
            break
        if _no_alternatives(r) or _no_alternatives(d):
            out.unrecorded.append(pos)
        out.kl.append(step_kl(r, d))
    return out


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4g}"


@dataclass
class DistributionComparison:
    """Every request's distances and the verdict on them."""

    dev_target: str
    policy: DistributionPolicy
    requests: list[RequestDistances]
    run: str = "free run"

    def positions(self) -> list[float]:
        return [v for r in self.requests for v in r.kl]

    def _head(self) -> str:
        vals = self.positions()
        top = max(vals, default=0.0)
        return (f"{self.run}, {len(vals)} positions of {len(self.requests)} requests compared"
                f" ({self.policy.describe()}): largest KL {_fmt(top)}")

    def _request_problem(self, r: RequestDistances) -> str | None:
        p = self.policy
        over = [i for i, v in enumerate(r.kl) if not v <= p.limit]
        if over:
            return (f"request {r.request_id}: KL {_fmt(r.kl[over[0]])} at position {over[0]}"
                    f" over the limit {p.limit:.4g} ({len(over)} positions over it)")
        if p.band is None:
            return None
        n = sum(v > p.band for v in r.kl)
        if n > p.allowed(len(r.kl)):
            return (f"request {r.request_id}: {n} of {len(r.kl)} positions over the band"
                    f" {p.band:.4g}, {p.allowed(len(r.kl))} allowed")
        return None

    def verdict(self) -> Verdict:
        head = self._head()
        gaps = [r for r in self.requests if r.unrecorded]
        if gaps:
            why = (f"no distribution to compare on {self.dev_target} ({self.run}): request"
                   f" {gaps[0].request_id} position {gaps[0].unrecorded[0]} recorded no"
                   " alternative to its own token; ask the engine for top-k logprobs")
            return Verdict.failed(DISTRIBUTION_UNRECORDED, why, at=gaps[0].unrecorded[0],
                                  details=f"{why}\n{head}")
        check = DISTRIBUTION_FORCED if self.run == "teacher-forced" else DISTRIBUTION_DISTANCE
        problems = [(r, p) for r in self.requests if (p := self._request_problem(r))]
        vals = self.positions()
        run_over = 0 if self.policy.band is None else sum(v > self.policy.band for v in vals)
        run_bad = run_over > self.policy.allowed(len(vals))
        if not problems and not run_bad:
            return Verdict.passed(check, head)
        why = (f"the device's distribution is farther from the reference's than the measured"
               f" noise allows on {self.dev_target} ({self.run}): ")
        why += (f"{len(problems)} of {len(self.requests)} requests" if problems else
                f"{run_over} of {len(vals)} positions over the band {self.policy.band:.4g},"
                f" {self.policy.allowed(len(vals))} allowed")
        lines = [why, head, ""] + [p for _, p in problems[:20]]
        if len(problems) > 20:
            lines.append(f"... {len(problems) - 20} more requests")
        lines.append("What to do: a numerics error (kernel, dtype, layout, scale) moves the"
                     " distribution before it flips tokens; compare the device's logits with"
                     " the reference's; recalibrate (hil calibrate --force) only when the"
                     " precision or the stack changed.")
        first = problems[0][0] if problems else None
        at = None
        if first is not None:
            at = next((i for i, v in enumerate(first.kl) if not v <= self.policy.limit), None)
        return Verdict.failed(check, why, at=at, details="\n".join(lines))


def compare_distributions(ref: Trace, dev: Trace, policy: DistributionPolicy,
                          forced: bool = False) -> DistributionComparison:
    """Free run (``dev.requests``) or teacher-forced (``dev.forced``) against the reference;
    requests the device did not produce are left to token equality."""
    runs = dev.forced if forced else dev.requests
    reqs = []
    for rid, r in ref.requests.items():
        if rid in runs:
            d = request_distances(r, runs[rid], forced)
            d.request_id = rid
            reqs.append(d)
    return DistributionComparison(dev.target, policy, reqs,
                                  run="teacher-forced" if forced else "free run")
