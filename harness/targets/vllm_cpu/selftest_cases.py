"""vllm-cpu's ``hil selftest`` cases: each fault on vLLM's CPU engine, with the smallest
selection that must catch it (the selections tests/test_*faults*.py prove, one test each)."""

from __future__ import annotations

from harness.targets.selftest_case import (
    CAPACITY,
    FREEING,
    GEOMETRY,
    NO_RECOMPUTE,
    ONE_TOKEN_TEST,
    TOKEN,
    Case,
    vllm_cases,
)

CASES: tuple[Case, ...] = (
    *vllm_cases("vllm-cpu"),
    Case("kernel-drift", "vllm-cpu", TOKEN, ONE_TOKEN_TEST, "logprob drift"),
    # An 8 % attention-scale error inside the model: on the bf16 target, judged by the
    # calibrated bf16 noise, the distribution check is the first to see it.
    Case("attn-scale:factor=1.08", "vllm-cpu-bf16", TOKEN, ONE_TOKEN_TEST, "distribution drift"),
    # On tiny-llama the block-edge case meets a near-tie the free run accepts, and the drift
    # three steps later flips the teacher-forced run's token.
    Case("drift-after-near-tie", "vllm-cpu", TOKEN, "block-edge", "token mismatch"),
    # The long prompt's top two come within 0.5 nats at position 13 on tiny-llama.
    Case("runner-up-when-close", "vllm-cpu", TOKEN, "long-prompt", "sampler not greedy"),
    # Bugs that show under one condition of a run only (the conditions triage varies).
    Case("mix-batch-rows", "vllm-cpu", TOKEN, "pair", "token mismatch"),
    Case("stale-recycled-block", "vllm-cpu", FREEING, "over-max-num-seqs", "token mismatch"),
    Case("flaky-logit", "vllm-cpu", TOKEN, ONE_TOKEN_TEST, "token mismatch"),
    Case("forget-free-each", "vllm-cpu", FREEING, "finish-back-to-idle", "block leak"),
    Case("abort-keeps-blocks", "vllm-cpu", FREEING, "aborted-request", "block leak"),
    # The one-block-per-sequence geometry's test (its -k names it by what it checks).
    Case("kv-blocks-short:by=1", "vllm-cpu", NO_RECOMPUTE, "one_block_more and 4", "recompute"),
    Case("block-too-many", "vllm-cpu", CAPACITY, "device_decided", "recompute"),
    Case("block-too-few", "vllm-cpu", CAPACITY, "one_block_below", "recompute"),
    Case("block-too-many-at-edge", "vllm-cpu", NO_RECOMPUTE, "boundaries", "block leak"),
    Case("silent-preemption", "vllm-cpu", CAPACITY, "one_block_below", "recompute"),
    Case("hide-preemption-counter", "vllm-cpu", CAPACITY, "one_block_below",
         "engine crash / harness error"),
    Case("hang-engine", "vllm-cpu", TOKEN, ONE_TOKEN_TEST, "timeout",
         extra=("--engine-timeout", "15")),
    # One fault per KV ledger invariant (tests/e2e/test_kv_faults.py).
    Case("free-pad-block", "vllm-cpu", FREEING, "finish-back-to-idle", "block leak"),
    Case("refree-block", "vllm-cpu", FREEING, "finish-back-to-idle", "block leak"),
    Case("extra-ref", "vllm-cpu", FREEING, "finish-back-to-idle", "block leak"),
    Case("keep-finished-blocks", "vllm-cpu", FREEING, "finish-back-to-idle", "block leak"),
    Case("free-late", "vllm-cpu", FREEING, "finish-back-to-idle", "block leak"),
    # The pool against the KV cache the runner allocated (test_device_block_count_faults.py).
    Case("kv-cache-short", "vllm-cpu", FREEING, "single-request", "block leak"),
    # One rank of a tensor-parallel engine computes its share wrongly
    # (tests/e2e/test_tensor_parallel.py).
    Case("scale-partial-sum:rank=1", "vllm-cpu", GEOMETRY, "tp2", "token mismatch",
         extra=("--geometry", "tp2")),
)
