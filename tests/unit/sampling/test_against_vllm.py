"""The reference's sampling pipeline against vLLM 0.28's own ``Sampler``, parameter by parameter,
on random logits (fixed seed, several vocabulary sizes) and histories with repeats."""

from __future__ import annotations

import pytest
import torch

from harness.sampling.params import SamplingSpec
from harness.sampling.pipeline import processed_logits
from tests.unit.sampling.vllm_sampler import EOS_TOKEN_ID, Row, vllm_sample

pytest.importorskip("vllm")

VOCABS = (17, 64, 257)

# One parameter at a time, greedy and sampled, then mixed; ids stay below the smallest vocab.
GREEDY_CASES = {
    "plain": SamplingSpec(),
    "repetition>1": SamplingSpec(repetition_penalty=1.7),
    "repetition<1": SamplingSpec(repetition_penalty=0.6),
    "frequency": SamplingSpec(frequency_penalty=1.3),
    "frequency<0": SamplingSpec(frequency_penalty=-0.9),
    "presence": SamplingSpec(presence_penalty=1.5),
    "presence<0": SamplingSpec(presence_penalty=-1.1),
    "logit_bias": SamplingSpec(logit_bias=((3, 5.0), (4, -7.5), (9, 2.25))),
    "bad_words": SamplingSpec(bad_words=((5,), (6, 7), (8, 6, 11), (1, 2, 3, 4))),
    "allowed_token_ids": SamplingSpec(allowed_token_ids=(0, 3, 5, 9, 12)),
    "min_tokens": SamplingSpec(min_tokens=6, stop_token_ids=(4, 7), eos_token_ids=(EOS_TOKEN_ID,)),
    "min_tokens reached": SamplingSpec(
        min_tokens=2, stop_token_ids=(4,), eos_token_ids=(EOS_TOKEN_ID,)
    ),
    "logit_bias before repetition": SamplingSpec(
        repetition_penalty=1.5, logit_bias=((1, 2.0), (5, -1.0), (10, 3.0))
    ),
    "all greedy-changing": SamplingSpec(
        repetition_penalty=1.2,
        frequency_penalty=0.4,
        presence_penalty=0.3,
        logit_bias=((1, 1.0),),
        bad_words=((6, 7),),
        allowed_token_ids=tuple(range(0, 16, 2)) + (7,),
        min_tokens=8,
        stop_token_ids=(4,),
        eos_token_ids=(EOS_TOKEN_ID,),
    ),
}
SAMPLED_CASES = {
    "temperature 1": SamplingSpec(temperature=1.0, seed=1),
    "temperature 0.3": SamplingSpec(temperature=0.3, seed=2),
    "temperature 1.9": SamplingSpec(temperature=1.9, seed=3),
    "temperature tiny (raised to 0.01)": SamplingSpec(temperature=1e-6, seed=4),
    "top_k": SamplingSpec(temperature=1.0, top_k=5, seed=5),
    "top_p": SamplingSpec(temperature=0.8, top_p=0.6, seed=6),
    "min_p": SamplingSpec(temperature=0.7, min_p=0.2, seed=7),
    "top_k top_p min_p": SamplingSpec(temperature=1.2, top_k=9, top_p=0.8, min_p=0.05, seed=8),
    "penalties sampled": SamplingSpec(
        temperature=0.9,
        repetition_penalty=1.4,
        frequency_penalty=0.7,
        presence_penalty=-0.5,
        seed=9,
    ),
    "everything sampled": SamplingSpec(
        temperature=0.6,
        top_k=7,
        top_p=0.9,
        min_p=0.01,
        repetition_penalty=1.1,
        frequency_penalty=0.2,
        presence_penalty=0.2,
        logit_bias=((3, 3.0),),
        bad_words=((6, 7),),
        min_tokens=8,
        stop_token_ids=(4,),
        eos_token_ids=(EOS_TOKEN_ID,),
        seed=10,
    ),
}

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
OUTPUT = [5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]  # repeats; ends with the bad word (6, 7)'s prefix


