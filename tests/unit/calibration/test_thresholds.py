"""Thresholds from a synthetic sample: quantiles, the limit margin, the failure-rate allowance."""

from __future__ import annotations

import math
import random

import pytest

from harness.calibration.thresholds import (
    LIMIT_MARGIN,
    MetricThreshold,
    Thresholds,
    allowed_over,
    quantile,
)


def sample(n: int = 1000, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [rng.expovariate(100.0) for _ in range(n)]


def thresholds(values: list[float]) -> Thresholds:
    return Thresholds("h", "fp16", {"torch": "t"}, len(values), 0.01,
                      {"kl_topk": MetricThreshold.from_sample("kl_topk", values)})


def test_nearest_rank_quantiles() -> None:
    v = [float(i) for i in range(1, 101)]
    assert (quantile(v, 0.5), quantile(v, 0.99), quantile(v, 1.0)) == (50.0, 99.0, 100.0)
    assert quantile([3.0], 0.99) == 3.0
    assert math.isnan(quantile([], 0.5))


def test_band_is_the_p99_and_limit_the_margin_over_the_max() -> None:
    values = sample()
    t = MetricThreshold.from_sample("kl_topk", values)
    s = sorted(values)
    assert (t.n, t.p99, t.max) == (1000, s[989], s[-1])
    # KL is second order in a logit error: its margin is the square of the others'.
    assert t.band == t.p99 and t.limit == LIMIT_MARGIN**2 * t.max
    assert MetricThreshold.from_sample("chosen_logprob", values).limit == LIMIT_MARGIN * t.max
    assert sum(v > t.band for v in values) == 10  # 1 % of the sample over the band
    assert MetricThreshold.from_dict(t.to_dict()) == t


def test_allowance_is_the_binomial_tail() -> None:
    assert [allowed_over(n) for n in (0, 1, 16, 60, 348)] == [0, 1, 2, 4, 10]
    # P(Binomial(16, 0.01) > 2) is below 1e-3, P(> 1) is not.
    p = [math.comb(16, k) * 0.01**k * 0.99 ** (16 - k) for k in range(17)]
    assert sum(p[3:]) <= 1e-3 < sum(p[2:])
    assert allowed_over(100_000) == pytest.approx(1100, rel=0.01)


def test_honest_noise_passes_and_shifted_noise_fails() -> None:
    th = thresholds(sample(seed=1))
    honest = sample(n=348, seed=2)
    assert th.judge("kl_topk", honest) is None
    limit = th.metrics["kl_topk"].limit
    scaled = [min(3 * v, limit) for v in honest]  # three times as far, none over the limit
    assert "positions over the band" in (th.judge("kl_topk", scaled) or "")
    spike = honest[:10] + [limit * 1.01] + honest[10:]
    why = th.judge("kl_topk", spike) or ""
    assert "at position 10 over the limit" in why
    assert th.judge("kl_topk", [math.nan]) is not None


def test_thresholds_round_trip() -> None:
    th = thresholds(sample())
    assert Thresholds.from_dict(th.to_dict()) == th
