"""KL(reference || device) from two top-k tables: a lower bound, computed exactly.

A trace keeps, per position, only a top-k table of log-probabilities (the k most likely
tokens over the full vocabulary, plus the step's own token). The full KL divergence cannot
be computed from two such tables; this module computes the largest quantity that is
guaranteed not to exceed it, so a value over a threshold is evidence, never an artefact of
the estimate:

* The partition. The reference's recorded tokens, one bucket each, and one "other" bucket
  for the rest of the vocabulary. Each side's "other" mass is 1 minus its mass on the
  reference's tokens. KL over a coarser partition never exceeds the full KL (the
  data-processing inequality), so this is a lower bound when both sides' masses are known.
* Tokens the device did not record. Their device probability is unknown but bounded: at
  most the device's smallest recorded probability among its other entries (the table holds
  its top-k, so an unrecorded token is not more likely than the k-th). The estimate takes
  the device masses within those bounds that make the KL smallest (water-filling:
  proportional to the reference's masses, clipped at the bound), so it stays a lower bound.
* Rounding. Masses come from float32 log-probabilities, good to about 1e-6; a device mass
  below ``MASS_RESOLUTION`` counts as that much, which only lowers the estimate (a confident
  model's "other" bucket is 1 - 0.9999999, zero or negative after rounding).
* Tokens the device recorded that the reference did not fall in "other" on both sides; a
  device that moves mass onto them shows as mass missing from the reference's tokens.

Both the calibration (``harness.calibration.metrics``: the ``kl_topk`` metric, on tables cut
from full distributions the way a trace records them) and the distribution check
(``harness.checks.distribution``) use this one function, so the calibrated threshold and
the checked value are the same estimate. Pure Python: no torch.
"""

from __future__ import annotations

import math

# Probabilities below this count as zero mass (log-probabilities of -inf and underflow).
_TINY = 1e-300
# The resolution of a mass summed from float32 log-probabilities: a device mass below it (an
# "other" bucket left by subtraction, a confident model's 1 - 0.9999999) counts as this much.
MASS_RESOLUTION = 1e-6


def unrecorded_bound(table: dict[int, float], own_token: int | None) -> float:
    """The largest probability a token missing from ``table`` can have.

    ``table`` is a top-k table plus the step's own token, which may rank below the k-th
    (a teacher-forced step). Leaving the own token out, the smallest entry is at least the
    k-th probability, which no unrecorded token exceeds. An empty remainder bounds nothing
    (1.0)."""
    rest = [lp for t, lp in table.items() if t != own_token]
    return min(1.0, math.exp(min(rest))) if rest else 1.0


def _fill(ref_missing: list[float], ref_other: float, mass: float, bound: float) -> list[float]:
    """Device masses for the missing tokens that minimise the KL: ``mass`` (what the device
    has left for them and "other") spread in proportion to the reference's masses, each
    missing token clipped at ``bound``; returns the missing tokens' masses then "other"'s."""
    order = sorted(range(len(ref_missing)), key=lambda i: -ref_missing[i])
    clipped = 0
    while True:
        free = sum(ref_missing[i] for i in order[clipped:]) + ref_other
        scale = (mass - bound * clipped) / free if free > _TINY else 0.0
        if clipped < len(order) and ref_missing[order[clipped]] * scale > bound:
            clipped += 1
            continue
        out = [0.0] * len(ref_missing)
        for rank, i in enumerate(order):
            out[i] = bound if rank < clipped else ref_missing[i] * scale
        return out + [ref_other * scale if free > _TINY else max(0.0, mass - bound * clipped)]


def _term(p: float, q: float) -> float:
    """p log(p/q) with q floored at the mass resolution (a larger q only lowers the term)."""
    return 0.0 if p <= _TINY else p * math.log(p / max(q, MASS_RESOLUTION))


def topk_kl(ref: dict[int, float], dev: dict[int, float], dev_own: int | None = None) -> float:
    """A lower bound of KL(ref || dev) in nats from two tables of log-probabilities.

    ``ref`` and ``dev`` map token id -> log-probability over the full vocabulary (a trace
    step's ``top_logprobs``); ``dev_own`` is the device step's own token (excluded when
    bounding unrecorded tokens, see ``unrecorded_bound``). NaN anywhere gives inf: a
    device that returns NaN has no distribution to be near."""
    if any(math.isnan(v) for v in (*ref.values(), *dev.values())):
        return math.inf
    p = {t: math.exp(lp) for t, lp in ref.items()}
    p_other = max(0.0, 1.0 - sum(p.values()))
    known = [t for t in p if t in dev]
    missing = [t for t in p if t not in dev]
    q_known = {t: math.exp(dev[t]) for t in known}
    mass = max(0.0, 1.0 - sum(q_known.values()))
    if missing:
        bound = unrecorded_bound(dev, dev_own)
        *q_missing, q_other = _fill([p[t] for t in missing], p_other, mass, bound)
    else:
        q_missing, q_other = [], mass
    kl = sum(_term(p[t], q_known[t]) for t in known)
    kl += sum(_term(p[t], q) for t, q in zip(missing, q_missing, strict=True))
    kl += _term(p_other, q_other)
    return max(0.0, kl)
