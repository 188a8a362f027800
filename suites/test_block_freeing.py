"""Padding, dummy and warmup KV blocks are freed at the right step, and never leaked.

Each scenario is driven one engine step at a time; every KV ledger invariant
(harness.checks.ledger) must hold at every step, every block must be free after
warmup and again at idle, and the tokens must still equal the reference.
"""

import pytest

from harness.scenario.prompts import shaped_scenario
from harness.targets import kind
from harness.targets.geometry import FULL_BATCH

pytestmark = [
    pytest.mark.block_freeing,
    pytest.mark.nightly,
    pytest.mark.timeout(1800),
    # Every variant whose KV blocks are read per step; with pausing off too (a paused request
    # keeps its blocks, so the ledgers read pausing).
    pytest.mark.hil_needs("kv_ledger"),
    pytest.mark.hil_controls("pausing"),
]

MAX_MODEL_LEN, MAX_NUM_SEQS = 256, 4  # in the context the device compiles (hil.limits)

# (prompt tokens, max_tokens, arrival step[, the step before which it is aborted]) per request
SCENARIOS = {
    "single-request-decodes-alone": [(64, 40, 0)],
    "second-request-joins-while-first-decodes": [(64, 40, 0), (30, 20, 5)],
    "requests-finish-back-to-idle": [(30, 10, 0), (70, 25, 0), (10, 5, 2)],
    "over-max-num-seqs-queues-and-drains": [(20 + 15 * i, 12, 0) for i in range(6)],
    # A client goes away: r0 is aborted mid-decode, with blocks it holds and blocks it will
    # need (30 + 60 tokens: a second 64-token block, not yet allocated); the others go on
    # and r2 arrives after the abort, into the blocks it gave back.
    "aborted-request-gives-its-blocks-back": [(30, 60, 0, 6), (40, 20, 0), (50, 10, 8)],
}


def test_every_block_is_free_after_warmup(hil, model, target_variant):
    limits = hil.limits(target_variant, MAX_MODEL_LEN, MAX_NUM_SEQS)
    scenario = shaped_scenario("warmup", model.tokenizer, [(8, 1, 0)], limits)
    engine = hil.engine_config(target_variant, model, scenario, pool=FULL_BATCH)

    hil.expect(hil.check_idle_ledgers(engine, "after warmup"))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_blocks_return_to_the_pool(hil, model, target_variant, name):
    limits = hil.limits(target_variant, MAX_MODEL_LEN, MAX_NUM_SEQS)
    scenario = shaped_scenario(name, model.tokenizer, SCENARIOS[name], limits)
    engine = hil.engine_config(target_variant, model, scenario, pool=FULL_BATCH)

    trace = hil.run_steps(engine, scenario)

    assert trace.idle_at_end, "the engine still had requests after the run"
    hil.expect(hil.check_ledger(trace), hil.check_aborts(scenario, trace),
               hil.check_tokens(model, scenario, trace), trace=trace)


def test_dummy_padding_blocks_are_taken_and_returned(hil, model, target_variant):
    """Where the stack declares that it pads a lone decoding request with a dummy
    (vllm-spyre 0.3-0.4; declared by the target's kind: ``pads_decode_batch``), the dummy
    holds blocks while one request decodes alone and has none once a second joins and once
    the batch empties; a declared stack whose ledgers show no dummy fails, and so does a
    dummy on a stack that declares none."""
    shapes = SCENARIOS["second-request-joins-while-first-decodes"]
    limits = hil.limits(target_variant, MAX_MODEL_LEN, MAX_NUM_SEQS)
    scenario = shaped_scenario("dummy-padding", model.tokenizer, shapes, limits)
    engine = hil.engine_config(target_variant, model, scenario, pool=FULL_BATCH)

    trace = hil.run_steps(engine, scenario)

    target = kind(engine.target)
    dummy = target.dummy_padding_verdict(trace, engine.stack, engine.variant_id)
    if dummy is None:
        hil.expect(hil.check_ledger(trace), trace=trace)
        pytest.skip(f"{target_variant.id} on stack {engine.stack} pads no decode batch with a"
                    f" dummy request (declared in {target.padding_declaration()}, and none was seen)")
    hil.expect(hil.check_ledger(trace), dummy, trace=trace)
