"""A batch TKV limit that binds: the scheduler pauses exactly when batch size x TKV would pass
it, never a step late and never early, and nothing is preempted.

Four full-length requests arrive together in a batch of four, under a batch TKV limit of half
what a full batch at ``max_model_len`` needs: once the four decode past a TKV of 128 the batch
passes the limit, so the scheduler (sendnn-inference 2.x, pausing on) must pause requests step
by step, and resume them as the others finish. Every KV ledger invariant holds at every step,
with the exact TKV checks of the ledger path (harness.checks.tkv): batch size x the runner's
TKV within the limit at every decode step, the runner's TKV the one its left padding gives, no
request paused while the batch had room for it, the scheduler's predicted TKV the runner's,
and no newcomer held back while its joining stayed within the limit. Pauses are the expected
answer here (they must be seen: the limit really bound); a preemption is not, and the tokens
still equal the reference.
"""

import pytest

from harness.checks.preemption import check_no_recompute, check_pausing_seen
from harness.checks.tkv import check_tkv_recorded
from harness.targets import kind
from harness.targets.full_batch import full_batch_scenario
from harness.targets.geometry import FULL_BATCH

pytestmark = [pytest.mark.no_recompute, pytest.mark.nightly, pytest.mark.timeout(1800)]

MAX_MODEL_LEN = 256
MAX_NUM_SEQS = 4
CHUNK = 128
TKV_LIMIT_ENV = "VLLM_DT_MAX_BATCH_TKV_LIMIT"  # the plugin's batch TKV limit (not prefixed)
# Half a full batch's max_model_len x max_num_seqs (at 256 x 4: 512 of 1024): four requests
# decoding past a TKV of 128 pass it, three past 170, two never (each request ends at 192
# tokens); in a card's context (512) the same at twice the tokens.
PROMPT_LEN = 64


@pytest.mark.hil_first_model  # each run starts its own engine: one model keeps CI cost small
@pytest.mark.hil_needs("pausing")
def test_full_length_batch_pauses_exactly_at_the_tkv_limit(hil, model, target_variant):
    limits = hil.limits(target_variant, MAX_MODEL_LEN, MAX_NUM_SEQS, cp_chunk=CHUNK)
    tkv_limit = limits.max_model_len * limits.max_num_seqs // 2
    scenario = full_batch_scenario(model.tokenizer, target_variant.target, limits, PROMPT_LEN)
    engine = hil.engine_config(target_variant, model, scenario, pool=FULL_BATCH,
                               extra_env=(*target_variant.device_env,
                                          (TKV_LIMIT_ENV, str(tkv_limit))))
    lacking = kind(engine.target).capability_problem(target_variant, "pausing", engine.stack)
    if lacking:
        pytest.skip(f"{lacking}: no batch TKV limit to keep")

    trace = hil.run_steps(engine, scenario)

    hil.expect(hil.check_ledger(trace), check_tkv_recorded(trace), check_pausing_seen(trace),
               check_no_recompute(trace), hil.check_tokens(model, scenario, trace), trace=trace)
