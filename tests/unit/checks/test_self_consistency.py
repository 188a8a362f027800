"""Greedy self-consistency on hand-built traces: the device's token is its own top-1."""

from __future__ import annotations

import math

from harness.checks.self_consistency import ABS_TOL, check_self_consistency
from harness.checks.tokens import compare_traces
from harness.core.comparison import TokenOutcome
from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.core.verdict import SELF_CONSISTENCY, SELF_CONSISTENCY_UNRECORDED, Verdict
from harness.report.categories import classify
from harness.session.facade import HilSession

PROMPT = [101, 102, 103]


def step(token: int, dist: dict[int, float]) -> TokenStep:
    """A step whose top_logprobs are the log of the given probabilities."""
    lps = {t: math.log(p) for t, p in dist.items()}
    return TokenStep(token_id=token, logprob=lps[token], top_logprobs=lps)


def confident(token: int) -> TokenStep:
    return step(token, {token: 0.9, token + 50: 0.05, token + 51: 0.03})


def trace(*requests: list[TokenStep], target: str = "vllm-cpu") -> Trace:
    t = Trace(target=target)
    for i, steps in enumerate(requests):
        t.requests[f"r{i}"] = RequestTrace(f"r{i}", list(PROMPT), steps, finish_reason="length")
    return t


def test_a_trace_whose_tokens_are_their_top1_passes():
    v = check_self_consistency(trace([confident(5), confident(6), confident(7)], [confident(9)]))
    assert v.ok and v.check == SELF_CONSISTENCY
    assert "4 positions of 2 requests checked" in v.why
    assert "every chosen token is the top-1" in v.why


def test_a_chosen_runner_up_fails_naming_request_position_tokens_and_logprobs():
    close = step(456, {123: 0.49, 456: 0.50, 7: 0.01})
    close = TokenStep(123, close.top_logprobs[123], close.top_logprobs)  # chose the runner-up
    v = check_self_consistency(trace([confident(5), confident(6)], [confident(1), close]))
    assert not v.ok and v.check == SELF_CONSISTENCY and v.at == 1
    assert v.why.startswith(
        "greedy self-consistency: request r1 position 1 chose token 123 (logprob -0.7133) but"
        " the device's own top-1 is token 456 (logprob -0.6931): the sampler did not take the"
        " maximum")
    assert "1 position in 1 request on vllm-cpu" in v.why
    assert "position 1: chose 123 (-0.713350), top-1 456 (-0.693147), gap 0.0202 nats" in v.details
    assert classify("failed", v.message()) == "sampler not greedy"
    assert classify("failed", v.message(), check=v.check) == "sampler not greedy"


def test_a_tie_within_rounding_passes_and_a_gap_just_over_it_fails():
    lp = -0.6931471805599453
    exact = TokenStep(3, lp, {2: lp, 3: lp, 9: -5.0})  # an exact tie: the lower id is "top-1"
    ulps = TokenStep(3, lp, {4: lp + 2e-7, 3: lp, 9: -5.0})  # float32 rounding apart
    assert check_self_consistency(trace([exact, ulps])).ok
    over = TokenStep(3, lp, {4: lp + 10 * ABS_TOL, 3: lp, 9: -5.0})
    v = check_self_consistency(trace([over]))
    assert not v.ok and "chose token 3" in v.why and "top-1 is token 4" in v.why


def test_a_chosen_token_outside_the_recorded_topk_is_judged_by_its_own_logprob():
    outside = TokenStep(77, -3.0, {1: -0.2, 2: -1.9})
    v = check_self_consistency(trace([outside]))
    assert not v.ok and "chose token 77 (logprob -3.0000)" in v.why


def test_a_trace_without_topk_logprobs_says_it_could_not_check():
    bare = [TokenStep(5, float("nan"), {}), TokenStep(6, float("nan"), {})]
    v = check_self_consistency(trace(bare))
    assert not v.ok and v.check == SELF_CONSISTENCY_UNRECORDED
    assert "could not be checked on vllm-cpu" in v.why and "2 positions without" in v.why
    assert classify("failed", v.message(), check=v.check) == "engine crash / harness error"
    assert classify("failed", v.message()) == "engine crash / harness error"
    # Positions without logprobs beside checked ones are counted, not passed in silence.
    mixed = check_self_consistency(trace([confident(5), TokenStep(6, float("nan"), {})]))
    assert mixed.ok and "1 position without recorded logprobs not checked" in mixed.why


def test_a_sampled_run_is_not_judged():
    runner_up = TokenStep(2, math.log(0.4), {1: math.log(0.6), 2: math.log(0.4)})
    v = check_self_consistency(trace([runner_up]), greedy=False)
    assert v.ok and "not applicable" in v.why


def test_a_runner_up_the_reference_hesitates_over_is_no_near_tie():
    """The swap the near-tie rule would accept (both sides within 0.05 in probability) is
    refused when the device's own logprobs rank its token second, and the check fails."""
    ref = trace([step(10, {10: 0.50, 11: 0.48, 3: 0.02})], target="cpu-ref")
    dev_dist = {10: 0.50, 11: 0.48, 3: 0.02}
    dev = trace([TokenStep(11, math.log(0.48), {t: math.log(p) for t, p in dev_dist.items()})])
    diff = compare_traces(ref, dev).diffs[0]
    assert diff.outcome is TokenOutcome.MISMATCH
    assert "device token is not the device's own top-1 (token 10" in diff.detail
    assert not check_self_consistency(dev).ok
    # The same divergence with the device's token its own top-1 stays a near-tie.
    honest = trace([step(11, {11: 0.50, 10: 0.48, 3: 0.02})])
    assert compare_traces(ref, honest).diffs[0].outcome is TokenOutcome.NEAR_TIE
    assert check_self_consistency(honest).ok


def test_the_session_puts_a_failed_self_consistency_before_token_equality():
    """``hil.check_tokens`` returns this verdict when it failed (with the token-equality outcome
    appended), and leaves token equality alone where it held or there is nothing to check."""
    tokens = Verdict.passed("token_equality", "1 request: 1 near-tie")
    swapped = TokenStep(11, math.log(0.48), {10: math.log(0.5), 11: math.log(0.48)})
    v = HilSession._self_consistency(trace([swapped]), tokens)
    assert v is not None and not v.ok and v.check == SELF_CONSISTENCY
    assert v.details.endswith("token equality against the reference: 1 request: 1 near-tie")
    assert HilSession._self_consistency(trace([confident(5)]), tokens) is None
    assert HilSession._self_consistency(trace([TokenStep(5, float("nan"), {})]), tokens) is None
