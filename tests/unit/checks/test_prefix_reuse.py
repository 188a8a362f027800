"""Prefix caching served again (harness/checks/prefix_reuse.py): the alignment rules, and
hand-built runs served as the rules give and broken one way at a time."""

from __future__ import annotations

import pytest

from harness.checks.prefix_reuse import (
    block_hit,
    check_prefix_reuse,
    check_prefix_served,
    chunk_aligned,
    shared_prefix,
)
from harness.core.trace import KvSnapshot, RequestTrace, StepRecord, TokenStep, Trace

BS, CHUNK = 64, 128
PROMPT = list(range(1000, 1400))  # 400 distinct tokens
OTHER = list(range(5000, 5400))


def test_shared_prefix_and_the_block_hit():
    assert shared_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert shared_prefix([1, 2], [1, 2, 3]) == 2
    assert block_hit(300, 300, BS) == 256  # the last token is always computed: 4 blocks, not 5
    assert block_hit(256, 256, BS) == 192  # a whole-block prompt keeps its last block
    assert block_hit(100, 250, BS) == 64
    assert block_hit(63, 250, BS) == 0


@pytest.mark.parametrize(("prompt", "cached", "taken", "chunks"), [
    (300, 256, 192, 1),  # one block of left padding: chunks 0-1 are whole hits, chunk 2 runs
    (300, 192, 192, 1),
    (300, 128, 64, 2),  # a hit inside chunk 1: it runs again
    (300, 0, 0, 3),
    (200, 192, 128, 1),  # no padding: the hit's third block sits in the last chunk
    (380, 256, 256, 1),
    (150, 128, 64, 1),
    (250, 64, 0, 2),  # half a chunk is no chunk
    (320, 192, 192, 1),
])
def test_chunk_alignment(prompt, cached, taken, chunks):
    assert chunk_aligned(cached, prompt, CHUNK, BS) == (taken, chunks)


def pool(prefix_caching=True, runner=None):
    return KvSnapshot(source="vllm-scheduler", num_blocks=36, pad_blocks=[0],
                      free_blocks=list(range(1, 36)), block_size=BS, counted_free=35,
                      prefix_caching=prefix_caching, chunk_size=CHUNK, runner_cached=runner)


def served_run(*, again_cached=256, again_ran=(44,), runner=192, prefix_caching=True,
               first_cached=0):
    """Request a (300 tokens) prefilled in 3 chunks and decoded 4 tokens; then a-again, the same
    prompt, and c, another prompt: a-again reports ``again_cached`` and runs ``again_ran``."""
    outputs = [TokenStep(9, 0.0, {9: 0.0})] * 4
    requests = {
        "a": RequestTrace("a", PROMPT[:300], outputs, finish_reason="length",
                          num_cached_tokens=first_cached, max_tokens=4),
        "a-again": RequestTrace("a-again", PROMPT[:300], outputs, finish_reason="length",
                                num_cached_tokens=again_cached, max_tokens=4),
        "c": RequestTrace("c", OTHER[:100], outputs, finish_reason="length", max_tokens=4),
    }
    steps: list[StepRecord] = []

    def step(executed, prefilled, runner_cached=None):
        steps.append(StepRecord(step=len(steps), executed=executed, prefilled=prefilled,
                                kv=[pool(prefix_caching, runner_cached)]))

    first = [64, 128, 108][: 3] if not first_cached else [300 - first_cached]
    for n in first:
        step({"a": n}, ["a"], {"a": 0})
    for _ in range(3):
        step({"a": 1}, [])
    for n in again_ran:
        step({"a-again": n}, ["a-again"], {"a-again": runner})
    for _ in range(3):
        step({"a-again": 1}, [])
    step({"c": 100}, ["c"], {"c": 0})
    for _ in range(3):
        step({"c": 1}, [])
    return Trace(target="spyre-eager-pc", requests=requests, steps=steps,
                 initial=StepRecord(step=-1, kv=[pool(prefix_caching)]))


def test_a_prompt_served_as_the_rules_give_passes():
    trace = served_run()
    verdict = check_prefix_reuse(trace)
    assert verdict.ok, verdict.details
    assert "1 of 3 requests served from the cache" in verdict.why
    assert check_prefix_served(trace).ok


def test_fewer_cached_tokens_reported_than_served():
    verdict = check_prefix_reuse(served_run(again_cached=192))  # it still ran only 44
    assert verdict.check == "kv_ledger.prefix_reuse" and verdict.at == 6
    assert verdict.why == ("prefix reuse: request a-again reports 192 cached tokens but was"
                           " served 256 from the cache: it ran only 44 of its 300 prompt tokens")
    assert "requests (prompt service):" in verdict.details and ">>" in verdict.details


def test_a_cached_block_computed_again():
    verdict = check_prefix_reuse(served_run(again_cached=192, again_ran=(108,)))
    assert ("request a-again was served 192 cached tokens where it shares 300 tokens with"
            " request a (256 in whole 64-token blocks before its last token): it computed 64"
            " tokens the cache held") in verdict.why


def test_more_cached_tokens_than_shared():
    verdict = check_prefix_reuse(served_run(again_cached=320, again_ran=(-20,)))
    assert "reports 320 cached tokens but shares only 300 with request a" in verdict.why


def test_executed_tokens_beside_the_report():
    verdict = check_prefix_reuse(served_run(again_ran=(60,)))
    assert ("request a-again ran 60 prompt tokens, but its prompt of 300 less the 256 cached"
            " leaves 44") in verdict.why


def test_a_runner_taking_other_than_chunk_alignment_allows():
    verdict = check_prefix_reuse(served_run(runner=256))
    assert ("request a-again's runner takes 256 prompt tokens from the cache, but 256 cached in"
            " 128-token chunks allow 192") in verdict.why


def test_a_prompt_run_in_more_steps_than_chunks_left():
    verdict = check_prefix_reuse(served_run(again_ran=(20, 24)))
    assert ("request a-again ran its prompt in 2 prefill steps, but with 192 tokens from the"
            " cache its runner computes 1 128-token chunks") in verdict.why


def test_without_prefix_caching_nothing_is_cached():
    verdict = check_prefix_reuse(served_run(prefix_caching=False))
    assert "reports 256 cached tokens but shares only 300 with request a" in verdict.why
    assert check_prefix_reuse(served_run(prefix_caching=False, again_cached=0,
                                         again_ran=(64, 128, 108), runner=0)).ok
    assert "prefix caching is off" in check_prefix_served(served_run(prefix_caching=False)).why


def test_a_run_that_inherited_the_cache_proves_nothing():
    trace = served_run(first_cached=256)  # the engine held a's blocks before the run
    verdict = check_prefix_served(trace)
    assert verdict.check == "full_batch.prefix_served" and not verdict.ok
    assert "a (256 tokens); the engine held their blocks from an earlier run" in verdict.why


def test_a_run_without_a_shared_prefix_proves_nothing():
    trace = served_run(again_cached=0, again_ran=(64, 128, 108), runner=0)
    trace.requests["a-again"].prompt_token_ids = OTHER[100:400]
    assert "no request shares a whole block" in check_prefix_served(trace).why


def test_a_trace_without_steps_is_unrecorded():
    trace = Trace(target="t", steps=[StepRecord(step=0)])
    assert check_prefix_reuse(trace).check == "kv_ledger.unrecorded"
