"""Each parameter binds: on a crafted logits row it changes the greedy choice (or, for the ones
greedy ignores, the sampled distribution), so a reference that ignored it would be caught.
No engine, no vLLM."""

from __future__ import annotations

import pytest
import torch

from harness.core.comparison import NearTiePolicy
from harness.sampling.judge import judge_positions
from harness.sampling.params import SamplingSpec
from harness.sampling.pipeline import greedy_choice, processed_logits, processed_probs

# Token 0 leads, 1 is a close second, 2 third; 3..7 trail.
ROW = torch.tensor([4.0, 3.8, 3.0, 1.0, 0.5, 0.2, -1.0, -2.0])
PROMPT = [0, 5]
OUTPUT = [1, 0, 0]  # token 0 twice in the output, token 1 once, token 5 only in the prompt

GREEDY_BINDING = {
    "allowed_token_ids": (SamplingSpec(allowed_token_ids=(2, 3)), 2),
    "bad_words single": (SamplingSpec(bad_words=((0,),)), 1),
    "bad_words after prefix": (SamplingSpec(bad_words=((0, 0),)), 1),
    "min_tokens": (SamplingSpec(min_tokens=4, eos_token_ids=(0,)), 1),
    "min_tokens stop ids": (SamplingSpec(min_tokens=4, stop_token_ids=(0, 1)), 2),
    "logit_bias": (SamplingSpec(logit_bias=((3, 5.0),)), 3),
    "repetition_penalty": (SamplingSpec(repetition_penalty=2.0), 2),
    "frequency_penalty": (SamplingSpec(frequency_penalty=0.3), 1),
    "presence_penalty": (SamplingSpec(presence_penalty=1.5), 2),
}


def test_the_crafted_row_takes_token_0_unconstrained() -> None:
    assert greedy_choice(ROW, SamplingSpec(), PROMPT, OUTPUT) == 0


@pytest.mark.parametrize("name", GREEDY_BINDING)
def test_greedy_parameter_changes_the_choice(name: str) -> None:
    spec, expected = GREEDY_BINDING[name]
    assert greedy_choice(ROW, spec, PROMPT, OUTPUT) == expected


def test_min_tokens_stops_binding_once_reached() -> None:
    spec = SamplingSpec(min_tokens=3, eos_token_ids=(0,))
    assert greedy_choice(ROW, spec, PROMPT, OUTPUT[:2]) == 1
    assert greedy_choice(ROW, spec, PROMPT, OUTPUT) == 0


def test_bad_word_prefix_must_end_the_output() -> None:
    spec = SamplingSpec(bad_words=((1, 0),))  # the output ends with 0, not 1
    assert greedy_choice(ROW, spec, PROMPT, OUTPUT) == 0
    assert greedy_choice(ROW, spec, PROMPT, [0, 1]) == 1


def test_repetition_counts_the_prompt_presence_does_not() -> None:
    """Token 5 is only in the prompt: repetition penalises it, presence and frequency do not."""
    row = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.05, 0.0, 0.0])
    assert greedy_choice(row, SamplingSpec(presence_penalty=2.0), [5], []) == 5
    assert greedy_choice(row, SamplingSpec(frequency_penalty=2.0), [5], []) == 5
    assert greedy_choice(row, SamplingSpec(repetition_penalty=1.2), [5], []) == 0
    assert greedy_choice(row, SamplingSpec(presence_penalty=0.1), [], [5]) == 0


def test_greedy_ignores_top_k_top_p_min_p() -> None:
    """vLLM sets them off for temperature 0 and takes the argmax before applying them."""
    plain = processed_logits(ROW, SamplingSpec(), PROMPT, OUTPUT)
    assert torch.equal(plain, ROW)


SAMPLED = SamplingSpec(temperature=1.0)


@pytest.mark.parametrize(
    ("spec", "support"),
    [
        (SamplingSpec(temperature=1.0, top_k=2), {0, 1}),
        (SamplingSpec(temperature=1.0, top_p=0.5), {0, 1}),
        (SamplingSpec(temperature=1.0, top_p=0.3), {0}),
        (SamplingSpec(temperature=1.0, min_p=0.5), {0, 1}),
        (SamplingSpec(temperature=1.0, min_p=0.3), {0, 1, 2}),
    ],
)
def test_truncation_parameters_change_the_support(spec: SamplingSpec, support: set[int]) -> None:
    probs = processed_probs(ROW, spec, [], [])
    assert set(torch.nonzero(probs).flatten().tolist()) == support
    assert float(probs.sum()) == pytest.approx(1.0)


def test_min_p_is_applied_after_temperature() -> None:
    """At temperature 2 token 2 is within min_p 0.5 of the top; at temperature 1 it is not."""
    cold = processed_probs(ROW, SamplingSpec(temperature=1.0, min_p=0.5), [], [])
    hot = processed_probs(ROW, SamplingSpec(temperature=2.0, min_p=0.5), [], [])
    assert float(cold[2]) == 0.0 and float(hot[2]) > 0.0


def test_temperature_changes_the_distribution() -> None:
    cold = processed_probs(ROW, SamplingSpec(temperature=0.5), [], [])
    hot = processed_probs(ROW, SamplingSpec(temperature=1.5), [], [])
    assert float(cold[0]) > float(processed_probs(ROW, SAMPLED, [], [])[0]) > float(hot[0])


def test_a_tiny_temperature_samples_at_0_01_it_is_not_greedy() -> None:
    spec = SamplingSpec(temperature=1e-6)
    assert not spec.is_greedy and spec.effective_temperature == 0.01
    with pytest.raises(ValueError, match="samples"):
        greedy_choice(ROW, spec, [], [])


def test_every_position_is_judged_past_a_difference() -> None:
    """The device differs at position 2; position 3 is still judged, along its tokens."""
    spec = SamplingSpec(frequency_penalty=0.5)
    rows = [ROW.clone() for _ in range(4)]
    device = [0, 1, 2, 0]
    judged = judge_positions(rows, spec, PROMPT, device)
    assert [j.position for j in judged] == [0, 1, 2, 3]
    # The frequency penalty follows the device's history: token 0 once, then 1 leads.
    assert [j.reference_token for j in judged] == [0, 1, 0, 0]
    assert [j.agrees for j in judged] == [True, True, False, True]
    third = judged[2]
    assert third.p_reference > third.p_device > 0
    step = third.reference_step
    assert step.token_id == 0 and step.rank == 1 and step.rank_of(2) == 3
    assert step.prob_of(2) == pytest.approx(third.p_device)
    assert third.p_reference - third.p_device > NearTiePolicy().prob_tol  # not a near-tie


def test_judging_refuses_missing_reference_positions_and_unseeded_sampling() -> None:
    with pytest.raises(ValueError, match="teacher-force"):
        judge_positions([ROW], SamplingSpec(), [], [0, 1])
    with pytest.raises(ValueError, match="unseeded"):
        judge_positions([ROW], SamplingSpec(temperature=1.0), [], [0])
