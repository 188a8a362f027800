"""Block boundaries on hand-built traces: a request holds ceil(tokens / block size) blocks."""

from __future__ import annotations

from harness.checks.boundaries import BLOCK_BOUNDARY, check_blocks_follow_tokens
from harness.core.trace import SOURCE_VLLM_SCHEDULER, KvSnapshot, StepRecord, Trace


def step(n: int, executed: dict[str, int], owned: dict[str, list[int]],
         preempted: tuple[str, ...] = ()) -> StepRecord:
    snap = KvSnapshot(source=SOURCE_VLLM_SCHEDULER, num_blocks=16, pad_blocks=[0], owned=owned)
    return StepRecord(step=n, executed=executed, preempted=list(preempted), kv=[snap])


def test_blocks_that_follow_the_tokens_pass() -> None:
    trace = Trace("vllm-cpu", steps=[
        step(0, {"r0": 16}, {"r0": [1]}),  # 16 tokens: one block, exactly full
        step(1, {"r0": 1}, {"r0": [1, 2]}),  # 17: two
        step(2, {}, {}),  # finished: owns nothing
    ])
    verdict = check_blocks_follow_tokens(trace, 16)
    assert verdict.ok and verdict.check == BLOCK_BOUNDARY


def test_one_block_too_many_on_an_edge_is_named() -> None:
    trace = Trace("vllm-cpu", steps=[step(0, {"r0": 32}, {"r0": [1, 2, 3]})])
    verdict = check_blocks_follow_tokens(trace, 16)
    assert not verdict.ok and verdict.at == 0
    assert verdict.why == ("block boundary: after step 0 request r0 holds 3 blocks [1, 2, 3] for"
                           " 32 tokens in the KV cache, ceil(32/16) = 2 needed: 1 block too many"
                           " at an exact multiple of the 16-token block")


def test_one_block_too_few_past_an_edge_is_named() -> None:
    trace = Trace("vllm-cpu", steps=[step(0, {"r0": 33}, {"r0": [1, 2]})])
    verdict = check_blocks_follow_tokens(trace, 16)
    assert not verdict.ok and "1 block too few at 1 past a multiple of" in verdict.why


def test_a_preempted_request_counts_its_tokens_afresh() -> None:
    trace = Trace("vllm-cpu", steps=[
        step(0, {"r0": 20}, {"r0": [1, 2]}),
        step(1, {}, {}, preempted=("r0",)),
        step(2, {"r0": 21}, {"r0": [3, 4]}),  # recomputed: 21 tokens, two blocks
    ])
    assert check_blocks_follow_tokens(trace, 16).ok


def test_nothing_to_check_is_not_a_pass() -> None:
    trace = Trace("vllm-cpu", steps=[step(0, {"r0": 5}, {})])
    verdict = check_blocks_follow_tokens(trace, 16)
    assert not verdict.ok and "nothing was checked" in verdict.why
