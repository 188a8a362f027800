"""Pausing: the sendnn-inference 2.x scheduler takes a decoding request out of the batch (the
request keeps its blocks) when the batch's next TKV times its size would pass the batch TKV
limit, and puts it back once the batch has room again.

The limit is the Spyre compiler's ``VLLM_DT_MAX_BATCH_TKV_LIMIT`` (batch size x TKV, in tokens),
read from the engine's environment; unset, the plugin makes it ``max_model_len x max_num_seqs``,
which a full batch never passes: suites/test_no_recompute.py checks that at ``max_num_seqs`` in a
pool sized for it no request is paused and none preempted. The negative control here sets the
limit to half of that, so a full batch of two requests that decode past half of
``max_model_len`` must pause one: the pause signal the no-preemption check reads
(harness.checks.preemption) must see it on the running engine, and the check that fails the
full-batch test must fail saying "pause:". Tokens and every KV ledger invariant still hold.
With pausing off (mode ``np``, ``SENDNN_INFERENCE_PAUSING_ENABLED=0``) the same limit is
applied at admission instead: the second request waits until the first has finished, so the
batch never fills, nothing is paused and nothing preempted. It runs on the variants that have
``pausing`` and on the controls that switch it off; stacks whose scheduler never pauses
(vllm-spyre 1.x) skip it with the reason their kind gives (``capability_problem``).
"""

import pytest

from harness.checks.preemption import check_full_batch, check_no_preemption, check_pausing_seen
from harness.scenario.prompts import EngineLimits, shaped_scenario
from harness.targets import kind
from harness.targets.geometry import FULL_BATCH

pytestmark = [pytest.mark.no_recompute, pytest.mark.nightly, pytest.mark.timeout(1800)]

MAX_MODEL_LEN = 256
MAX_NUM_SEQS = 2
TKV_LIMIT_ENV = "VLLM_DT_MAX_BATCH_TKV_LIMIT"  # the plugin's batch TKV limit (not prefixed)
# Half of what a full batch at max_model_len needs: two requests pause once the batch's next
# TKV passes 128; one alone runs to its end (64 + 80 tokens).
TKV_LIMIT = MAX_MODEL_LEN * MAX_NUM_SEQS // 2
SHAPES = [(64, 80, 0)] * MAX_NUM_SEQS


@pytest.mark.hil_first_model  # each run starts its own engine: one model keeps CI cost small
@pytest.mark.hil_needs("pausing")
@pytest.mark.hil_controls("pausing")  # and with pausing off: the limit applies at admission
def test_negative_control_batch_tkv_limit_pauses_a_full_batch(hil, model, target_variant):
    limits = EngineLimits(MAX_MODEL_LEN, MAX_NUM_SEQS, cp_chunk=128)
    scenario = shaped_scenario(f"tkv-limit-{TKV_LIMIT}-{MAX_NUM_SEQS}x64", model.tokenizer,
                               SHAPES, limits)
    engine = hil.engine_config(target_variant, model, scenario, pool=FULL_BATCH,
                               extra_env=(*target_variant.device_env,
                                          (TKV_LIMIT_ENV, str(TKV_LIMIT))))
    lacking = kind(engine.target).capability_problem(target_variant, "pausing", engine.stack)
    if lacking:
        pytest.skip(f"{lacking}: there is no pause to see")

    trace = hil.run_steps(engine, scenario)

    if target_variant.switches_off == "pausing":  # the limit holds the second request back
        hil.expect(check_no_preemption(trace), hil.check_ledger(trace),
                   hil.check_tokens(model, scenario, trace), trace=trace)
        hil.expect_failure(check_full_batch(trace, MAX_NUM_SEQS), "full batch never reached",
                           trace=trace)
        return
    hil.expect(check_full_batch(trace, MAX_NUM_SEQS), check_pausing_seen(trace),
               hil.check_ledger(trace), hil.check_tokens(model, scenario, trace), trace=trace)
    # Paused, not preempted: the full-batch check fails on the pause alone.
    hil.expect_failure(check_no_preemption(trace), "pause: requests were paused", trace=trace)
