"""Do the thresholds bite? A measurement of a faulted model judged by calibrated thresholds.

``hil calibrate --attn-scale 1.08`` measures the reduced-precision model with every
attention layer's score scale off by 8 % (``harness.calibration.measure.scale_attention``)
and judges its positions as a run would be judged: per sequence (one request) and over all
of them (the run), by ``Thresholds.judge``. Honest noise passes both; a fault that matters
must fail.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.calibration.measure import Measurement
from harness.calibration.metrics import METRICS
from harness.calibration.thresholds import Thresholds, quantile


@dataclass(frozen=True)
class Judged:
    """One metric of a measurement against its thresholds."""

    metric: str
    n: int
    p50: float
    p99: float
    max: float
    over_band: int
    over_limit: int
    allowed: int  # positions of the run allowed over the band
    requests_failed: int
    requests: int
    run_failed: bool


def split(values: list[float], lengths: list[int]) -> list[list[float]]:
    """Per-position values cut into sequences of the given lengths."""
    out, start = [], 0
    for n in lengths:
        out.append(values[start:start + n])
        start += n
    return out


def judge_measurement(m: Measurement, th: Thresholds) -> list[Judged]:
    """Every metric of ``m`` judged per sequence and over the run."""
    out = []
    for name in METRICS:
        t = th.metrics[name]
        values = m.values[name]
        v = sorted(values)
        per_request = split(values, m.lengths)
        out.append(Judged(
            name, len(v), quantile(v, 0.5), quantile(v, 0.99), v[-1] if v else float("nan"),
            sum(x > t.band for x in v), sum(not x <= t.limit for x in v),
            th.allowed_over(len(v)),
            sum(th.judge(name, r) is not None for r in per_request), len(per_request),
            th.judge(name, values) is not None))
    return out
