"""The precision desk: fp32 traces keep the flat tolerances; fp16 and bf16 traces are judged by
their precision's calibration (measured once per model and precision), unless a tolerance was
given on the command line."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from harness.calibration.thresholds import MetricThreshold, Thresholds
from harness.checks.distribution import KL_FP32
from harness.checks.logprobs import TOL_CARD, TOL_FP32
from harness.core.comparison import NearTiePolicy
from harness.scenario.catalog import Model
from harness.session.precision import PrecisionDesk, calibrated_near_tie
from harness.targets import kind_of_label

BASE = NearTiePolicy(top_k=5, prob_tol=0.05)
MODEL = Model("tiny-llama", Path("/models/tiny-llama"), "abc123", None)


def thresholds(precision: str, scale: float = 1.0) -> Thresholds:
    sample = [scale * 0.001 * i for i in range(1, 201)]
    metrics = {m: MetricThreshold.from_sample(m, sample)
               for m in ("chosen_logprob", "kl_full", "kl_topk", "logit_mad", "topk_prob")}
    return Thresholds(MODEL.content_hash, precision, {"torch": "x"}, 200, 0.0, metrics)


class Source:
    """A calibration source that counts its calls."""

    def __init__(self, scale: float = 1.0) -> None:
        self.calls: list[tuple[str, str]] = []
        self.scale = scale

    def __call__(self, model: Model, precision: str) -> dict[str, Any]:
        self.calls.append((model.label, precision))
        th = thresholds(precision, self.scale)
        return {"thresholds": th.to_dict(), "units": {"kl_topk": "nats"},
                "distributions": {"kl_topk": [0.001, 0.002]}}


def desk(source: Source, given: tuple[str, ...] = (), tol_card: float | None = None
         ) -> PrecisionDesk:
    def flat(label: str) -> NearTiePolicy:
        return kind_of_label(label).near_tie_policy(BASE, label, {b: 0.3 for b in given})

    return PrecisionDesk(BASE, flat, lambda label: kind_of_label(label).backend_of(label) in given,
                         None, tol_card, source)


def test_fp32_traces_keep_the_flat_rules_and_measure_nothing() -> None:
    src = Source()
    rules = desk(src).rules("vllm-cpu", MODEL)
    assert (rules.precision, rules.calibration) == ("fp32", None)
    assert rules.logprob.tol == TOL_FP32 and rules.logprob.band is None
    assert rules.distribution.limit == KL_FP32 and rules.near_tie.prob_tol == 0.05
    assert src.calls == []


@pytest.mark.parametrize(("label", "info", "precision"), [
    ("vllm-cpu-bf16", None, "bf16"), ("spyre-sendnn-cb", None, "fp16"),
    ("neuron", {"model_dtype": "torch.bfloat16"}, "bf16")])
def test_reduced_precision_is_judged_by_its_calibration(label: str, info: dict | None,
                                                         precision: str) -> None:
    src = Source(scale=100.0)  # topk_prob max 20: the near-tie tolerance caps at 1
    d = desk(src)
    rules = d.rules(label, MODEL, info)
    th = rules.calibration
    assert th is not None and rules.precision == precision
    lp = th.metrics["chosen_logprob"]
    assert (rules.logprob.tol, rules.logprob.band) == (lp.limit, lp.band)
    kl = th.metrics["kl_topk"]
    assert (rules.distribution.limit, rules.distribution.band) == (kl.limit, kl.band)
    assert rules.near_tie.prob_tol == 1.0 and f"calibrated {precision}" in rules.near_tie.describe()
    assert f"device {precision}" in rules.near_tie.describe()
    d.rules(label, MODEL)
    assert src.calls == [("tiny-llama", precision)]  # measured once
    used = d.used[("tiny-llama", precision)]
    assert used["model_hash"] == "abc123" and used["distributions"] == {"kl_topk": [0.001, 0.002]}
    assert used["metrics"]["kl_topk"]["limit"] == kl.limit


def test_the_near_tie_tolerance_is_twice_the_largest_movement_and_never_below_the_default() -> None:
    small = calibrated_near_tie(BASE, thresholds("fp16", scale=0.01))  # max movement 0.002
    assert small.prob_tol == 0.05
    wide = calibrated_near_tie(BASE, thresholds("bf16", scale=0.5))  # max movement 0.1
    assert wide.prob_tol == pytest.approx(0.2)
    assert "2 x the largest probability movement 0.1 of 200 positions" in wide.describe()


def test_tolerances_given_on_the_command_line_replace_the_calibrated_ones() -> None:
    rules = desk(Source(), given=("sendnn",), tol_card=0.7).rules("spyre-sendnn-cp", MODEL)
    assert rules.near_tie.prob_tol == 0.3 and rules.near_tie.source == ""
    assert rules.logprob.tol == 0.7 and rules.logprob.band is None
    assert rules.calibration is not None  # the distribution check still judges by it


def test_without_a_model_the_last_rules_of_the_label_serve_triage() -> None:
    d = desk(Source())
    flat = d.last("vllm-cpu-bf16")
    assert flat.calibration is None and flat.logprob.tol == TOL_CARD
    assert flat.distribution.limit == math.inf and "without a calibration" in flat.distribution.source
    judged = d.rules("vllm-cpu-bf16", MODEL)
    assert d.last("vllm-cpu-bf16") is judged


def test_an_engine_whose_dtype_its_inventory_decides_is_judged_by_what_it_reported() -> None:
    # A Neuron device computes in its inventory's engine.dtype (fp32 by default): the
    # trace's engine report decides, not a declaration of the kind.
    src = Source()
    d = desk(src)
    fp32 = d.rules("neuron", MODEL, {"model_dtype": "torch.float32"})
    assert (fp32.precision, fp32.calibration) == ("fp32", None)
    assert fp32.logprob.tol == TOL_FP32 and fp32.distribution.limit == KL_FP32
    assert d.rules("neuron", MODEL, {}).precision == "fp32"  # nothing reported: the default
    bf16 = d.rules("neuron", MODEL, {"model_dtype": "torch.bfloat16"})
    assert bf16.precision == "bf16" and bf16.calibration is not None
    assert "device bf16" in bf16.near_tie.describe()
    assert src.calls == [(MODEL.label, "bf16")]
    # A kind that declares its precision keeps it whatever the engine says of its config.
    assert d.rules("spyre-eager-cb", MODEL, {"model_dtype": "torch.float16"}).precision == "fp32"
