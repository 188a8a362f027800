"""Every verdict of one example: the one place the explorer's checks are listed.

``Judge.verdicts`` gives, for a geometry, a workload and the trace of its run, every check a
suite asks of such a run: the KV ledgers at every step (``hil.check_ledger``: every ledger
invariant, the promises, the admission and device-block invariants of the ledger path), the
aborts (``hil.check_aborts``), token equality against the CPU reference for the requests that
run to their end (``hil.check_tokens``), and the batch checks the geometry calls for, as
``suites/test_geometry.py`` chooses them:

- a binding batch TKV limit: requests may be held back or paused, never recomputed
  (``check_no_recompute``);
- a pool that holds a full batch of full-length requests (and no binding limit): nothing is
  preempted or paused (``check_no_preemption``), and where the workload must fill the batch
  (``full_batch_expected``) the batch reaches ``max_num_seqs`` (``check_full_batch``);
- a smaller pool: a scheduler that holds a newcomer back until its blocks are free
  (capability ``holds_back_on_blocks``) recomputes nothing; one that admits and preempts
  (vLLM's own) may preempt, and its tokens must still be equal;

and, where blocks follow tokens one to one (a pool the harness sizes, capability
``harness_sized_pool``, without prefix caching), each request holds exactly the blocks its
tokens fill (``check_blocks_follow_tokens``, as ``suites/test_no_recompute.py`` asks); with
prefix caching on, each prompt served as ``check_prefix_reuse``'s rules give, where they hold
(``prefix_verdicts``); and where the geometry's pool is to hold a full batch, the blocks the
engine really holds serve one (``capacity_verdicts``, as ``suites/test_capacity.py`` asks).
The device's block count at start is judged before the run (``ExampleRunner``).

A check added to the suites' step-driven runs joins here, in ``Judge.verdicts``, once.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from harness.checks.boundaries import check_blocks_follow_tokens
from harness.checks.capacity import KvPool, blocks_needed, check_engine_serves_full_batch
from harness.checks.preemption import (
    check_full_batch,
    check_no_preemption,
    check_no_recompute,
    count_preemptions,
)
from harness.checks.prefix_reuse import check_prefix_reuse
from harness.core.trace import SOURCE_VLLM_SCHEDULER, KvSnapshot, Trace
from harness.core.verdict import Verdict
from harness.explore.example import RequestShape
from harness.geometry.catalog import Geometry
from harness.scenario.prompts import Scenario

if TYPE_CHECKING:
    from harness.scenario.catalog import Model
    from harness.session.facade import HilSession
    from harness.targets.variants import TargetVariant

HOLDS_BACK_ON_BLOCKS = "holds_back_on_blocks"
HARNESS_SIZED_POOL = "harness_sized_pool"
PREFIX_CACHING = "prefix_caching"


def _pool(trace: Trace) -> KvSnapshot | None:
    """The first snapshot of the pool the scheduler hands blocks out of (else the first
    ledger with a block size), the device's KV cache size taken from any snapshot of that
    step that reads it."""
    for record in trace.ledger_steps():
        sized = [s for s in record.kv if s.block_size]
        if not sized:
            continue
        pool = next((s for s in sized if s.source == SOURCE_VLLM_SCHEDULER), sized[0])
        device = next((s.device_blocks for s in record.kv if s.device_blocks is not None), None)
        return pool if pool.device_blocks is not None or device is None \
            else replace(pool, device_blocks=device)
    return None


def pool_holds_batch(geometry: Geometry, trace: Trace) -> bool | None:
    """Whether the engine's pool holds a full batch of full-length requests: the geometry's
    word where it sizes the pool, else what the engine really held (its first ledger); None
    where the trace has no ledger."""
    if geometry.pool_holds_batch is not None:
        return geometry.pool_holds_batch
    ledger = _pool(trace)
    if ledger is None or not ledger.block_size:
        return None
    need = blocks_needed(geometry.max_model_len, geometry.max_num_seqs, ledger.block_size,
                         len(ledger.pad_blocks))
    return ledger.num_blocks >= need.full_batch


def full_batch_expected(geometry: Geometry, requests: Sequence[RequestShape]) -> bool:
    """Whether the workload must fill the batch in a pool that holds it: at least
    ``max_num_seqs`` requests, all arriving at step 0, none aborted, and each of the first
    ``max_num_seqs`` asking for more tokens than two steps per prefill chunk of them all (one
    chunk is prefilled at a time and a decode step may follow each: the first request still
    runs when the last one is admitted)."""
    n = geometry.max_num_seqs
    if len(requests) < n or any(r.arrival or r.abort_after is not None for r in requests):
        return False
    batch = requests[:n]
    chunks = sum(math.ceil(r.prompt_len / geometry.chunk_size) for r in batch)
    return min(r.max_tokens for r in batch) >= 2 * chunks + 2


def batch_verdicts(geometry: Geometry, requests: Sequence[RequestShape],
                   capabilities: Collection[str], trace: Trace,
                   holds_back_for_tkv: bool = False) -> list[Verdict]:
    """The batch checks ``geometry`` calls for (see the module docstring). ``capabilities``
    are the target variant's; ``holds_back_for_tkv``: its scheduler may hold a newcomer back
    for the batch TKV even when the limit cannot bind (a TKV limit without pausing), so a
    full batch is not expected of it."""
    if geometry.tkv_binds:
        return [check_no_recompute(trace)]
    holds = pool_holds_batch(geometry, trace)
    if holds:
        verdicts = [check_no_preemption(trace)]
        if not holds_back_for_tkv and full_batch_expected(geometry, requests):
            verdicts.append(check_full_batch(trace, geometry.max_num_seqs))
        return verdicts
    if HOLDS_BACK_ON_BLOCKS in capabilities:
        return [check_no_recompute(trace)]
    return []


def capacity_verdicts(geometry: Geometry, trace: Trace) -> list[Verdict]:
    """Where the geometry's pool is to hold a full batch (a full-batch pool, on a kind whose
    device sizes its pool the device's own count), the blocks the engine really holds do: the
    KV cache the device allocated and the scheduler's pool (``check_engine_serves_full_batch``,
    as ``suites/test_capacity.py`` asks). A smaller or given pool is judged by what it holds."""
    if geometry.pool_holds_batch is not True:
        return []
    ledger = _pool(trace)
    if ledger is None or not ledger.block_size:
        return []
    need = blocks_needed(geometry.max_model_len, geometry.max_num_seqs, ledger.block_size,
                         len(ledger.pad_blocks))
    pool = KvPool(num_blocks=ledger.num_blocks, block_size=ledger.block_size,
                  pad_blocks=len(ledger.pad_blocks), source=ledger.source,
                  device_blocks=ledger.device_blocks)
    return [check_engine_serves_full_batch(need, pool)]


def prefix_verdicts(geometry: Geometry, requests: Sequence[RequestShape],
                    capabilities: Collection[str], scenario: Scenario,
                    trace: Trace) -> list[Verdict]:
    """With prefix caching on, each request that runs to its end is served its prompt as
    ``check_prefix_reuse``'s rules give (the cached tokens its block-aligned shared prefix
    gives, only the rest computed, the runner's chunk-aligned take), where those rules hold:
    the scheduler preempted nothing (a recompute serves a prompt twice) and evicted nothing,
    which a pool with a block for every block of every request's prompt and output guarantees
    (no block is handed out twice, so no cached block is reused). A request the run aborts is
    not judged, but the blocks it computed serve the others (its prompt from ``scenario``)."""
    if not geometry.prefix_caching or PREFIX_CACHING not in capabilities:
        return []
    pool = _pool(trace)
    if pool is None or not pool.prefix_caching or not pool.block_size:
        return []
    taken = sum(math.ceil((r.prompt_len + r.max_tokens) / pool.block_size) for r in requests)
    if taken > pool.num_blocks - len(pool.pad_blocks):
        return []
    # Preempted by the scheduler's own signals (its counter, per request, per step). The
    # executor's token count is not asked: a prompt served wrongly moves it, and that is
    # what this check is to name.
    count = count_preemptions(trace)
    if (count.metric or 0) > 0 or count.total_by_request or count.total_by_step:
        return []
    completing = {r.request_id for r in scenario.completing().requests}
    prompts = {r.request_id: r.prompt_token_ids for r in scenario.requests}
    return [check_prefix_reuse(trace, judged=completing, prompts=prompts)]


def boundary_verdicts(requests: Sequence[RequestShape], capabilities: Collection[str],
                      trace: Trace) -> list[Verdict]:
    """Blocks follow tokens, where they do one to one: vLLM's pool the harness sizes
    (``harness_sized_pool``), prefix caching off, and a request that runs past its first step
    (one of max_tokens 1 may own no block after any step, and then nothing is checked)."""
    if HARNESS_SIZED_POOL not in capabilities or all(r.max_tokens < 2 for r in requests):
        return []
    pool = next((s for r in trace.ledger_steps() for s in r.kv
                 if s.source == SOURCE_VLLM_SCHEDULER and s.block_size), None)
    if pool is None or pool.prefix_caching or pool.block_size is None:
        return []
    return [check_blocks_follow_tokens(trace, pool.block_size)]


class Judge:
    """Judges the examples run for one target variant and model in one session."""

    def __init__(self, hil: HilSession, model: Model, variant: TargetVariant,
                 holds_back_for_tkv: bool = False) -> None:
        self.hil = hil
        self.model = model
        self.variant = variant
        self.holds_back_for_tkv = holds_back_for_tkv

    def verdicts(self, geometry: Geometry, requests: Sequence[RequestShape], scenario: Scenario,
                 trace: Trace) -> list[Verdict]:
        """Every verdict of the run ``trace`` of ``requests`` (as ``scenario``) in
        ``geometry``, in the order a failure is reported by: ledgers, aborts, tokens, batch."""
        verdicts = [self.hil.check_ledger(trace), self.hil.check_aborts(scenario, trace)]
        if scenario.completing().requests:
            verdicts.append(self.hil.check_tokens(self.model, scenario, trace))
        capabilities = self.variant.capabilities
        verdicts += prefix_verdicts(geometry, requests, capabilities, scenario, trace)
        verdicts += capacity_verdicts(geometry, trace)
        verdicts += batch_verdicts(geometry, requests, capabilities, trace,
                                   self.holds_back_for_tkv)
        verdicts += boundary_verdicts(requests, capabilities, trace)
        return verdicts
