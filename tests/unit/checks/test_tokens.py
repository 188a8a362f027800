"""Token comparison on hand-built traces."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from harness.checks.tokens import compare_request, token_verdict
from harness.checks.tokens import compare_traces as compare
from harness.core.comparison import NearTiePolicy, TokenDiff, TokenOutcome, TraceComparison
from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.render.token_diff import render_comparison


class Rendered:
    """A comparison together with what its text is rendered with."""

    def __init__(self, cmp: TraceComparison, decode: Callable[[list[int]], str] | None,
                 prompts: dict[str, str] | None) -> None:
        self.cmp, self.decode, self.prompts = cmp, decode, prompts

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cmp, name)

    def report(self) -> str:
        return render_comparison(self.cmp, self.decode, self.prompts)


def compare_traces(ref: Trace, dev: Trace, policy: NearTiePolicy | None = None,
                   decode: Callable[[list[int]], str] | None = None,
                   prompts: dict[str, str] | None = None) -> Rendered:
    return Rendered(compare(ref, dev, policy or NearTiePolicy()), decode, prompts)

VOCAB = {i: f"w{i}" for i in range(200)}
PROMPT = [101, 102, 103]


def decode(ids: list[int]) -> str:
    return "".join(f" {VOCAB[i]}" for i in ids)


def step(token: int, dist: dict[int, float]) -> TokenStep:
    """A step whose top_logprobs are the log of the given probabilities."""
    assert token in dist
    lps = {t: math.log(p) for t, p in dist.items()}
    return TokenStep(token_id=token, logprob=lps[token], top_logprobs=lps)


def confident(token: int) -> TokenStep:
    return step(token, {token: 0.9, token + 50: 0.05, token + 51: 0.03})


def request(
    steps: list[TokenStep], rid: str = "r0", finish: str | None = "length"
) -> RequestTrace:
    return RequestTrace(rid, list(PROMPT), steps, finish_reason=finish)


def diverging(
    pos: int, ref_dist: dict[int, float], dev_dist: dict[int, float]
) -> tuple[RequestTrace, RequestTrace]:
    """Ref picks token 7 and dev token 8 at ``pos``; both agree on tokens before."""
    prefix = [confident(10 + i) for i in range(pos)]
    tail = [confident(60), confident(61)]
    ref = request([*prefix, step(7, ref_dist), *tail])
    dev = request([*prefix, step(8, dev_dist), *tail])
    return ref, dev


# Within the default policy: gaps 0.02 (ref) and 0.01 (dev), both ranks 2.
TIE_REF = {7: 0.40, 8: 0.38, 9: 0.10}
TIE_DEV = {8: 0.40, 7: 0.39, 9: 0.10}


def test_exact_pass() -> None:
    ref = request([confident(1), confident(2), confident(3)])
    dev = request([confident(1), confident(2), confident(3)])
    d = compare_request(ref, dev)
    assert d.outcome is TokenOutcome.EXACT and d.ok
    assert d.position is None and d.num_compared == 3
    cmp = compare_traces(Trace("cpu", {"r0": ref}), Trace("spyre", {"r0": dev}))
    assert cmp.ok and not cmp.failures and not cmp.near_ties
    assert cmp.summary() == "1 request: 1 exact, 0 near-ties, 0 mismatched"
    assert not cmp.report().startswith(("token mismatch:", "near-tie accepted:"))


def test_near_tie_accepted_and_reported() -> None:
    ref, dev = diverging(3, TIE_REF, TIE_DEV)
    d = compare_request(ref, dev)
    assert d.outcome is TokenOutcome.NEAR_TIE and d.ok
    assert (d.position, d.num_compared) == (3, 4)
    assert d.dev_rank_in_ref == 2 and d.ref_rank_in_dev == 2
    assert d.ref_gap == pytest.approx(0.02) and d.dev_gap == pytest.approx(0.01)
    assert d.dev_prob_in_ref == pytest.approx(0.38)
    assert d.ref_prob_in_dev == pytest.approx(0.39)

    cmp = compare_traces(
        Trace("cpu", {"r0": ref}), Trace("spyre", {"r0": dev}), decode=decode
    )
    assert cmp.ok and cmp.near_ties == [cmp.diffs[0]] and not cmp.failures
    assert cmp.summary() == "1 request: 0 exact, 1 near-tie, 0 mismatched"
    text = cmp.report()
    first = text.splitlines()[0]
    assert first.startswith("near-tie accepted:")
    assert "'r0'" in first and "position 3" in first
    assert "top_k=5, prob_tol=0.05" in first
    assert "positions after 3 not compared" in first
    assert "token 7 ' w7'" in text and "token 8 ' w8'" in text
    assert "probability gaps: in reference 0.0200, in device 0.0100" in text
    assert "token mismatch:" not in text


def test_gap_at_tolerance_is_accepted() -> None:
    ref, dev = diverging(0, {7: 0.45, 8: 0.40}, {8: 0.45, 7: 0.40})
    assert compare_request(ref, dev).outcome is TokenOutcome.NEAR_TIE


def test_rejected_when_gap_too_big_in_reference() -> None:
    ref, dev = diverging(2, {7: 0.60, 8: 0.30}, TIE_DEV)
    d = compare_request(ref, dev)
    assert d.outcome is TokenOutcome.MISMATCH and not d.ok
    assert "gap in reference distribution 0.3000 > 0.05" in d.detail
    assert "device distribution" not in d.detail


def test_rejected_when_gap_too_big_in_device() -> None:
    ref, dev = diverging(2, TIE_REF, {8: 0.70, 7: 0.20})
    d = compare_request(ref, dev)
    assert d.outcome is TokenOutcome.MISMATCH
    assert "gap in device distribution 0.5000 > 0.05" in d.detail
    assert "reference distribution" not in d.detail


def test_rejected_when_device_token_not_in_reference_top_k() -> None:
    # Device token 8 is 6th in the reference, with both gaps within tolerance.
    ref_dist = {7: 0.12, 1: 0.11, 2: 0.11, 3: 0.10, 4: 0.10, 8: 0.09}
    ref, dev = diverging(1, ref_dist, {8: 0.30, 7: 0.29})
    d = compare_request(ref, dev)
    assert d.outcome is TokenOutcome.MISMATCH
    assert d.dev_rank_in_ref == 6 and d.ref_rank_in_dev == 2
    assert d.detail.endswith("): device token not in reference top-5")
    assert compare_request(ref, dev, NearTiePolicy(top_k=6)).ok


def test_rejected_when_token_absent_from_recorded_top_logprobs() -> None:
    ref, dev = diverging(1, {7: 0.40, 9: 0.39}, {8: 0.40, 7: 0.39})
    d = compare_request(ref, dev)
    assert d.outcome is TokenOutcome.MISMATCH
    assert d.dev_rank_in_ref is None and d.dev_logprob_in_ref is None
    cmp = compare_traces(Trace("cpu", {"r0": ref}), Trace("spyre", {"r0": dev}))
    assert "in reference distribution: not in its recorded top-2" in cmp.report()


def test_nan_probability_is_never_a_near_tie() -> None:
    ref, _ = diverging(0, TIE_REF, TIE_DEV)
    nan = TokenStep(8, float("nan"), {8: float("nan"), 7: math.log(0.4)})
    dev = request([nan, confident(60), confident(61)])
    assert compare_request(ref, dev).outcome is TokenOutcome.MISMATCH


def test_policy_arguments_change_the_outcome() -> None:
    ref, dev = diverging(2, {7: 0.50, 8: 0.40}, {8: 0.50, 7: 0.40})  # gaps 0.10
    assert compare_request(ref, dev).outcome is TokenOutcome.MISMATCH
    loose = NearTiePolicy(prob_tol=0.10)
    assert compare_request(ref, dev, loose).outcome is TokenOutcome.NEAR_TIE

    ref, dev = diverging(2, TIE_REF, TIE_DEV)  # ranks 2 on both sides
    assert compare_request(ref, dev, NearTiePolicy(top_k=2)).ok
    assert not compare_request(ref, dev, NearTiePolicy(top_k=1)).ok

    cmp = compare_traces(
        Trace("cpu", {"r0": ref}), Trace("spyre", {"r0": dev}), NearTiePolicy(top_k=1)
    )
    assert not cmp.ok
    assert "not a near-tie (top_k=1, prob_tol=0.05)" in cmp.report()


@pytest.mark.parametrize("top_k, prob_tol", [(0, 0.05), (5, -0.1), (5, 1.5)])
def test_policy_rejects_nonsense_values(top_k: int, prob_tol: float) -> None:
    with pytest.raises(ValueError):
        NearTiePolicy(top_k=top_k, prob_tol=prob_tol)


@pytest.mark.parametrize("dev_longer", [False, True])
def test_length_mismatch(dev_longer: bool) -> None:
    short = request([confident(1), confident(2)], finish="stop")
    long = request([confident(1), confident(2), confident(3)], finish="length")
    ref, dev = (short, long) if dev_longer else (long, short)
    d = compare_request(ref, dev)
    assert d.outcome is TokenOutcome.LENGTH_MISMATCH and not d.ok
    assert (d.position, d.num_compared) == (2, 2)
    assert (d.dev_token_id if dev_longer else d.ref_token_id) == 3
    assert (d.ref_token_id if dev_longer else d.dev_token_id) is None
    cmp = compare_traces(
        Trace("cpu", {"r0": ref}), Trace("neuron", {"r0": dev}), decode=decode
    )
    text = cmp.report()
    assert text.startswith("token mismatch: request 'r0' length differs")
    assert "all 2 common positions equal" in text
    assert "no token at this position" in text
    assert "(finish stop)" in text and "(finish length)" in text
    assert cmp.summary() == ("1 request: 0 exact, 0 near-ties, 1 mismatched (1 length)")


def test_missing_request() -> None:
    ref = Trace("cpu", {"a": request([confident(1)], "a"), "b": request([], "b")})
    dev = Trace("spyre", {"a": request([confident(1)], "a"), "z": request([], "z")})
    cmp = compare_traces(ref, dev, prompts={"b": "Tell me about b"})
    assert not cmp.ok
    assert [(d.request_id, d.outcome) for d in cmp.diffs] == [
        ("a", TokenOutcome.EXACT),
        ("b", TokenOutcome.MISSING),
    ]
    assert cmp.extra_request_ids == ["z"]
    text = cmp.report()
    assert text.startswith("token mismatch: request 'b' missing from spyre output")
    assert "prompt (3 tokens): 'Tell me about b'" in text
    assert "returned requests absent from the reference: 'z'" in text
    assert cmp.summary() == (
        "2 requests: 1 exact, 0 near-ties, 1 mismatched (1 missing)"
    )


def test_prompt_mismatch_is_not_compared() -> None:
    ref = request([confident(1)])
    dev = RequestTrace("r0", [101, 102, 104], [confident(1)])
    d = compare_request(ref, dev)
    assert d.outcome is TokenOutcome.PROMPT_MISMATCH and not d.ok
    assert "first difference at prompt position 2" in d.detail
    # A target that did not record prompt ids is compared on its outputs alone.
    assert compare_request(ref, RequestTrace("r0", [], [confident(1)])).ok


def mismatch_report(pos: int) -> tuple[TokenDiff, str]:
    ref, dev = diverging(pos, {7: 0.70, 8: 0.20, 9: 0.05}, {8: 0.55, 7: 0.30})
    prompt = "Once upon a time " * 20
    cmp = compare_traces(
        Trace("cpu", {"r0": ref}),
        Trace("spyre", {"r0": dev}),
        decode=decode,
        prompts={"r0": prompt},
    )
    assert not cmp.ok and cmp.failures == cmp.diffs
    return cmp.diffs[0], cmp.report()


def test_mismatch_message_contents() -> None:
    d, text = mismatch_report(10)
    lines = text.splitlines()
    assert lines[0] == (
        "token mismatch: request 'r0' at position 10 (10 positions equal before it); "
        "positions after 10 not compared"
    )
    prompt_line = next(line for line in lines if "prompt (" in line)
    assert prompt_line.startswith("  prompt (3 tokens): 'Once upon a time ")
    assert prompt_line.endswith("' ...")
    assert len(prompt_line) < 160
    assert (
        "  reference (cpu): token 7 ' w7' logprob -0.3567 (p=0.7000); "
        "in device distribution: rank 2, logprob -1.2040 (p=0.3000)"
    ) in lines
    assert (
        "  device (spyre): token 8 ' w8' logprob -0.5978 (p=0.5500); "
        "in reference distribution: rank 2, logprob -1.6094 (p=0.2000)"
    ) in lines
    # Preceding tokens are 10..19; the report shows the last 8.
    assert d.preceding_token_ids == list(range(10, 20))
    assert (
        "  last 8 of 10 preceding tokens: ids [12, 13, 14, 15, 16, 17, 18, 19] "
        "' w12 w13 w14 w15 w16 w17 w18 w19'"
    ) in lines
    assert "gap in reference distribution 0.5000 > 0.05" in text
    assert "gap in device distribution 0.2500 > 0.05" in text
    assert lines[-1] == "spyre vs cpu reference: " + (
        "1 request: 0 exact, 0 near-ties, 1 mismatched"
    )


def test_mismatch_at_position_zero_renders() -> None:
    d, text = mismatch_report(0)
    assert d.position == 0 and d.preceding_token_ids == [] and d.num_compared == 1
    assert text.startswith("token mismatch: request 'r0' at position 0 ")
    assert "preceding tokens: none (divergence at the first generated token)" in text


def test_report_without_decoder_or_prompts_shows_ids() -> None:
    ref, dev = diverging(1, {7: 0.9, 8: 0.05}, {8: 0.9, 7: 0.05})
    cmp = compare_traces(Trace("cpu", {"r0": ref}), Trace("spyre", {"r0": dev}))
    text = cmp.report()
    assert "prompt (3 tokens): ids [101, 102, 103]" in text
    assert "reference (cpu): token 7 logprob" in text
    assert "last 1 of 1 preceding tokens: ids [10]" in text


def test_broken_decoder_does_not_hide_the_failure() -> None:
    def bad(ids: list[int]) -> str:
        raise KeyError(ids[0])

    ref, dev = diverging(1, {7: 0.9, 8: 0.05}, {8: 0.9, 7: 0.05})
    cmp = compare_traces(
        Trace("cpu", {"r0": ref}), Trace("spyre", {"r0": dev}), decode=bad
    )
    text = cmp.report()
    assert text.startswith("token mismatch:")
    assert "token 7 <decode failed: KeyError(7)>" in text
    assert "prompt (3 tokens): ids [101, 102, 103]" in text


def test_failures_precede_near_ties_in_report() -> None:
    tie_ref, tie_dev = diverging(1, TIE_REF, TIE_DEV)
    bad_ref, bad_dev = diverging(1, {7: 0.9, 8: 0.05}, {8: 0.9, 7: 0.05})
    cmp = compare_traces(
        Trace("cpu", {"tie": tie_ref, "bad": bad_ref}),
        Trace("spyre", {"tie": tie_dev, "bad": bad_dev}),
    )
    heads = [
        line
        for line in cmp.report().splitlines()
        if line.startswith(("token mismatch:", "near-tie accepted:"))
    ]
    assert [h.split(":")[0] for h in heads] == ["token mismatch", "near-tie accepted"]
    assert "'r0'" not in cmp.report()


def test_token_verdict_names_the_check_the_first_position_and_the_full_text() -> None:
    ref, dev = diverging(2, {7: 0.9, 8: 0.05}, {8: 0.9, 7: 0.05})
    cmp = compare(Trace("cpu", {"r0": ref}), Trace("spyre", {"r0": dev}))
    verdict = token_verdict(cmp, decode, {"r0": "a prompt"})
    assert not verdict.ok and verdict.check == "token_equality" and verdict.at == 2
    assert verdict.why.startswith("token mismatch: request 'r0' at position 2")
    assert verdict.details == render_comparison(cmp, decode, {"r0": "a prompt"})
    assert "'a prompt'" in verdict.details and "' w8'" in verdict.details
    same = compare(Trace("cpu", {"r0": ref}), Trace("spyre", {"r0": ref}))
    assert token_verdict(same).ok and token_verdict(same).why == "1 request: 1 exact, 0 near-ties, 0 mismatched"
