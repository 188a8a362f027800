"""The mission's invariants in every selected geometry (``--geometry``; fixtures/geometries.toml).

``max_num_seqs`` requests of the geometry's full length arrive together. Whatever the geometry,
greedy tokens equal the reference's and every KV ledger invariant holds at every step (exact
promises, the device's block count, the TKV limit's pauses: harness/checks/). What else must
hold follows from the geometry, never from the target's name:

- a pool that holds the full batch (``small``, a ``card`` whose device gives enough blocks) and
  no binding TKV limit: the full batch runs at once and nothing is preempted or paused;
- a pool smaller than the batch (``tight``, a device count below it): a scheduler that holds a
  newcomer back until its blocks are free (capability ``holds_back_on_blocks``) preempts nothing;
  one that admits and preempts (vLLM's own) recomputes, and its tokens must still be equal;
- a binding batch TKV limit (``tkv-bound``): requests are held back or paused where the limit
  demands, never preempted and recomputed.

A geometry the target's kind cannot run (a batch TKV limit on a kind without one) is a skip
quoting the kind's reason; one the plugin refuses at engine start is a skip quoting the plugin.
"""

import pytest

from harness.checks.capacity import blocks_needed
from harness.checks.preemption import check_full_batch, check_no_preemption, check_no_recompute
from harness.core.errors import EngineRefused
from harness.targets.full_batch import full_batch_scenario

pytestmark = [pytest.mark.no_recompute, pytest.mark.nightly, pytest.mark.timeout(1800)]

PROMPT_LEN = 64  # one Spyre block: every geometry's context holds it and its full output


def pool_holds_batch(geometry, trace, max_model_len, max_num_seqs):
    """Whether the engine's pool holds a full batch of full-length requests: the geometry's
    word where it sizes the pool, else what the engine really held (its first ledger)."""
    if geometry.pool_holds_batch is not None:
        return geometry.pool_holds_batch
    ledger = next((s for r in trace.ledger_steps() for s in r.kv if s.block_size), None)
    if ledger is None:
        return None
    need = blocks_needed(max_model_len, max_num_seqs, ledger.block_size, len(ledger.pad_blocks))
    return ledger.num_blocks >= need.full_batch


@pytest.mark.hil_needs("kv_ledger")
def test_full_batch_in_geometry(hil, model, target_variant, geometry):
    limits = geometry.limits()
    scenario = full_batch_scenario(model.tokenizer, target_variant.target, limits, PROMPT_LEN)
    engine = hil.engine_config(target_variant, model, scenario, geometry=geometry)

    try:
        with hil.expect_refusal():
            trace = hil.run_steps(engine, scenario)
    except EngineRefused as e:
        pytest.skip(f"{engine.label} refuses geometry {geometry.describe()}: {e}")

    verdicts = [hil.check_ledger(trace), hil.check_tokens(model, scenario, trace)]
    holds = pool_holds_batch(geometry, trace, limits.max_model_len, limits.max_num_seqs)
    if geometry.tkv_binds:
        verdicts.append(check_no_recompute(trace))
    elif holds:
        verdicts += [check_full_batch(trace, limits.max_num_seqs), check_no_preemption(trace)]
    elif "holds_back_on_blocks" in target_variant.capabilities:
        verdicts.append(check_no_recompute(trace))
    hil.expect(*verdicts, trace=trace)
