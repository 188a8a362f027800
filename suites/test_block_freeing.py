"""Padding, dummy and warmup KV blocks are freed at the right step, and never leaked.

Each scenario is driven one engine step at a time; every KV ledger invariant
(harness.kv) must hold at every step, every block must be free after warmup
and again at idle, and the tokens must still equal the reference.
"""

import pytest

from harness.kv import KvSnapshot, check_idle
from harness.scenario import EngineLimits, shaped_scenario

pytestmark = [
    pytest.mark.block_freeing,
    pytest.mark.nightly,
    pytest.mark.timeout(1800),
    pytest.mark.hil_targets("vllm-cpu", "cb", "cp", "neuron"),
]

LIMITS = EngineLimits(max_model_len=256, max_num_seqs=4, cp_chunk=128)
CPU_BLOCK = 16

# (prompt tokens, max_tokens, arrival step) per request
SCENARIOS = {
    "single-request-decodes-alone": [(64, 40, 0)],
    "second-request-joins-while-first-decodes": [(64, 40, 0), (30, 20, 5)],
    "requests-finish-back-to-idle": [(30, 10, 0), (70, 25, 0), (10, 5, 2)],
    "over-max-num-seqs-queues-and-drains": [(20 + 15 * i, 12, 0) for i in range(6)],
}


def engine_for(hil, target_variant, model, scenario):
    if target_variant.target in ("spyre", "neuron"):
        return hil.engine_config(target_variant, model, scenario)
    # A pool sized for a full batch keeps the per-step probe small.
    return hil.engine_config(target_variant, model, scenario, block_size=CPU_BLOCK,
                             num_blocks_override=4 * (256 // CPU_BLOCK) + 1)


def test_every_block_is_free_after_warmup(hil, model, target_variant):
    scenario = shaped_scenario("warmup", model.tokenizer, [(8, 1, 0)], LIMITS)
    snaps = hil.kv_snapshot(engine_for(hil, target_variant, model, scenario))

    problems = [v for k in snaps for v in check_idle(KvSnapshot.from_dict(k), step=-1)]
    assert not problems, "after warmup: " + "; ".join(f"[{v.invariant}] {v.message}" for v in problems)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_blocks_return_to_the_pool(hil, model, target_variant, name):
    scenario = shaped_scenario(name, model.tokenizer, SCENARIOS[name], LIMITS)

    trace = hil.run_steps(engine_for(hil, target_variant, model, scenario), scenario)

    assert trace.info["idle"], "the engine still had requests after the run"
    report = hil.ledger_report(trace)
    assert report is None, report
    verdict = hil.compare(hil.reference(model, scenario), trace, model, scenario)
    assert verdict.ok, verdict.report()


def test_dummy_padding_blocks_are_taken_and_returned(hil, model, target_variant):
    """Where the stack pads a lone decoding request with a dummy (vllm-spyre 0.3-0.4), the
    dummy holds blocks while one request decodes alone and has none once a second joins
    and once the batch empties."""
    shapes = SCENARIOS["second-request-joins-while-first-decodes"]
    scenario = shaped_scenario("dummy-padding", model.tokenizer, shapes, LIMITS)

    trace = hil.run_steps(engine_for(hil, target_variant, model, scenario), scenario)

    held = dummy_blocks_per_step(trace)
    if not any(held.values()):
        pytest.skip(f"{target_variant.id} on this stack pads no decode batch with a dummy request")
    report = hil.ledger_report(trace)
    assert report is None, report
    joined = next(s["step"] for s in trace.engine_steps if len(s["running"]) == 2)
    alone_before = [st for st, blocks in held.items() if blocks and st < joined]
    assert alone_before, f"no dummy blocks while r0 decoded alone before step {joined}: {held}"
    assert not held[joined], f"dummy still holds {held[joined]} at step {joined}, where r1 joined"
    assert not held[trace.engine_steps[-1]["step"]], "dummy blocks held at idle"


def dummy_blocks_per_step(trace):
    """step -> blocks held by dummy requests in the runner's ledger."""
    out = {}
    for s in trace.engine_steps:
        blocks = []
        for kv in s["kv"]:
            for d in kv.get("dummy_ids", []):
                blocks += kv["owned"].get(d, [])
        out[s["step"]] = sorted(blocks)
    return out
