"""Teacher-forced judgement of a request along the device's tokens: at every position the
reference's processed distribution given the device's history, its choice, and where the
device's token stands in it. Every position is judged, not only up to the first difference.

The records carry a ``TokenStep`` of the reference's processed distribution, so a check applies
the project's near-tie rule (``harness.checks.tokens``, ``NearTiePolicy``) to them unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.core.comparison import NEAR_TIE_TOP_K
from harness.core.trace import TokenStep
from harness.sampling.noise import ReplayedToken, replay_seeded
from harness.sampling.params import SamplingSpec
from harness.sampling.pipeline import processed_logits


@dataclass(frozen=True)
class PositionJudgement:
    """The reference's view of one output position (0-based, prompt excluded).

    ``reference_token`` is the reference's greedy choice or, for a seeded request, its replayed
    draw; ``p_reference``/``p_device`` are the processed probabilities of the two tokens in the
    reference's distribution. ``reference_step`` holds the reference's top alternatives (and the
    device's token) as processed logprobs, for ``NearTiePolicy``. ``replay`` is set for a seeded
    request (the ``p / q`` margin for a later near-tie rule).
    """

    position: int
    reference_token: int
    device_token: int
    p_reference: float
    p_device: float
    reference_step: TokenStep
    replay: ReplayedToken | None = None

    @property
    def agrees(self) -> bool:
        """True iff the device took the reference's token."""
        return self.reference_token == self.device_token


def _reference_step(
    logprobs: torch.Tensor, chosen: int, device_token: int, top_k: int
) -> TokenStep:
    finite = int(torch.isfinite(logprobs).sum())
    top = logprobs.topk(max(1, min(top_k, finite)))
    alternatives = {int(t): float(lp) for t, lp in zip(top.indices, top.values, strict=True)}
    for token in (chosen, device_token):
        alternatives.setdefault(token, float(logprobs[token]))
    rank = 1 + int((logprobs > logprobs[chosen]).sum())
    return TokenStep(chosen, float(logprobs[chosen]), alternatives, rank)


def judge_positions(
    reference_logits: Sequence[torch.Tensor],
    spec: SamplingSpec,
    prompt_ids: Sequence[int],
    device_tokens: Sequence[int],
    top_k: int = NEAR_TIE_TOP_K,
) -> list[PositionJudgement]:
    """One judgement per device token: ``reference_logits[i]`` are the reference's raw logits
    after the prompt and ``device_tokens[:i]`` (teacher forcing), ``spec`` the request's
    parameters. A greedy request is judged against the argmax, a seeded one against the replay
    of its seed (``harness.sampling.noise``: the default stack's protocol); an unseeded sampled
    request has no per-position reference choice (a distribution test judges it)."""
    if len(reference_logits) < len(device_tokens):
        raise ValueError(
            f"judge_positions: {len(reference_logits)} reference positions for "
            f"{len(device_tokens)} device tokens; teacher-force the reference along every one"
        )
    if not spec.is_greedy and not spec.is_seeded:
        raise ValueError(
            "judge_positions: an unseeded sampled request has no reference choice per position"
        )
    processed = [
        processed_logits(reference_logits[i], spec, prompt_ids, device_tokens[:i])
        for i in range(len(device_tokens))
    ]
    logprobs = [row.log_softmax(dim=-1) for row in processed]
    replays: list[ReplayedToken | None] = [None] * len(processed)
    if spec.is_greedy:
        choices = [int(row.argmax()) for row in processed]
    else:
        assert spec.seed is not None
        replayed = replay_seeded([lp.exp() for lp in logprobs], spec.seed)
        replays = list(replayed)
        choices = [r.token_id for r in replayed]
    judgements = []
    for i, (lp, choice, replay) in enumerate(zip(logprobs, choices, replays, strict=True)):
        device_token = int(device_tokens[i])
        judgements.append(
            PositionJudgement(
                position=i,
                reference_token=choice,
                device_token=device_token,
                p_reference=math.exp(float(lp[choice])),
                p_device=math.exp(float(lp[device_token])),
                reference_step=_reference_step(lp, choice, device_token, top_k),
                replay=replay,
            )
        )
    return judgements
