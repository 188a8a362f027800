"""vLLM 0.28's sampling semantics on one row of the reference's logits, written from its source
(``v1/sample/sampler.py`` and the ops it calls) and never calling it: the reference must not share
code with the stack under test.

The order (``Sampler.forward`` -> ``apply_logits_processors`` -> ``sample``):

1. float32; 2. ``allowed_token_ids`` (every other id -> -inf); 3. bad words (output history
only); 4. min-tokens (stop and EOS ids -> -inf while fewer than ``min_tokens`` outputs), then
logit bias (added); 5. penalties: repetition over prompt + output, then frequency and presence
over the output only; 6. a greedy request takes the argmax here (temperature, min-p, top-k and
top-p never touch it); 7. a sampled request: divide by the temperature, min-p (against the
tempered probabilities), top-k, then top-p; softmax; sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.sampling.params import SamplingSpec

NEG_INF = float("-inf")


def allowed_and_banned(
    logits: torch.Tensor, spec: SamplingSpec, output_ids: Sequence[int]
) -> torch.Tensor:
    """Steps 2-4: allowed ids, bad words, min-tokens, logit bias (in place; returns ``logits``)."""
    if spec.allowed_token_ids is not None:
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep[list(spec.allowed_token_ids)] = True
        logits.masked_fill_(~keep, NEG_INF)
    for word in spec.bad_words:
        # ops/bad_words.py: the last token is banned when the output ends with the word's prefix.
        prefix = list(word[:-1])
        if len(word) > len(output_ids) + 1:
            continue
        if not prefix or list(output_ids[len(output_ids) - len(prefix) :]) == prefix:
            logits[word[-1]] = NEG_INF
    if spec.min_tokens and len(output_ids) < spec.min_tokens:
        suppressed = sorted(spec.suppressed_until_min_tokens)
        if suppressed:
            logits[suppressed] = NEG_INF
    for token_id, bias in spec.bias_by_token().items():
        logits[token_id] += bias
    return logits


def penalised(
    logits: torch.Tensor,
    spec: SamplingSpec,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
) -> torch.Tensor:
    """Step 5 (``model_executor/layers/utils.py`` apply_penalties), in place.

    Repetition: a token seen in the prompt or the output has a positive logit divided by the
    penalty and a non-positive one multiplied by it. Frequency subtracts the penalty times the
    token's count in the output; presence subtracts it once for a token the output contains.
    """
    vocab = logits.shape[0]
    if spec.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool)
        seen[list(prompt_ids) + list(output_ids)] = True
        factor = torch.where(seen, torch.tensor(spec.repetition_penalty), torch.tensor(1.0))
        logits.mul_(torch.where(logits > 0, 1.0 / factor, factor))
    if spec.frequency_penalty or spec.presence_penalty:
        counts = torch.zeros(vocab, dtype=torch.long)
        if output_ids:
            counts.scatter_add_(
                0, torch.tensor(list(output_ids)), torch.ones(len(output_ids), dtype=torch.long)
            )
        logits -= spec.frequency_penalty * counts
        logits -= spec.presence_penalty * (counts > 0)
    return logits


def tempered_and_truncated(logits: torch.Tensor, spec: SamplingSpec) -> torch.Tensor:
    """Step 7 before the draw: temperature, min-p, top-k, top-p (in place)."""
    logits.div_(spec.effective_temperature)
    if spec.min_p:
        # logits_processor/builtin.py MinPLogitsProcessor: against the tempered distribution.
        probs = logits.softmax(dim=-1)
        logits.masked_fill_(probs < probs.max() * spec.min_p, NEG_INF)
    vocab = logits.shape[0]
    top_k = spec.top_k if 0 < spec.top_k < vocab else 0
    if spec.top_p == 1.0:
        if top_k:
            # apply_top_k_top_p: everything below the k-th largest value goes (ties with it stay).
            logits.masked_fill_(logits < logits.topk(top_k).values[-1], NEG_INF)
        return logits
    # apply_top_k_top_p_pytorch: one ascending sort, top-k then top-p in sorted order (the sort
    # decides which of tied tokens survive at the top-p edge, so it is the same sort); top-p drops
    # the prefix whose cumulative probability is <= 1 - p, always keeping the largest token.
    ascending, order = logits.sort(dim=-1, descending=False)
    if top_k:
        ascending.masked_fill_(ascending < ascending[vocab - top_k], NEG_INF)
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= 1 - spec.top_p
    drop[-1] = False
    ascending.masked_fill_(drop, NEG_INF)
    logits.scatter_(0, order, ascending)
    return logits


def processed_logits(
    logits_row: torch.Tensor,
    spec: SamplingSpec,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
) -> torch.Tensor:
    """The logits vLLM samples from at one position, given the prompt and the outputs so far.

    For a greedy request they are the logits after penalties (what vLLM's argmax and its
    ``processed_logprobs`` see); for a sampled one, after temperature, min-p, top-k and top-p.
    ``logits_row`` (shape ``[vocab]``) is not modified.
    """
    logits = logits_row.detach().to(torch.float32).clone()
    allowed_and_banned(logits, spec, output_ids)
    penalised(logits, spec, prompt_ids, output_ids)
    if spec.is_greedy:
        return logits
    return tempered_and_truncated(logits, spec)


def processed_probs(
    logits_row: torch.Tensor,
    spec: SamplingSpec,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
) -> torch.Tensor:
    """``softmax`` of ``processed_logits`` in float32: the distribution vLLM samples from
    (for a greedy request, the distribution its processed logprobs describe)."""
    return processed_logits(logits_row, spec, prompt_ids, output_ids).softmax(dim=-1)


def greedy_choice(
    logits_row: torch.Tensor,
    spec: SamplingSpec,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
) -> int:
    """The token a greedy request takes (``argmax`` of the processed logits; the lowest id wins a
    tie, as ``torch.argmax`` does)."""
    if not spec.is_greedy:
        raise ValueError(
            f"greedy_choice: the request samples (temperature {spec.temperature}); "
            "use harness.sampling.noise.replay_seeded for a seeded one"
        )
    return int(processed_logits(logits_row, spec, prompt_ids, output_ids).argmax())
