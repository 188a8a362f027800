"""The distribution-distance check on hand-built traces: equal and near distributions pass, a
moved distribution fails under its own category, a trace without alternatives is a harness
problem."""

from __future__ import annotations

import math

import pytest

from harness.calibration.thresholds import MetricThreshold, Thresholds
from harness.checks.distribution import (
    DISTRIBUTION_DISTANCE,
    DISTRIBUTION_FORCED,
    DISTRIBUTION_UNRECORDED,
    KL_FP32,
    DistributionPolicy,
    compare_distributions,
    step_kl,
)
from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.report.categories import classify

PROMPT = [1, 2, 3]
TOKENS = [10, 11, 12, 13, 14, 15, 16, 17]
POLICY = DistributionPolicy(limit=0.05, band=0.005, source="test")


def step(token: int, dist: dict[int, float], own: int | None = None) -> TokenStep:
    lps = {t: math.log(p) for t, p in dist.items()}
    chosen = token if own is None else own
    return TokenStep(chosen, lps[chosen], lps)


def dist(token: int, p: float = 0.8) -> dict[int, float]:
    return {token: p, token + 50: (1 - p) * 0.5, token + 51: (1 - p) * 0.25}


def trace(target: str, dists: list[dict[int, float]], rid: str = "r0",
          tokens: list[int] | None = None) -> Trace:
    toks = tokens or TOKENS[: len(dists)]
    steps = [step(t, d) for t, d in zip(toks, dists, strict=True)]
    return Trace(target, {rid: RequestTrace(rid, PROMPT, steps)})


REF = trace("cpu-ref", [dist(t) for t in TOKENS])


def test_equal_distributions_pass() -> None:
    v = compare_distributions(REF, trace("dev", [dist(t) for t in TOKENS]), POLICY).verdict()
    assert v.ok and v.check == DISTRIBUTION_DISTANCE
    assert "8 positions of 1 requests compared" in v.why and "largest KL 0" in v.why


def test_small_noise_under_the_band_passes() -> None:
    dev = trace("dev", [dist(t, 0.805) for t in TOKENS])
    assert compare_distributions(REF, dev, POLICY).verdict().ok


def test_a_moved_distribution_fails_with_its_category() -> None:
    moved = [dist(t) for t in TOKENS]
    moved[3] = {13: 0.45, 63: 0.45, 64: 0.05}  # mass moved onto the runner-up, same argmax
    v = compare_distributions(REF, trace("spyre", moved), POLICY).verdict()
    assert not v.ok and v.check == DISTRIBUTION_DISTANCE and v.at == 3
    assert "over the limit 0.05" in v.details and "on spyre (free run)" in v.why
    assert classify("failed", v.message()) == "distribution drift"
    assert classify("failed", v.message(), check=v.check) == "distribution drift"


def test_many_positions_over_the_band_fail_the_rate() -> None:
    dev = trace("dev", [dist(t, 0.75) for t in TOKENS])  # each under the limit, over the band
    kls = [step_kl(r, d) for r, d in zip(REF.requests["r0"].steps, dev.requests["r0"].steps,
                                           strict=True)]
    assert all(POLICY.band < k < POLICY.limit for k in kls)
    v = compare_distributions(REF, dev, POLICY).verdict()
    assert not v.ok and "request r0: 8 of 8 positions over the band 0.005, 2 allowed" in v.details
    # Without a band only the limit applies.
    assert compare_distributions(REF, dev, DistributionPolicy(limit=0.05)).verdict().ok


