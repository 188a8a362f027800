"""Near-tie exposure: how much token equality can mean for a model.

Token equality accepts a first divergence as a near-tie when the two tokens'
probabilities are within ``prob_tol`` in both distributions (harness.checks.tokens).
On a flat model most positions are such near-ties, so a device that swaps the
top two tokens almost anywhere still passes. This module measures, from the
reference's own traces, the share of generated positions where the reference's
top-1 and top-2 probabilities are within the tolerance (the positions where a
swap would be accepted, if the device agreed it was close), and the
distribution of the top-1 probability.

Warning thresholds (``FlatnessLimits``): a model is called too flat when more
than 5 % of its positions are exposed, or when its median top-1 probability is
below 0.5. The tiny fixture models are built to pass both (fixtures.models);
a trained 8B model's greedy decode typically does too. Below them, an equality
pass says little about the device's numerics: compare logprobs as well, or use
a more confident checkpoint.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.core.comparison import NEAR_TIE_PROB_TOL
from harness.core.trace import RequestTrace, TokenStep

# NearTiePolicy's default prob_tol, the --near-tie-tol default.
DEFAULT_TOL = NEAR_TIE_PROB_TOL


@dataclass(frozen=True)
class FlatnessLimits:
    """When a model is too flat for token equality to mean much (see module docstring)."""

    max_exposure: float = 0.05
    min_median_top1: float = 0.5


def top_two(step: TokenStep) -> tuple[float, float] | None:
    """(p_top1, p_top2) from the recorded alternatives, or None when fewer than two."""
    if len(step.top_logprobs) < 2:
        return None
    first, second = sorted(step.top_logprobs.values(), reverse=True)[:2]
    return math.exp(first), math.exp(second)


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an ascending list (q in [0, 1])."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class Exposure:
    """Confidence figures of one model over its reference positions."""

    model: str
    positions: int
    exposed: int
    median_top1: float
    p10_top1: float
    p90_top1: float
    tol: float = DEFAULT_TOL
    limits: FlatnessLimits = field(default_factory=FlatnessLimits)

    @property
    def share(self) -> float:
        """Share of positions where a top-1/top-2 swap would be within the tolerance."""
        return self.exposed / self.positions if self.positions else 0.0

    def warning(self) -> str | None:
        """Why equality means little on this model, or None when it is confident enough."""
        if not self.positions:
            return None
        reasons = []
        if self.share > self.limits.max_exposure:
            reasons.append(
                f"{self.share:.1%} of positions have top-1 and top-2 within {self.tol:g}"
                f" (limit {self.limits.max_exposure:.0%})"
            )
        if self.median_top1 < self.limits.min_median_top1:
            reasons.append(
                f"median top-1 probability {self.median_top1:.3f}"
                f" (limit {self.limits.min_median_top1:g})"
            )
        if not reasons:
            return None
        return (
            f"model {self.model} is too flat for token equality to mean much: "
            + "; ".join(reasons)
            + ". A device that swaps near-equal tokens passes as a near-tie there;"
            " use a more confident model or compare logprobs too."
        )

    def line(self) -> str:
        """One summary line, e.g. ``tiny-llama: 1.2% near-tie exposure ...``."""
        return (
            f"{self.model}: near-tie exposure {self.share:.1%} ({self.exposed}/{self.positions}"
            f" positions, tol {self.tol:g}); top-1 probability median {self.median_top1:.3f},"
            f" p10 {self.p10_top1:.3f}, p90 {self.p90_top1:.3f}"
        )


def exposure_of(
    model: str,
    requests: Iterable[RequestTrace],
    tol: float = DEFAULT_TOL,
    limits: FlatnessLimits | None = None,
) -> Exposure:
    """Exposure over every generated position of ``requests`` (reference traces)."""
    tally = ExposureTally(tol)
    for r in requests:
        tally.add(model, r)
    return tally.exposures(limits).get(model) or Exposure(model, 0, 0, 0.0, 0.0, 0.0, tol)


class ExposureTally:
    """Per-model top-1 probabilities and top-1/top-2 gaps, each reference request once.

    Serialisable (``to_dict``/``merge``) so pytest workers' tallies can be summed.
    """

    def __init__(self, tol: float = DEFAULT_TOL) -> None:
        self.tol = tol
        # model -> request digest -> [(p_top1, gap)] per position
        self.positions: dict[str, dict[str, list[tuple[float, float]]]] = {}

    def add(self, model: str, request: RequestTrace) -> None:
        """Count ``request``'s positions for ``model`` unless the same request was counted."""
        key = _request_digest(request)
        seen = self.positions.setdefault(model, {})
        if key in seen:
            return
        rows = []
        for step in request.steps:
            pair = top_two(step)
            if pair is not None:
                rows.append((pair[0], pair[0] - pair[1]))
        seen[key] = rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "tol": self.tol,
            "models": {
                m: {k: [[round(p, 6), round(g, 6)] for p, g in rows] for k, rows in reqs.items()}
                for m, reqs in self.positions.items()
            },
        }

    def merge(self, data: dict[str, Any]) -> None:
        """Add another tally's ``to_dict`` (e.g. another pytest worker's)."""
        for model, reqs in data.get("models", {}).items():
            seen = self.positions.setdefault(model, {})
            for key, rows in reqs.items():
                seen.setdefault(key, [(float(p), float(g)) for p, g in rows])

    def exposures(self, limits: FlatnessLimits | None = None) -> dict[str, Exposure]:
        """Exposure per model, over every counted position."""
        out = {}
        for model, reqs in self.positions.items():
            rows = [row for rs in reqs.values() for row in rs]
            if not rows:
                continue
            top1 = sorted(p for p, _ in rows)
            # The same epsilon as harness.checks.tokens: a gap exactly at tol is accepted there.
            exposed = sum(g <= self.tol + 1e-12 for _, g in rows)
            out[model] = Exposure(
                model=model,
                positions=len(rows),
                exposed=exposed,
                median_top1=statistics.median(top1),
                p10_top1=_quantile(top1, 0.1),
                p90_top1=_quantile(top1, 0.9),
                tol=self.tol,
                limits=limits or FlatnessLimits(),
            )
        return out


def _request_digest(request: RequestTrace) -> str:
    digest = hashlib.sha256()
    digest.update(repr((list(request.prompt_token_ids), request.token_ids)).encode())
    return digest.hexdigest()[:16]


def exposure_lines(tally_dicts: Iterable[dict[str, Any]]) -> list[str]:
    """Summary lines (figures, then warnings) from workers' ``ExposureTally.to_dict`` files."""
    tally: ExposureTally | None = None
    for data in tally_dicts:
        if tally is None:
            tally = ExposureTally(float(data.get("tol", DEFAULT_TOL)))
        tally.merge(data)
    if tally is None:
        return []
    exposures = tally.exposures()
    lines = [e.line() for e in exposures.values()]
    lines += [f"WARNING: {w}" for e in exposures.values() if (w := e.warning())]
    return lines
