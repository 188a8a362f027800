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
)

# On a card the faults that patch vLLM itself apply; the device is required, not skipped.
DEVICE_CASES: tuple[Case, ...] = vllm_cases("spyre-sendnn-cp", extra=("--require-device",))

# Faults whose check is the on-card verification; tests/e2e/test_card_host.py proves them on
# the emulated card host.
DEVICE_ONLY_FAULTS = ("open-other-card", "open-simulator")
DEVICE_ONLY_WHY = "needs a card (the emulated card host proves it)"
