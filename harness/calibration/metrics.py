"""Per-position distances between a reduced-precision forward pass and the fp32 one.

Both passes see the same token ids (the prompt, then the fp32 reference's greedy
continuation: teacher-forced), so every position compares two distributions over the same
history. Per position, with ``p`` the fp32 distribution, ``q`` the reduced-precision one
(its logits cast to fp32 before the softmax, as an engine computes logprobs) and ``t`` the
reference's token:

* ``chosen_logprob``: |log q(t) - log p(t)|, what ``harness.checks.logprobs`` compares;
* ``kl_full``: KL(p || q) over the full vocabulary;
* ``kl_topk``: the lower bound of KL(p || q) that ``harness.calibration.topk_kl`` computes
  from the two top-k tables a trace records (the reference's top-k with k =
  ``NEAR_TIE_TOP_K``, the device's top-k plus the forced token ``t``): what the
  distribution check measures;
* ``logit_mad``: the mean absolute difference of the logits over the vocabulary;
* ``topk_prob``: the largest |q(x) - p(x)| over p's top-k tokens, the probability movement
  the near-tie rule's gap tolerance has to absorb;
* ``flip``: the reduced-precision argmax is not the fp32 argmax (a rate, not a distribution).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.calibration.topk_kl import topk_kl
from harness.core.comparison import NEAR_TIE_TOP_K

if TYPE_CHECKING:
    import torch

# The metrics with a distribution (and a threshold); ``flip`` is a rate.
METRICS = ("chosen_logprob", "kl_full", "kl_topk", "logit_mad", "topk_prob")
UNITS = {"chosen_logprob": "nats", "kl_full": "nats", "kl_topk": "nats", "logit_mad": "logit",
         "topk_prob": "prob"}


def table(logp: torch.Tensor, k: int, own: int | None = None) -> dict[int, float]:
    """The top-k table a trace records from one position's log-probabilities (plus ``own``)."""
    import torch

    vals, idx = torch.topk(logp, k)
    out = {int(i): float(v) for v, i in zip(vals, idx, strict=True)}
    if own is not None:
        out[own] = float(logp[own])
    return out


def position_metrics(
    logits_fp32: torch.Tensor, logits_half: torch.Tensor, tokens: list[int],
    k: int = NEAR_TIE_TOP_K,
) -> dict[str, list[float]]:
    """Every metric at every position of one sequence.

    ``logits_fp32`` and ``logits_half`` are [positions, vocab] (any float dtype; both are
    cast to fp32); ``tokens`` holds the reference's token at each position. Returns metric
    name -> one value per position (``flip`` as 0.0 or 1.0)."""
    import torch

    lf = logits_fp32.float()
    lh = logits_half.float()
    if lf.shape != lh.shape or lf.shape[0] != len(tokens):
        raise ValueError(f"logits {tuple(lf.shape)} and {tuple(lh.shape)} do not match"
                         f" {len(tokens)} positions")
    lp = torch.log_softmax(lf, dim=-1)
    lq = torch.log_softmax(lh, dim=-1)
    t = torch.tensor(tokens, dtype=torch.long)
    p = lp.exp()
    chosen = (lq.gather(1, t[:, None]) - lp.gather(1, t[:, None])).abs()[:, 0]
    kl_full = torch.where(p > 0, p * (lp - lq), torch.zeros_like(p)).sum(-1).clamp_min(0.0)
    mad = (lh - lf).abs().mean(-1)
    top_idx = torch.topk(lp, k, dim=-1).indices
    topk_prob = (lq.exp().gather(1, top_idx) - p.gather(1, top_idx)).abs().amax(-1)
    flip = (lh.argmax(-1) != lf.argmax(-1)).float()
    kl_topk = [topk_kl(table(lp[i], k), table(lq[i], k, tokens[i]), tokens[i])
               for i in range(len(tokens))]
    return {
        "chosen_logprob": chosen.tolist(),
        "kl_full": kl_full.tolist(),
        "kl_topk": kl_topk,
        "logit_mad": mad.tolist(),
        "topk_prob": topk_prob.tolist(),
        "flip": flip.tolist(),
    }
