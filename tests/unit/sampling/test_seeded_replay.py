"""The replay of a seeded request against vLLM 0.28's own seeded sampling: the same seed and the
same processed probabilities give the same tokens, step after step."""

from __future__ import annotations

import pytest
import torch

from harness.sampling.judge import judge_positions
from harness.sampling.noise import noise_protocol, replay_seeded
from harness.sampling.params import SamplingSpec
from harness.sampling.pipeline import processed_probs
from tests.unit.sampling.vllm_sampler import EOS_TOKEN_ID, Row, vllm_sample

pytest.importorskip("vllm")

SEEDS = (0, 1234, 2**31 - 1)
STEPS = 12


@pytest.mark.parametrize("vocab", (17, 64, 257))
def test_replay_equals_vllm_random_sample(vocab: int) -> None:
    from vllm.v1.sample.ops.topk_topp_sampler import random_sample

    torch.manual_seed(vocab)
    generators = {i: torch.Generator().manual_seed(seed) for i, seed in enumerate(SEEDS)}
    probs_per_step = [torch.randn(len(SEEDS), vocab).mul(2).softmax(dim=-1) for _ in range(STEPS)]
    theirs = [random_sample(p.clone(), generators).tolist() for p in probs_per_step]
    for i, seed in enumerate(SEEDS):
        ours = [r.token_id for r in replay_seeded([p[i] for p in probs_per_step], seed)]
        assert ours == [step[i] for step in theirs], f"seed {seed}"


@pytest.mark.parametrize("path", ("forward_native", "forward_cpu"))
def test_replay_equals_vllm_top_k_top_p_sampler(path: str) -> None:
    """Both CPU-reachable paths of ``TopKTopPSampler`` when every request of the batch is seeded."""
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    sampler = TopKTopPSampler()
    forward = getattr(sampler, path)
    torch.manual_seed(7)
    vocab = 100
    generators = {i: torch.Generator().manual_seed(seed) for i, seed in enumerate(SEEDS)}
    k, p = torch.tensor([5, 100, 40], dtype=torch.int32), torch.tensor([1.0, 0.7, 0.95])
    specs = [SamplingSpec(temperature=1.0, top_k=int(k[i]), top_p=float(p[i])) for i in range(3)]
    logits_per_step = [torch.randn(3, vocab) * 2 for _ in range(STEPS)]
    theirs = [forward(lg.clone(), generators, k, p)[0].tolist() for lg in logits_per_step]
    for i, seed in enumerate(SEEDS):
        probs = [processed_probs(lg[i], specs[i], [], []) for lg in logits_per_step]
        ours = [r.token_id for r in replay_seeded(probs, seed)]
        assert ours == [step[i] for step in theirs], f"row {i}, seed {seed}"


def test_teacher_forced_judgement_follows_vllm_sampler_step_by_step() -> None:
    """vLLM's ``Sampler`` generates seeded requests with every parameter; judging its tokens
    with the reference's logits agrees at every position, and margins are reported."""
    torch.manual_seed(3)
    vocab = 64
    specs = [
        SamplingSpec(temperature=0.8, top_k=20, top_p=0.9, seed=11),
        SamplingSpec(
            temperature=1.3, min_p=0.05, repetition_penalty=1.3, presence_penalty=0.5, seed=12
        ),
        SamplingSpec(
            temperature=1.0,
            frequency_penalty=0.8,
            logit_bias=((3, 2.0),),
            bad_words=((5, 6),),
            min_tokens=6,
            stop_token_ids=(9,),
            eos_token_ids=(EOS_TOKEN_ID,),
            seed=13,
        ),
    ]
    rows = [Row(s, [1, 5, 6, 3, 3], [], torch.Generator().manual_seed(s.seed or 0)) for s in specs]
    logits_per_step = []
    for _ in range(STEPS):
        logits = torch.randn(len(rows), vocab) * 2
        tokens, _ = vllm_sample(rows, logits)
        logits_per_step.append(logits)
        for row, token in zip(rows, tokens, strict=True):
            row.output_ids.append(token)
    for i, row in enumerate(rows):
        judged = judge_positions(
            [lg[i] for lg in logits_per_step], row.spec, row.prompt_ids, row.output_ids
        )
        assert [j.reference_token for j in judged] == row.output_ids, f"row {i}"
        assert all(j.agrees and j.replay is not None and 0 <= j.replay.margin <= 1 for j in judged)


def test_replay_draws_vllms_noise_bit_for_bit() -> None:
    """The ``p / q`` score of each draw equals the one vLLM's own noise gives (same dtype, same
    stream): a margin for a near-tie rule is only meaningful on the same numbers."""
    from vllm.v1.sample.ops.topk_topp_sampler import empty_exponential_noise_like

    torch.manual_seed(5)
    probs = [torch.randn(1, 300).mul(2).softmax(dim=-1) for _ in range(STEPS)]
    generator = torch.Generator().manual_seed(99)
    theirs = []
    for p in probs:
        q = empty_exponential_noise_like(p, use_fp64_gumbel=False)
        q[0].exponential_(generator=generator)
        theirs.append(float((p / q).max()))
    assert [r.score for r in replay_seeded([p[0] for p in probs], 99)] == theirs


def test_a_different_seed_gives_different_tokens() -> None:
    """The replay depends on the seed (it would pass vacuously otherwise)."""
    torch.manual_seed(0)
    probs = [torch.randn(50).softmax(dim=-1) for _ in range(STEPS)]
    assert [r.token_id for r in replay_seeded(probs, 1)] != [
        r.token_id for r in replay_seeded(probs, 2)
    ]


def test_stacks_nobody_read_are_unknown() -> None:
    assert noise_protocol("default").replayable and noise_protocol("spyre-1.10").replayable
    for stack in ("canary", "legacy-spyre-0.4", "no-such-stack"):
        protocol = noise_protocol(stack)
        assert not protocol.replayable and protocol.note.startswith("unknown")


def test_vllm_cpu_forward_ignores_a_seed_beside_an_unseeded_request() -> None:
    """Pins the default stack's fact that docs/sampling.md states: on the CPU platform
    (``forward_cpu``) the per-request generators are used only when every row has one; beside an
    unseeded row the seeded row is drawn from the global generator. If this starts failing, vLLM
    changed and the declared protocol must be read again."""
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    forward = TopKTopPSampler().forward_cpu
    logits = torch.zeros(2, 1000)

    def seeded_row_tokens(global_seed: int, all_seeded: bool) -> list[int]:
        torch.manual_seed(global_seed)
        generators = {0: torch.Generator().manual_seed(1234)}
        if all_seeded:
            generators[1] = torch.Generator().manual_seed(5)
        return [int(forward(logits.clone(), generators, None, None)[0][0]) for _ in range(5)]

    assert seeded_row_tokens(0, all_seeded=True) == seeded_row_tokens(1, all_seeded=True)
    assert seeded_row_tokens(0, all_seeded=False) != seeded_row_tokens(1, all_seeded=False)
