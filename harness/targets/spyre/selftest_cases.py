"""Spyre's ``hil selftest`` cases: each fault on the plugin in CPU mode (eager), on the stack of
the generation it patches, and on a card the faults that patch vLLM itself."""

from __future__ import annotations

from harness.targets.selftest_case import (
    CAPACITY,
    FREEING,
    NO_RECOMPUTE,
    ONE_TOKEN_TEST,
    TOKEN,
    Case,
    vllm_cases,
)

LEGACY_STACK = "legacy-spyre-0.4"  # the minimum-decode-batch dummy runner
SPYRE_1X_STACK = "spyre-1.10"  # vllm-spyre 1.x: the cb mode and its runner's block pool
TKV_LIMIT = "suites/test_tkv_limit.py"
PREFIX_REUSE = "suites/test_prefix_reuse.py"

CASES: tuple[Case, ...] = (
    Case("perturb-logit:position=5", "spyre-eager-cp", TOKEN, ONE_TOKEN_TEST, "token mismatch"),
    Case("forget-free", "spyre-eager-cp", FREEING, "finish-back-to-idle", "block leak"),
    Case("kernel-drift", "spyre-eager-cp", TOKEN, ONE_TOKEN_TEST, "logprob drift"),
    # On tiny-llama the block-edge case meets a near-tie the free run accepts, and the drift
    # three steps later flips the teacher-forced run's token.
    Case("drift-after-near-tie", "spyre-eager-cp", TOKEN, "block-edge", "token mismatch"),
    Case("runner-up-when-close", "spyre-eager-cp", TOKEN, "long-prompt", "sampler not greedy"),
    # Bugs that show under one condition of a run only (the conditions triage varies).
    Case("mix-batch-rows", "spyre-eager-cp", TOKEN, "pair", "token mismatch"),
    Case("stale-recycled-block", "spyre-eager-cp", FREEING, "over-max-num-seqs",
         "token mismatch"),
    Case("chunk-continuation", "spyre-eager-cp", TOKEN, "long-prompt", "token mismatch"),
    Case("prefix-hit", "spyre-eager-pc", TOKEN, "cached-edge", "token mismatch"),
    Case("forget-free-once", "spyre-eager-cp", FREEING, "finish-back-to-idle", "block leak"),
    Case("free-late", "spyre-eager-cp", FREEING, "finish-back-to-idle", "block leak"),
    # vllm-spyre 1.x's CB runner (warmup reservations, its block pool): on its stack.
    Case("leak-warmup-block", "spyre-eager-cb", FREEING, "after_warmup", "block leak",
         stack=SPYRE_1X_STACK),
    Case("reserve-extra", "spyre-eager-cb", CAPACITY, "reservations_at_the_edge and filled",
         "recompute", stack=SPYRE_1X_STACK),
    # vLLM's real preemption path on spyre (its pool never runs out by itself); the negative
    # control in suites/test_no_recompute.py proves all four signals see it.
    Case("preempt-running-once", "spyre-eager-cb", NO_RECOMPUTE, "full_batch_runs and cb-64-2",
         "recompute", stack=SPYRE_1X_STACK),
    Case("forget-free-in-runner", "spyre-eager-cb", FREEING, "finish-back-to-idle", "block leak",
         stack=SPYRE_1X_STACK),
    Case("reserve-short", "spyre-eager-cb", FREEING, "finish-back-to-idle", "block leak",
         stack=SPYRE_1X_STACK),
    Case("leak-reservation", "spyre-eager-cb", FREEING, "finish-back-to-idle", "block leak",
         stack=SPYRE_1X_STACK),
    # The legacy runner's dummy (tests/e2e/test_legacy_stack.py).
    Case("keep-dummy-on-join", "spyre-eager-cb", FREEING, "dummy_padding", "block leak",
         stack=LEGACY_STACK),
    Case("legacy-double-free", "spyre-eager-cb", FREEING, "finish-back-to-idle", "block leak",
         stack=LEGACY_STACK),
    Case("misname-dummy", "spyre-eager-cb", FREEING, "dummy_padding", "block leak",
         stack=LEGACY_STACK),
    # sendnn-inference 2.x: promises, the runner's table and pausing (tests/e2e/test_spyre2_faults.py).
    Case("promise-total-drift", "spyre-eager-cp", FREEING, "single-request", "block leak"),
    Case("keep-promise", "spyre-eager-cp", NO_RECOMPUTE, "full_batch_runs and cp-65-2",
         "block leak"),
    Case("runner-keeps-finished", "spyre-eager-cp", FREEING, "finish-back-to-idle",
         "block leak"),
    Case("runner-wrong-block", "spyre-eager-cp", FREEING, "finish-back-to-idle", "block leak"),
    Case("pause-at-full-batch", "spyre-eager-cp", NO_RECOMPUTE, "full_batch_runs and cp-65-2",
         "recompute"),
    # 2.x: the pool against the KV cache the runner allocated
    # (tests/e2e/test_device_block_count_faults.py).
    Case("runner-kv-short", "spyre-eager-cp", FREEING, "single-request", "block leak"),
    Case("formula-forgets-pad-block", "spyre-eager-cp", CAPACITY, "device_decided", "capacity"),
    # 2.x admission by blocks: exact promises, the hold-back, no overcommit
    # (tests/e2e/test_block_admission_faults.py).
    Case("promise-one-short", "spyre-eager-cp", FREEING, "second-request-joins", "block leak"),
    Case("promise-one-extra", "spyre-eager-cp", FREEING, "second-request-joins", "block leak"),
    Case("hold-back-once", "spyre-eager-cp", FREEING, "second-request-joins", "scheduling"),
    Case("free-blocks-overcounted", "spyre-eager-cp", "suites/test_block_admission.py",
         "holds_newcomers_back", "scheduling"),
    # 2.x: the batch TKV limit and the prefix cache, exactly (tests/e2e/test_tkv_prefix_faults.py).
    Case("pause-one-step-late", "spyre-eager-cp", TKV_LIMIT, "pauses_exactly", "scheduling"),
    Case("pause-with-room", "spyre-eager-pc", TKV_LIMIT, "pauses_exactly", "scheduling"),
    Case("hold-back-at-admission", "spyre-eager-cp", TKV_LIMIT, "pauses_exactly", "scheduling"),
    Case("runner-tkv-one-block-high", "spyre-eager-cp", FREEING, "second-request-joins",
         "scheduling"),
    Case("tkv-prediction-without-padding", "spyre-eager-pc", FREEING, "second-request-joins",
         "scheduling"),
    Case("prefix-hit-underreported", "spyre-eager-pc", PREFIX_REUSE, "served_again",
         "scheduling"),
    Case("prefix-cache-drops-a-block", "spyre-eager-pc", PREFIX_REUSE, "served_again",
         "scheduling"),
    Case("prefix-hit-overreported", "spyre-eager-pc", PREFIX_REUSE, "aborted_requests_output",
         "scheduling"),
)

# On a card the faults that patch vLLM itself apply; the device is required, not skipped.
DEVICE_CASES: tuple[Case, ...] = vllm_cases("spyre-sendnn-cp", extra=("--require-device",))

# Faults whose check is the on-card verification (the card, the registry entry the plugin
# applies only on a card); tests/e2e/test_card_host.py proves them on
# the emulated card host.
DEVICE_ONLY_FAULTS = ("open-other-card", "open-simulator", "registry-blocks-off")
DEVICE_ONLY_WHY = "needs a card (the emulated card host proves it)"
