"""Prefix reuse from everything the run computed (harness/checks/prefix_reuse.py with
harness/checks/computed.py): an aborted request's output tokens it had run, and a preempted
request's tokens computed again, served to a later prompt as vLLM caches them."""

from __future__ import annotations

from harness.checks.computed import ComputedTokens
from harness.checks.prefix_reuse import PREFIX_REUSE, check_prefix_reuse
from harness.core.trace import KvSnapshot, RequestTrace, StepRecord, TokenStep, Trace

BS = 64
R0_PROMPT = list(range(1000, 1063))  # 63 tokens: its first block fills with its first output
R0_OUTPUT = list(range(2000, 2011))  # 11 tokens sampled at steps 0-10, aborted before step 11
TAIL = list(range(7000, 7036))


def pool() -> KvSnapshot:
    return KvSnapshot(source="vllm-scheduler", num_blocks=40, pad_blocks=[0],
                      free_blocks=list(range(1, 40)), block_size=BS, counted_free=39,
                      prefix_caching=True)


def outputs(tokens: list[int]) -> list[TokenStep]:
    return [TokenStep(t, 0.0, {t: 0.0}) for t in tokens]


def aborted_run(*, abort_step: int = 11, later_cached: int = 64, later_prompt=None) -> Trace:
    """r0 (63-token prompt) prefilled at step 0 and decoded until the harness aborted it just
    before ``abort_step``; then r4, whose 100-token prompt starts with r0's prompt and first
    output token, reports ``later_cached`` and runs the rest of its prompt."""
    prompt = later_prompt or [*R0_PROMPT, R0_OUTPUT[0], *TAIL]
    r0 = RequestTrace("r0", R0_PROMPT, outputs(R0_OUTPUT[:abort_step]), finish_reason="abort",
                      max_tokens=40)
    r0.aborted_at = abort_step  # set apart: a trace built as the harness built it before
    r4 = RequestTrace("r4", prompt, outputs([5, 5, 5]), finish_reason="length",
                      num_cached_tokens=later_cached, max_tokens=3)
    steps = [StepRecord(step=0, executed={"r0": 63}, prefilled=["r0"], kv=[pool()])]
    steps += [StepRecord(step=s, executed={"r0": 1}, prefilled=[], kv=[pool()])
              for s in range(1, abort_step)]
    at = abort_step
    steps.append(StepRecord(step=at, aborted=["r0"], executed={"r4": len(prompt) - later_cached},
                            prefilled=["r4"], kv=[pool()]))
    steps += [StepRecord(step=at + i, executed={"r4": 1}, prefilled=[], kv=[pool()])
              for i in (1, 2)]
    trace = Trace(target="unit", requests={"r4": r4}, steps=steps)
    trace.aborted = {"r0": r0}
    return trace


def test_an_aborted_requests_output_completes_a_block_a_later_prompt_is_served():
    # r0 ran its first output token at step 1: its first 64-token block was full and cached,
    # and r4's prompt starts with those 64 tokens (the false finding of issue 55; the explorer
    # gives every prompt of its scenario, as here)
    trace = aborted_run()
    verdict = check_prefix_reuse(trace, judged=["r4"], prompts={
        "r0": R0_PROMPT, "r4": trace.requests["r4"].prompt_token_ids})
    assert verdict.ok, verdict.details


def test_a_hit_beyond_what_the_aborted_request_computed_fails():
    # r4 shares 74 tokens with r0's prompt and output, but r0 had computed only 73 of them
    # when it was aborted: one block, not two
    prompt = [*R0_PROMPT, *R0_OUTPUT[:11], *range(7000, 7076)]
    verdict = check_prefix_reuse(aborted_run(later_cached=128, later_prompt=prompt))
    assert not verdict.ok
    assert verdict.check == PREFIX_REUSE
    assert "reports 128 cached tokens but shares only 73 with request r0" in verdict.why


def test_the_output_token_sampled_last_before_the_abort_was_never_computed():
    # aborted just before step 1: r0 ran its prompt only; the token sampled at step 0 has no
    # KV, so its first block was never full and a 64-token hit is an over-report
    verdict = check_prefix_reuse(aborted_run(abort_step=1))
    assert not verdict.ok
    assert "reports 64 cached tokens but shares only 63 with request r0" in verdict.why


def test_an_aborted_request_is_not_judged_itself():
    trace = aborted_run()
    trace.aborted["r0"].num_cached_tokens = 48  # not a whole block: wrong, were it judged
    assert check_prefix_reuse(trace).ok


def test_a_preempted_request_counts_what_it_computed_once():
    # 100-token prompt, two decode steps, preempted, then served its own first block again
    # and computing the other 103 - 64 tokens: it got to 103 tokens, not 141
    computed = ComputedTokens({"p": 0}, BS)
    for n in (100, 1, 1):
        computed.ran("p", n)
    computed.preempted(["p"])
    computed.ran("p", 39)
    assert computed.high["p"] == 103
    computed.ran("p", 1)
    assert computed.high["p"] == 104


def test_a_later_prompt_sharing_a_preempted_requests_recompute():
    # p computes 102 tokens, is preempted at step 3 and recomputes from its first block at
    # step 4, where q starts after it: p has 103 tokens cached (one whole block beyond 64 is
    # not full), so q is served 64 (counting the recompute twice would expect 128)
    p_out = list(range(3000, 3040))
    p = RequestTrace("p", R0_PROMPT + TAIL + [1], outputs(p_out), finish_reason="length",
                     max_tokens=40)
    q_prompt = [*p.prompt_token_ids, *p_out[:40], *range(8000, 8060)]
    q = RequestTrace("q", q_prompt, outputs([5]), finish_reason="length",
                     num_cached_tokens=64, max_tokens=1)
    steps = [StepRecord(step=0, executed={"p": 100}, prefilled=["p"], kv=[pool()]),
             StepRecord(step=1, executed={"p": 1}, prefilled=[], kv=[pool()]),
             StepRecord(step=2, executed={"p": 1}, prefilled=[], kv=[pool()]),
             StepRecord(step=3, preempted=["p"], kv=[pool()]),
             StepRecord(step=4, executed={"p": 39, "q": len(q_prompt) - 64},
                        prefilled=["q"], kv=[pool()])]
    steps += [StepRecord(step=s, executed={"p": 1}, prefilled=[], kv=[pool()])
              for s in range(5, 42)]
    trace = Trace(target="unit", requests={"p": p, "q": q}, steps=steps)
    verdict = check_prefix_reuse(trace, judged=["q"])
    assert verdict.ok, verdict.details
