"""vLLM 0.28's own sampler, driven the way its model runner drives it, for the tests that hold
``harness.sampling`` to it (the harness never calls this code; only these tests do)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from harness.sampling.params import SamplingSpec

EOS_TOKEN_ID = 2


@dataclass
class Row:
    """One request of a batch: its parameters and history (its generator, when seeded)."""

    spec: SamplingSpec
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None


def vllm_params(spec: SamplingSpec):
    """The ``vllm.SamplingParams`` the harness would send, with the engine's EOS added."""
    from vllm import SamplingParams

    params = SamplingParams(**spec.to_vllm_kwargs())
    params.update_from_generation_config({}, spec.eos_token_ids[0] if spec.eos_token_ids else None)
    return params


def sampling_metadata(rows: list[Row], vocab: int):
    """``SamplingMetadata`` for ``rows`` built as ``InputBatch._make_sampling_metadata`` does."""
    from vllm.sampling_params import SamplingType
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
        MinTokensLogitsProcessor,
    )
    from vllm.v1.sample.metadata import SamplingMetadata

    params = [vllm_params(row.spec) for row in rows]
    greedy = [p.sampling_type == SamplingType.GREEDY for p in params]
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=len(rows)))
    processors = [
        MinTokensLogitsProcessor(config, torch.device("cpu"), False),
        LogitBiasLogitsProcessor(config, torch.device("cpu"), False),
        MinPLogitsProcessor(config, torch.device("cpu"), False),
    ]
    added = [
        (i, p, row.prompt_ids, row.output_ids)
        for i, (p, row) in enumerate(zip(params, rows, strict=True))
    ]
    for processor in processors:
        processor.update_state(BatchUpdate(batch_size=len(rows), removed=[], added=added, moved=[]))
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    longest = max(len(row.prompt_ids) for row in rows)
    prompts = torch.tensor([r.prompt_ids + [vocab] * (longest - len(r.prompt_ids)) for r in rows])
    allowed_mask = None
    if any(p.allowed_token_ids for p in params):
        allowed_mask = torch.zeros(len(rows), vocab, dtype=torch.bool)
        for i, p in enumerate(params):
            if p.allowed_token_ids:
                allowed_mask[i] = True
                allowed_mask[i][p.allowed_token_ids] = False
    no_penalties = all(
        p.presence_penalty == 0 and p.frequency_penalty == 0 and p.repetition_penalty == 1
        for p in params
    )
    return SamplingMetadata(
        temperature=torch.tensor(
            [0.0 if g else p.temperature for g, p in zip(greedy, params, strict=True)]
        ),
        all_greedy=all(greedy),
        all_random=not any(greedy),
        top_p=None
        if all(p.top_p == 1.0 for p in params)
        else torch.tensor([p.top_p for p in params]),
        top_k=None if all(k == vocab for k in top_k) else torch.tensor(top_k, dtype=torch.int32),
        generators={i: r.generator for i, r in enumerate(rows) if r.generator is not None},
        max_num_logprobs=-1,
        no_penalties=no_penalties,
        prompt_token_ids=prompts,
        frequency_penalties=torch.tensor([p.frequency_penalty for p in params]),
        presence_penalties=torch.tensor([p.presence_penalty for p in params]),
        repetition_penalties=torch.tensor([p.repetition_penalty for p in params]),
        output_token_ids=[row.output_ids for row in rows],
        allowed_token_ids_mask=allowed_mask,
        bad_words_token_ids={
            i: [list(w) for w in row.spec.bad_words]
            for i, row in enumerate(rows)
            if row.spec.bad_words
        },
        logitsprocs=LogitsProcessors(processors),
    )


def vllm_sample(rows: list[Row], logits: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """vLLM's ``Sampler`` on ``logits`` (``[len(rows), vocab]``): the tokens and the processed
    logits (``logprobs_mode="processed_logits"``)."""
    from vllm.v1.sample.sampler import Sampler

    metadata = sampling_metadata(rows, logits.shape[1])
    output = Sampler(logprobs_mode="processed_logits")(logits.clone(), metadata)
    assert output.logprobs_tensors is not None
    tokens = [int(t) for t in output.sampled_token_ids[:, 0]]
    return tokens, output.logprobs_tensors.logprobs
