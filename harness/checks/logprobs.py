"""Logprob closeness: the device's logprob of each compared token is near the reference's.

Identical greedy tokens can hide a numerics error: a confident model keeps its
argmax through a few-percent error in a kernel, while the probabilities move.
So, at every compared position (free run: the positions before the first
divergence, where both sides chose the same token after the same history;
teacher-forced run: every position), the device's log-probability of the
reference's token must be within ``tol`` (absolute, in nats) of the
reference's own. A token the device did not record at that position (outside
its top-k) counts as an infinite deviation.

Tolerances are per precision: the CPU paths compute in fp32 like the reference
and only differ by summation order, so their tolerance (``TOL_FP32``) is tight. A
card or the bf16 CPU target computes in fp16 or bf16: its policy comes from that
precision's measured noise (``harness.calibration``; ``LogprobPolicy.from_thresholds``):
no position over the calibrated limit, and no request and no run with more positions
over the calibrated band (the measured p99) than honest noise gives (``band``, ``rate``,
``alpha``). ``TOL_CARD`` is only the flat tolerance of ``--logprob-tol-card`` users and of
code that has no calibration at hand. Which backend computes in which precision is the
kind's declaration (``TargetKind.backend_precisions``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.calibration.thresholds import ALPHA, BAND_RATE, Thresholds, allowed_over
from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.core.verdict import LOGPROB_CLOSENESS, Verdict

# Absolute logprob tolerance (nats) per backend. The fp32 CPU paths measured at most
# 2.1e-5 against transformers on the tiny models; 0.01 leaves room for other checkpoints
# while a 1 % error in the logits of a confident model already moves logprobs by more.
TOL_FP32 = 0.01
# fp16/bf16 devices against the fp32 reference, when no calibration is used: rounding of
# 1e-3 relative per op adds up over the layers; vllm-spyre's own suite accepts logprob
# differences of this order. The suites judge reduced precision by calibration instead.
TOL_CARD = 0.5
# The calibration metric the reduced-precision policy comes from.
METRIC = "chosen_logprob"


@dataclass(frozen=True)
class LogprobPolicy:
    """How far the device's logprob of a compared token may be from the reference's."""

    tol: float = TOL_FP32  # no position may deviate more (the calibrated limit)
    backend: str = ""
    # The calibrated band (the measured p99): a request or the run fails with more positions
    # over it than ``rate`` per position gives with probability ``alpha``; None: no such rule.
    band: float | None = None
    rate: float = BAND_RATE
    alpha: float = ALPHA
    source: str = ""  # where the numbers came from ("calibrated bf16, 348 positions")

    def __post_init__(self) -> None:
        if not self.tol >= 0.0 or (self.band is not None and not self.band >= 0.0):
            raise ValueError(f"logprob tolerance must be >= 0, got {self.tol}"
                             f" (band {self.band})")

    @classmethod
    def from_thresholds(cls, th: Thresholds, backend: str = "") -> LogprobPolicy:
        """The policy of a reduced-precision backend from its precision's calibration."""
        t = th.metrics[METRIC]
        return cls(t.limit, backend, t.band, th.rate, th.alpha,
                   f"calibrated {th.precision}, {t.n} positions")

    def allowed(self, n: int) -> int:
        """Positions of ``n`` that may be over the band (all of them without a band)."""
        return n if self.band is None else allowed_over(n, self.rate, self.alpha)

    def describe(self) -> str:
        where = f" ({self.backend})" if self.backend else ""
        band = "" if self.band is None else f", band={self.band:.4g}"
        src = f", {self.source}" if self.source else ""
        return f"logprob tol={self.tol:.4g}{band} nats{where}{src}"


def logprob_policy(backend: str, reduced_precision: bool, tol_fp32: float | None = None,
                   tol_card: float | None = None) -> LogprobPolicy:
    """The policy for a trace of ``backend``: ``tol_fp32`` where it computes in fp32 like the
    reference, ``tol_card`` where it computes in a lower precision; None: the default."""
    if reduced_precision:
        return LogprobPolicy(TOL_CARD if tol_card is None else tol_card, backend)
    return LogprobPolicy(TOL_FP32 if tol_fp32 is None else tol_fp32, backend)


def own_logprob(step: TokenStep) -> float:
    """A step's logprob of its own token, read from its top-k table where present."""
    return step.top_logprobs.get(step.token_id, step.logprob)


@dataclass(frozen=True)
class Deviation:
    """One compared position: the reference's token and both sides' logprobs of it."""

    position: int
    token_id: int
    ref_logprob: float
    dev_logprob: float | None  # None: not among the device's recorded logprobs

    @property
    def value(self) -> float:
        """|dev - ref| in nats; inf when the device did not record the token (or NaN)."""
        if self.dev_logprob is None:
            return math.inf
        d = abs(self.dev_logprob - self.ref_logprob)
        return math.inf if math.isnan(d) else d


@dataclass
class RequestDeviations:
    """Every compared position of one request."""

    request_id: str
    deviations: list[Deviation] = field(default_factory=list)

    def largest(self) -> Deviation | None:
        return max(self.deviations, key=lambda d: d.value, default=None)

    def over(self, tol: float) -> list[Deviation]:
        return [d for d in self.deviations if not d.value <= tol]

    def over_band(self, policy: LogprobPolicy) -> list[Deviation]:
        """Positions over the policy's band, when more of them than it allows; else []."""
        if policy.band is None:
            return []
        over = self.over(policy.band)
        return over if len(over) > policy.allowed(len(self.deviations)) else []


