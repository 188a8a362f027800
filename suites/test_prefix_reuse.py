"""Prefix caching served again: a prompt computed earlier in the run is served from the cache.

A first wave of requests computes two prompts; once they have finished, a second wave sends
the same prompts again, a longer and a shorter prompt sharing the first one's prefix, and a
prompt that shares only its first block. Each request of the second wave must report the
cached tokens the block-aligned shared prefix gives, run only the rest of its prompt, and,
where the runner says what it took from the cache (sendnn-inference 2.x), take exactly what
chunk alignment allows and run one prefill step per chunk left (the rules:
harness.checks.prefix_reuse). Every KV ledger invariant holds (shared blocks counted once per
holder), and the tokens still equal the reference. The prompts are slices of the corpus
(not a repeated sentence), so a position computed from the wrong cache would change a token.

A request aborted mid-decode has cached the block its first output tokens filled: a later
prompt that starts with its prompt and those tokens is served that block, which the
expectation knows from the aborted request's computed tokens (its prompt one short of a block).
"""

import pytest

from harness.checks.prefix_reuse import check_prefix_reuse, check_prefix_served
from harness.core.paths import FIXTURES
from harness.scenario.prompts import EngineLimits, RequestSpec, Scenario
from harness.targets import kind
from harness.targets.geometry import FULL_BATCH

pytestmark = [pytest.mark.block_freeing, pytest.mark.nightly, pytest.mark.timeout(1800),
              pytest.mark.hil_needs("kv_ledger", "prefix_caching")]

# Room for prompts of three 128-token chunks (the first left-padded) and their output.
LIMITS = EngineLimits(max_model_len=512, max_num_seqs=4, cp_chunk=128)
MAX_TOKENS = 8
SECOND_WAVE = 40  # arrival step of the second wave: the first has finished by then
# (request id, corpus text, first token, last token (exclusive), arrival step)
REQUESTS = [
    ("a", "lab", 0, 300, 0),
    ("b", "weather", 0, 200, 0),
    ("a-again", "lab", 0, 300, SECOND_WAVE),   # the same prompt: 4 of its 5 blocks cached
    ("b-again", "weather", 0, 200, SECOND_WAVE),
    ("a-longer", "lab", 0, 380, SECOND_WAVE),  # shares all of a's prompt, then goes on
    ("a-shorter", "lab", 0, 150, SECOND_WAVE),  # a prefix of a: a hit inside a chunk
    ("a-then-b", "mixed", 0, 250, SECOND_WAVE),  # a's first 100 tokens, then b's text
]


def corpus_tokens(tokenizer, name: str) -> list[int]:
    """Token ids of a corpus text of the tiny models (``mixed``: lab's first 100 tokens,
    then weather's)."""
    if name == "mixed":
        return corpus_tokens(tokenizer, "lab")[:100] + corpus_tokens(tokenizer, "weather")
    text = (FIXTURES / "corpus" / f"{name}.txt").read_text()
    return tokenizer.encode(text[:4000], add_special_tokens=False)


def prefix_scenario(tokenizer) -> Scenario:
    requests = []
    for rid, text, start, end, arrival in REQUESTS:
        ids = corpus_tokens(tokenizer, text)[start:end]
        assert len(ids) == end - start, f"corpus {text} is shorter than {end} tokens"
        requests.append(RequestSpec(request_id=rid, prompt_token_ids=tuple(ids),
                                    max_tokens=MAX_TOKENS, arrival_step=arrival,
                                    prompt_text=tokenizer.decode(ids)))
    return Scenario("prefix-served-again", requests, LIMITS,
                    tags={"scenario": "prefix-served-again", "batch_size": len(requests),
                          "max_num_seqs": LIMITS.max_num_seqs})


ABORT_STEP = 6  # "gone" prefilled at step 0, has run 5 of its output tokens when aborted
SHARED_OUTPUT = 4  # of its output tokens, the later prompt starts with this many


def aborted_scenario(hil, model, block_size: int) -> Scenario:
    """"gone", a prompt one token short of a block, aborted before step ``ABORT_STEP``; then
    "after", whose prompt is gone's, its first output tokens (the reference's greedy ones,
    which the engine computes too) and more text: it shares a whole block with what gone
    computed only through gone's output."""
    prompt = corpus_tokens(model.tokenizer, "lab")[:block_size - 1]
    alone = RequestSpec(request_id="gone", prompt_token_ids=tuple(prompt),
                        max_tokens=SHARED_OUTPUT)
    ref = hil.reference(model, Scenario("prefix-after-abort-reference", [alone], LIMITS))
    after = [*prompt, *ref.requests["gone"].token_ids,
             *corpus_tokens(model.tokenizer, "weather")[:block_size + 20]]
    requests = [
        RequestSpec(request_id="gone", prompt_token_ids=tuple(prompt), max_tokens=32,
                    abort_step=ABORT_STEP, prompt_text=model.tokenizer.decode(prompt)),
        RequestSpec(request_id="after", prompt_token_ids=tuple(after), max_tokens=MAX_TOKENS,
                    arrival_step=ABORT_STEP + 2, prompt_text=model.tokenizer.decode(after)),
    ]
    return Scenario("prefix-after-abort", requests, LIMITS,
                    tags={"scenario": "prefix-after-abort", "batch_size": len(requests),
                          "max_num_seqs": LIMITS.max_num_seqs})


@pytest.mark.hil_first_model  # one engine of its own per variant: one model keeps CI cost small
def test_prompt_served_again_is_served_from_the_cache(hil, model, target_variant):
    scenario = prefix_scenario(model.tokenizer)
    engine = hil.engine_config(target_variant, model, scenario, pool=FULL_BATCH,
                               prefix_caching=True)

    trace = hil.run_steps(engine, scenario)

    hil.expect(check_prefix_served(trace), check_prefix_reuse(trace), hil.check_ledger(trace),
               hil.check_tokens(model, scenario, trace), trace=trace)


@pytest.mark.hil_first_model
def test_an_aborted_requests_output_is_served_from_the_cache(hil, model, target_variant):
    """The block an aborted request's output filled is served to a later prompt sharing it."""
    # the block size of the pool the harness sizes (FULL_BATCH), as the stack's vLLM takes it
    block_size = hil.block_size(target_variant, kind(target_variant.target).sized_pool_geometry)
    assert block_size, f"{target_variant.id}'s sized pool has no block size"
    scenario = aborted_scenario(hil, model, block_size)
    engine = hil.engine_config(target_variant, model, scenario, pool=FULL_BATCH,
                               prefix_caching=True)

    trace = hil.run_steps(engine, scenario)

    hil.expect(check_prefix_served(trace), check_prefix_reuse(trace), hil.check_ledger(trace),
               hil.check_aborts(scenario, trace), hil.check_tokens(model, scenario, trace),
               trace=trace)
