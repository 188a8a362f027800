"""Token equality between a CPU reference trace and a device trace.

Greedy tokens from a device must equal the reference's, position by position.
The only accepted difference is a documented near-tie, and it is reported as
such, never hidden.

Near-tie rule (``NearTiePolicy``). Let ``N`` be the first output position where
the reference token ``r`` and the device token ``d`` differ, ``p_ref`` the
reference's distribution at ``N`` and ``p_dev`` the device's. The divergence is
a near-tie iff all of the following hold:

* ``d`` is within the reference's top ``top_k`` at ``N`` (1-based rank
  ``<= top_k`` among the recorded ``top_logprobs``);
* ``r`` is within the device's top ``top_k`` at ``N``;
* ``|p_ref(r) - p_ref(d)| <= prob_tol`` (probabilities, not logprobs);
* ``|p_dev(d) - p_dev(r)| <= prob_tol``;
* ``d`` is the device's own top-1 (``harness.checks.self_consistency``, up to float
  rounding): a greedy device that did not take its own maximum is a sampler error, not a tie.

A token missing from the recorded ``top_logprobs`` counts as outside the top-k,
so a trace that recorded fewer than ``top_k`` alternatives can only be stricter.
NaN probabilities never satisfy the gap conditions.

After a divergence the two continuations condition on different tokens, so
positions after ``N`` are not compared, whatever the verdict; results say so.
Positions are 0-based indices into the generated tokens (prompt excluded).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from harness.checks.logprobs import own_logprob
from harness.checks.self_consistency import inconsistency
from harness.core.comparison import NearTiePolicy, TokenDiff, TokenOutcome, TraceComparison
from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.core.verdict import TOKEN_EQUALITY, Verdict
from harness.render.token_diff import render_comparison

DEFAULT_POLICY = NearTiePolicy()  # the documented defaults (NEAR_TIE_TOP_K, NEAR_TIE_PROB_TOL)

# Absorbs exp/log rounding so a gap exactly at prob_tol is accepted.
_GAP_EPS = 1e-12


def _near_tie_failures(
    ref_step: TokenStep, dev_step: TokenStep, policy: NearTiePolicy
) -> list[str]:
    """Reasons the divergence at this position is not a near-tie; empty if it is."""
    r, d = ref_step.token_id, dev_step.token_id
    k = policy.top_k
    reasons = []
    dev_rank_in_ref = ref_step.rank_of(d)
    if dev_rank_in_ref is None or dev_rank_in_ref > k:
        reasons.append(f"device token not in reference top-{k}")
    ref_rank_in_dev = dev_step.rank_of(r)
    if ref_rank_in_dev is None or ref_rank_in_dev > k:
        reasons.append(f"reference token not in device top-{k}")
    off = inconsistency("", 0, dev_step)
    if off is not None:
        reasons.append(f"device token is not the device's own top-1 (token {off.top1} has"
                       f" logprob {off.top1_logprob:.4f} > {off.chosen_logprob:.4f})")
    p_ref_r, p_ref_d = math.exp(own_logprob(ref_step)), ref_step.prob_of(d)
    if p_ref_d is not None:
        gap = abs(p_ref_r - p_ref_d)
        if not gap <= policy.prob_tol + _GAP_EPS:
            reasons.append(
                f"gap in reference distribution {_fmt_p(gap)} > {policy.prob_tol:g}"
            )
    p_dev_d, p_dev_r = math.exp(own_logprob(dev_step)), dev_step.prob_of(r)
    if p_dev_r is not None:
        gap = abs(p_dev_d - p_dev_r)
        if not gap <= policy.prob_tol + _GAP_EPS:
            reasons.append(
                f"gap in device distribution {_fmt_p(gap)} > {policy.prob_tol:g}"
            )
    return reasons


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "?"
    return f"{p:.4f}" if p == 0 or p >= 1e-4 else f"{p:.2e}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word if n == 1 else word + 's'}"


def compare_request(
    ref: RequestTrace, dev: RequestTrace, policy: NearTiePolicy = DEFAULT_POLICY
) -> TokenDiff:
    """Compare one request's generated tokens; see the module docstring for rules."""
    base = {
        "request_id": ref.request_id,
        "prompt_token_ids": list(ref.prompt_token_ids),
        "ref_num_tokens": len(ref.steps),
        "dev_num_tokens": len(dev.steps),
        "ref_finish_reason": ref.finish_reason,
        "dev_finish_reason": dev.finish_reason,
    }
    # Outputs of different inputs say nothing about the device; an empty side means
    # the target did not record its prompt ids, which is not evidence of a difference.
    if (
        ref.prompt_token_ids
        and dev.prompt_token_ids
        and ref.prompt_token_ids != dev.prompt_token_ids
    ):
        first = next(
            (
                i
                for i, (a, b) in enumerate(
                    zip(ref.prompt_token_ids, dev.prompt_token_ids, strict=False)
                )
                if a != b
            ),
            min(len(ref.prompt_token_ids), len(dev.prompt_token_ids)),
        )
        return TokenDiff(
            outcome=TokenOutcome.PROMPT_MISMATCH,
            detail=(
                f"prompt token ids differ (reference {len(ref.prompt_token_ids)} "
                f"tokens, device {len(dev.prompt_token_ids)} tokens, first "
                f"difference at prompt position {first}); outputs not compared"
            ),
            **base,
        )

    ref_ids, dev_ids = ref.token_ids, dev.token_ids
    common = min(len(ref_ids), len(dev_ids))
    pos = next((i for i in range(common) if ref_ids[i] != dev_ids[i]), None)

    if pos is None:
        if len(ref_ids) == len(dev_ids):
            return TokenDiff(outcome=TokenOutcome.EXACT, num_compared=common, **base)
        longer = ref if len(ref_ids) > len(dev_ids) else dev
        step = longer.steps[common]
        side = "reference" if longer is ref else "device"
        return TokenDiff(
            outcome=TokenOutcome.LENGTH_MISMATCH,
            position=common,
            num_compared=common,
            ref_token_id=step.token_id if longer is ref else None,
            dev_token_id=step.token_id if longer is dev else None,
            ref_logprob=own_logprob(step) if longer is ref else None,
            dev_logprob=own_logprob(step) if longer is dev else None,
            ref_top_n=len(step.top_logprobs) if longer is ref else 0,
            dev_top_n=len(step.top_logprobs) if longer is dev else 0,
            preceding_token_ids=ref_ids[:common],
            detail=(
                f"all {common} common positions equal, but only the {side} "
                f"continues at position {common}"
            ),
            **base,
        )

    r_step, d_step = ref.steps[pos], dev.steps[pos]
    reasons = _near_tie_failures(r_step, d_step, policy)
    near_tie = not reasons
    return TokenDiff(
        outcome=TokenOutcome.NEAR_TIE if near_tie else TokenOutcome.MISMATCH,
        position=pos,
        num_compared=pos + 1,
        ref_token_id=r_step.token_id,
        dev_token_id=d_step.token_id,
        ref_logprob=own_logprob(r_step),
        dev_logprob=own_logprob(d_step),
        ref_logprob_in_dev=d_step.top_logprobs.get(r_step.token_id),
        dev_logprob_in_ref=r_step.top_logprobs.get(d_step.token_id),
        ref_rank_in_dev=d_step.rank_of(r_step.token_id),
        dev_rank_in_ref=r_step.rank_of(d_step.token_id),
        ref_top_n=len(r_step.top_logprobs),
        dev_top_n=len(d_step.top_logprobs),
        preceding_token_ids=ref_ids[:pos],
        detail=(
            f"within near-tie policy ({policy.describe()})"
            if near_tie
            else f"not a near-tie ({policy.describe()}): " + "; ".join(reasons)
        ),
        **base,
    )