def free_run_deviations(ref: RequestTrace, dev: RequestTrace) -> RequestDeviations:
    """Positions before the first differing token (same history, same token on both sides)."""
    out = RequestDeviations(ref.request_id)
    for pos, (r, d) in enumerate(zip(ref.steps, dev.steps, strict=False)):
        if r.token_id != d.token_id:
            break
        out.deviations.append(Deviation(pos, r.token_id, own_logprob(r),
                                        d.top_logprobs.get(r.token_id, d.logprob)))
    return out


def forced_deviations(ref: RequestTrace, forced: RequestTrace) -> RequestDeviations:
    """Every position of a teacher-forced run: the device's logprob of the reference's token."""
    out = RequestDeviations(ref.request_id)
    for pos, (r, f) in enumerate(zip(ref.steps, forced.steps, strict=False)):
        dev_lp = f.top_logprobs.get(r.token_id)
        if dev_lp is None and f.token_id == r.token_id:
            dev_lp = f.logprob
        out.deviations.append(Deviation(pos, r.token_id, own_logprob(r), dev_lp))
    return out


def _fmt(x: float) -> str:
    return "inf (token not in the device's top-k)" if math.isinf(x) else f"{x:.4g}"


@dataclass
class LogprobComparison:
    """Deviations of every request of a device trace, and the verdict on them."""

    dev_target: str
    policy: LogprobPolicy
    requests: list[RequestDeviations]
    check: str = LOGPROB_CLOSENESS
    run: str = "free run"  # "free run" or "teacher-forced"

    def largest(self) -> tuple[str, Deviation] | None:
        """The largest deviation of the trace and its request."""
        best: tuple[str, Deviation] | None = None
        for r in self.requests:
            d = r.largest()
            if d is not None and (best is None or d.value > best[1].value):
                best = (r.request_id, d)
        return best

    def num_compared(self) -> int:
        return sum(len(r.deviations) for r in self.requests)

    def _largest_text(self) -> str:
        top = self.largest()
        if top is None:
            return "no position compared"
        rid, d = top
        return f"largest deviation {_fmt(d.value)} nats at request {rid} position {d.position}"

    def _run_over_band(self) -> tuple[int, int, int] | None:
        """(positions over the band, positions compared, allowed) when the run as a whole has
        more positions over the band than honest noise gives; else None."""
        p = self.policy
        if p.band is None:
            return None
        n = self.num_compared()
        over = sum(len(r.over(p.band)) for r in self.requests)
        return (over, n, p.allowed(n)) if over > p.allowed(n) else None

    def verdict(self) -> Verdict:
        p = self.policy
        tol = p.tol
        bad = []
        for r in self.requests:
            over, what = r.over(tol), "tol"
            if not over and r.over_band(p):
                over, what = r.over_band(p), f"the band {p.band:.4g}"
            if over:
                bad.append((r, over, what))
        run_band = self._run_over_band()
        head = (f"{self.run}, {self.num_compared()} positions of {len(self.requests)} requests"
                f" compared ({p.describe()}): {self._largest_text()}")
        if not bad and run_band is None:
            return Verdict.passed(self.check, head)
        if bad:
            n = sum(len(o) for _, o, _ in bad)
            beyond = (f"beyond {tol:.4g} nats" if any(w == "tol" for _, _, w in bad) else
                      f"over the band {p.band:.4g} nats at more positions than noise allows")
            why = (f"logprobs differ from the reference {beyond} on {self.dev_target}"
                   f" ({self.run}): {n} positions in {len(bad)} requests; {self._largest_text()}")
        else:
            assert run_band is not None
            why = (f"logprobs differ from the reference over the band {p.band:.4g} nats at more"
                   f" positions than noise allows on {self.dev_target} ({self.run}):"
                   f" {run_band[0]} of {run_band[1]} positions, {run_band[2]} allowed;"
                   f" {self._largest_text()}")
        lines = [why, head, ""]
        for r, over, what in bad:
            worst = r.largest()
            assert worst is not None
            allowed = "" if what == "tol" else f", {p.allowed(len(r.deviations))} allowed"
            lines.append(f"request {r.request_id}: {len(over)} of {len(r.deviations)} positions"
                         f" over {what}{allowed}; largest {_fmt(worst.value)} at position"
                         f" {worst.position}")
            for d in over[:8]:
                dev = "?" if d.dev_logprob is None else f"{d.dev_logprob:.4f}"
                lines.append(f"  position {d.position}: token {d.token_id} reference"
                             f" {d.ref_logprob:.4f} device {dev} deviation {_fmt(d.value)}")
            if len(over) > 8:
                lines.append(f"  ... {len(over) - 8} more")
        lines.append("What to do: a numerics error on the device (kernel, dtype, layout) moves"
                     " probabilities before it flips tokens; compare its logits with the"
                     " reference's. A reduced precision is judged by its calibrated noise"
                     " (hil calibrate; --force after a precision or stack change); --logprob-tol"
                     " / --logprob-tol-card set a flat tolerance instead.")
        at = bad[0][1][0].position if bad else None
        return Verdict.failed(self.check, why, at=at, details="\n".join(lines))


def compare_logprobs(ref: Trace, dev: Trace, policy: LogprobPolicy) -> LogprobComparison:
    """Free run: the device's logprob of every token both sides chose after the same history.
    Requests the device did not produce are left to token equality."""
    reqs = [free_run_deviations(r, dev.requests[rid])
            for rid, r in ref.requests.items() if rid in dev.requests]
    for r, rid in zip(reqs, [k for k in ref.requests if k in dev.requests], strict=True):
        r.request_id = rid
    return LogprobComparison(dev.target, policy, reqs)