def _assert_same_logits(ours: torch.Tensor, theirs: torch.Tensor, label: str) -> None:
    same_inf = torch.isneginf(ours) == torch.isneginf(theirs)
    assert bool(same_inf.all()), (
        f"{label}: masked ids differ: {torch.nonzero(~same_inf).flatten().tolist()}"
    )
    finite = ~torch.isneginf(ours)
    torch.testing.assert_close(ours[finite], theirs[finite], rtol=1e-5, atol=1e-5, msg=label)


def _rows(spec: SamplingSpec, histories: int, vocab: int) -> list[Row]:
    rows = []
    for h in range(histories):
        output = OUTPUT[: 3 * h + 1] if h < histories - 1 else OUTPUT
        generator = torch.Generator().manual_seed(spec.seed) if spec.is_seeded else None
        rows.append(Row(spec, [t % vocab for t in PROMPT], list(output), generator))
    return rows


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("case", [*GREEDY_CASES, *SAMPLED_CASES])
def test_processed_logits_equal_vllm_sampler(case: str, vocab: int) -> None:
    spec = GREEDY_CASES.get(case) or SAMPLED_CASES[case]
    torch.manual_seed(vocab)
    rows = _rows(spec, histories=4, vocab=vocab)
    logits = torch.randn(len(rows), vocab) * 3
    tokens, vllm_processed = vllm_sample(rows, logits)
    for i, row in enumerate(rows):
        ours = processed_logits(logits[i], spec, row.prompt_ids, row.output_ids)
        _assert_same_logits(
            ours, vllm_processed[i], f"{case}, vocab {vocab}, history {len(row.output_ids)}"
        )
        if spec.is_greedy:
            assert tokens[i] == int(ours.argmax()), f"{case}: vLLM took {tokens[i]}"


def test_mixed_greedy_batch_equals_vllm_sampler() -> None:
    """Requests with different greedy-changing parameters side by side: no state crosses rows."""
    torch.manual_seed(0)
    specs = list(GREEDY_CASES.values())
    rows = [Row(s, PROMPT[: 3 + i % 5], OUTPUT[: 2 * i % 13]) for i, s in enumerate(specs)]
    logits = torch.randn(len(rows), 64) * 3
    tokens, vllm_processed = vllm_sample(rows, logits)
    for i, row in enumerate(rows):
        ours = processed_logits(logits[i], row.spec, row.prompt_ids, row.output_ids)
        _assert_same_logits(ours, vllm_processed[i], f"row {i}")
        assert tokens[i] == int(ours.argmax())


def test_top_k_top_p_equal_vllm_ops() -> None:
    """Both of vLLM's top-k / top-p paths (sorting, and top-k without a sort) on ties too."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    torch.manual_seed(1)
    for vocab in VOCABS:
        logits = torch.randn(6, vocab).round(decimals=1)  # rounding makes ties
        ks = [1, 2, 5, vocab // 2, vocab - 1, 3]
        ps = [1.0, 0.9, 0.5, 0.3, 0.99, 0.05]
        specs = [
            SamplingSpec(temperature=1.0, top_k=k, top_p=p) for k, p in zip(ks, ps, strict=True)
        ]
        k_tensor = torch.tensor(ks, dtype=torch.int32)
        for allow_sync in (False, True):
            theirs = apply_top_k_top_p_pytorch(
                logits.clone(), k_tensor, torch.tensor(ps), allow_sync
            )
            for i, spec in enumerate(specs):
                _assert_same_logits(
                    processed_logits(logits[i], spec, [], []), theirs[i], f"row {i}"
                )
            only_k = apply_top_k_top_p_pytorch(logits.clone(), k_tensor, None, allow_sync)
            for i, k in enumerate(ks):
                spec = SamplingSpec(temperature=1.0, top_k=k)
                _assert_same_logits(processed_logits(logits[i], spec, [], []), only_k[i], f"k {k}")