def test_free_run_stops_at_the_first_differing_token_forced_run_goes_on() -> None:
    dists = [dist(t) for t in TOKENS]
    dists[5] = dist(99)
    toks = TOKENS[:5] + [99] + TOKENS[6:]
    dev = trace("dev", dists, tokens=toks)
    free = compare_distributions(REF, dev, POLICY)
    assert len(free.positions()) == 5 and free.verdict().ok
    forced_steps = [step(t, d, own=t if t in d else None) for t, d in
                    zip(TOKENS, [dist(t) for t in TOKENS], strict=True)]
    forced_steps[5] = TokenStep(15, math.log(0.01), {99: math.log(0.8), 149: math.log(0.1),
                                                     15: math.log(0.01)})
    dev.forced["r0"] = RequestTrace("r0", PROMPT, forced_steps)
    v = compare_distributions(REF, dev, POLICY, forced=True).verdict()
    assert not v.ok and v.at == 5 and "teacher-forced" in v.why
    assert v.check == DISTRIBUTION_FORCED and free.verdict().check == DISTRIBUTION_DISTANCE
    assert classify("failed", v.message()) == "distribution drift"


def test_nan_from_the_device_fails() -> None:
    bad = [dist(t) for t in TOKENS]
    dev = trace("dev", bad)
    steps = dev.requests["r0"].steps
    steps[2] = TokenStep(12, math.nan, {12: math.nan, 62: -2.0})
    v = compare_distributions(REF, dev, POLICY).verdict()
    assert not v.ok and "KL inf at position 2" in v.details


def test_a_device_without_alternatives_is_a_harness_problem() -> None:
    dev = trace("dev", [{t: 0.8} for t in TOKENS])
    v = compare_distributions(REF, dev, POLICY).verdict()
    assert not v.ok and v.check == DISTRIBUTION_UNRECORDED and "top-k logprobs" in v.why
    assert classify("failed", v.message(), check=v.check) == "engine crash / harness error"
    assert classify("failed", v.message()) == "engine crash / harness error"


def test_policy_from_calibrated_thresholds() -> None:
    t = MetricThreshold("kl_topk", 348, 1e-5, 2e-3, 4e-3, band=2e-3, limit=1.2e-2)
    th = Thresholds("h", "fp16", {}, 348, 0.0, {"kl_topk": t})
    p = DistributionPolicy.from_thresholds(th)
    assert (p.limit, p.band, p.allowed(16), p.allowed(348)) == (1.2e-2, 2e-3, 2, 10)
    assert "calibrated fp16, 348 positions" in p.describe()
    with pytest.raises(ValueError, match="must be >= 0"):
        DistributionPolicy(limit=-1.0)


def test_a_run_fails_the_rate_when_no_request_does() -> None:
    # Every request has 2 of 8 positions over the band (2 allowed each); the run's 20 of 80
    # are more than its allowance.
    def requests(p_over: float) -> dict[str, RequestTrace]:
        out = {}
        for i in range(10):
            ds = [dist(t, p_over if j < 2 else 0.8) for j, t in enumerate(TOKENS)]
            out[f"r{i}"] = RequestTrace(f"r{i}", PROMPT, [step(t, d) for t, d in
                                                         zip(TOKENS, ds, strict=True)])
        return out
    ref, dev = Trace("cpu-ref", requests(0.8)), Trace("dev", requests(0.75))
    v = compare_distributions(ref, dev, POLICY).verdict()
    assert not v.ok and v.at is None and "20 of 80 positions over the band 0.005" in v.why


def test_the_fp32_limit_passes_summation_noise_and_fails_a_percent_in_the_logits() -> None:
    fp32 = DistributionPolicy(KL_FP32, source="fp32")
    logits = [4.0, 2.5, 2.0, 1.0, 0.5, 0.0]

    def table(scale: float, jitter: float = 0.0) -> dict[int, float]:
        z = [x * scale + (jitter if i == 1 else 0.0) for i, x in enumerate(logits)]
        norm = math.log(sum(math.exp(x) for x in z))
        return {10 + i: x - norm for i, x in enumerate(z[:5])}

    def dev(scale: float, jitter: float = 0.0) -> Trace:
        t = table(scale, jitter)
        return Trace("dev", {"r0": RequestTrace("r0", PROMPT, [TokenStep(10, t[10], t)])})

    ref = dev(1.0)
    assert compare_distributions(ref, dev(1.0, 2e-5), fp32).verdict().ok
    moved = compare_distributions(ref, dev(1.03), fp32).verdict()
    assert not moved.ok and "KL limit 0.0001 nats (fp32)" in moved.details