def compare_traces(
    ref: Trace,
    dev: Trace,
    policy: NearTiePolicy = DEFAULT_POLICY,
) -> TraceComparison:
    """Compare every reference request with the device's request of the same id."""
    diffs = []
    for rid, r in ref.requests.items():
        d = dev.requests.get(rid)
        if d is None:
            diffs.append(
                TokenDiff(
                    request_id=rid,
                    outcome=TokenOutcome.MISSING,
                    prompt_token_ids=list(r.prompt_token_ids),
                    ref_num_tokens=len(r.steps),
                    ref_finish_reason=r.finish_reason,
                    detail=f"no output from {dev.target}",
                )
            )
        else:
            diff = compare_request(r, d, policy)
            # The mapping key is what paired the two requests, so it names the result.
            diff.request_id = rid
            diffs.append(diff)
    extra = [rid for rid in dev.requests if rid not in ref.requests]
    return TraceComparison(
        ref_target=ref.target,
        dev_target=dev.target,
        policy=policy,
        diffs=diffs,
        extra_request_ids=extra,
    )


def token_verdict(
    comparison: TraceComparison,
    decode: Callable[[list[int]], str] | None = None,
    prompts: dict[str, str] | None = None,
) -> Verdict:
    """The token-equality verdict of a comparison; ``decode`` and ``prompts`` only add text to it."""
    if comparison.ok:
        return Verdict.passed(TOKEN_EQUALITY, comparison.summary())
    first = comparison.failures[0]
    details = render_comparison(comparison, decode, prompts)
    return Verdict.failed(TOKEN_EQUALITY, details.splitlines()[0], at=first.position,
                          details=details)
