"""The per-position metrics and the top-k KL bound on hand-made distributions."""

from __future__ import annotations

import math

import pytest
import torch

from harness.calibration.metrics import METRICS, position_metrics, table
from harness.calibration.topk_kl import MASS_RESOLUTION, topk_kl, unrecorded_bound

VOCAB = 64


def logits(seed: int, rows: int = 6, peak: float = 6.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, VOCAB, generator=g)
    x[torch.arange(rows), torch.arange(rows) * 3] += peak  # a clear favourite per row
    return x


def tokens_of(lf: torch.Tensor) -> list[int]:
    return lf.argmax(-1).tolist()


def test_identical_logits_measure_zero_everywhere() -> None:
    lf = logits(0)
    got = position_metrics(lf, lf.clone(), tokens_of(lf))
    for name in (*METRICS, "flip"):
        assert got[name] == pytest.approx([0.0] * 6, abs=1e-7), name


def test_every_distance_grows_with_the_perturbation() -> None:
    lf = logits(1)
    noise = torch.randn(lf.shape, generator=torch.Generator().manual_seed(2))
    runs = [position_metrics(lf, lf + eps * noise, tokens_of(lf)) for eps in (0.01, 0.1, 1.0)]
    for name in METRICS:
        means = [sum(r[name]) / len(r[name]) for r in runs]
        assert means[0] < means[1] < means[2], (name, means)
    # The mean absolute logit difference is exactly eps times the noise's mean magnitude.
    assert runs[1]["logit_mad"] == pytest.approx((0.1 * noise.abs().mean(-1)).tolist(), rel=1e-5)


def test_chosen_logprob_kl_and_flip_on_a_three_token_example() -> None:
    p = torch.tensor([[math.log(0.6), math.log(0.3), math.log(0.1)]])
    q = torch.tensor([[math.log(0.3), math.log(0.6), math.log(0.1)]])
    got = position_metrics(p, q, [0], k=2)
    assert got["chosen_logprob"][0] == pytest.approx(math.log(2))
    kl = 0.6 * math.log(2) + 0.3 * math.log(0.5)
    assert got["kl_full"][0] == pytest.approx(kl, rel=1e-5)
    assert got["kl_topk"][0] == pytest.approx(kl, rel=1e-5)  # top-2 and "other" are exact here
    assert got["topk_prob"][0] == pytest.approx(0.3, rel=1e-5)
    assert got["flip"] == [1.0]


def test_mismatched_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="do not match"):
        position_metrics(logits(0), logits(0)[:3], [0] * 6)


@pytest.mark.parametrize("seed", range(12))
def test_topk_kl_is_a_lower_bound_of_the_full_kl(seed: int) -> None:
    lf = logits(seed, rows=1, peak=2.0)[0]
    lh = lf + torch.randn(VOCAB, generator=torch.Generator().manual_seed(100 + seed))
    lp, lq = torch.log_softmax(lf, -1), torch.log_softmax(lh, -1)
    full = float((lp.exp() * (lp - lq)).sum())
    forced = int(lf.argmax())
    bound = topk_kl(table(lp, 5), table(lq, 5, forced), forced)
    assert 0.0 <= bound <= full + 1e-9
    assert bound > 0.0


def test_topk_kl_of_equal_tables_is_zero_and_nan_is_infinite() -> None:
    t = {1: math.log(0.7), 2: math.log(0.2), 3: math.log(0.05)}
    assert topk_kl(t, dict(t)) == pytest.approx(0.0, abs=1e-12)
    assert topk_kl(t, {**t, 2: math.nan}) == math.inf
    # A confident model whose table sums past 1 after rounding does not divide by zero.
    sure = {1: -1e-9, 2: -25.0}
    assert topk_kl(sure, {1: 0.0, 2: -26.0}) < 1e-6


def test_a_reference_favourite_the_device_did_not_record_is_bounded_by_its_kth() -> None:
    ref = {1: math.log(0.9), 2: math.log(0.05)}
    # The device's table (its top-2): token 1 is missing, so its mass is at most 0.04.
    dev = {5: math.log(0.5), 6: math.log(0.04)}
    assert unrecorded_bound(dev, 5) == pytest.approx(0.04)
    got = topk_kl(ref, dev, dev_own=5)
    # Both reference tokens get the most the device may have given them (0.04 each), the
    # rest of its mass is "other": the smallest KL the device's table allows.
    assert got == pytest.approx(0.9 * math.log(0.9 / 0.04) + 0.05 * math.log(0.05 / 0.04)
                                + 0.05 * math.log(0.05 / 0.92))
    # The device's own token is left out of the bound: a teacher-forced step's forced token
    # may rank far below the k-th.
    forced = {5: math.log(0.5), 6: math.log(0.3), 7: math.log(1e-4)}
    assert unrecorded_bound(forced, 7) == pytest.approx(0.3)


def test_masses_below_the_resolution_floor_the_device_side_only() -> None:
    ref = {1: math.log(0.5), 2: math.log(0.5)}
    dev = {1: 0.0, 2: -40.0}  # p_dev(2) ~ 4e-18: counted as the resolution, a finite term
    got = topk_kl(ref, dev)
    assert got == pytest.approx(0.5 * math.log(0.5) + 0.5 * math.log(0.5 / MASS_RESOLUTION),
                                rel=1e-6)
