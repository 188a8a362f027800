"""Engine-side probes: read the KV block ledgers of a live vLLM or vllm-spyre engine.

Each adapter reads a live object (vLLM's scheduler, vllm-spyre's continuous-batching
model runner, or the legacy 0.3.x-0.4.0 runner) and never changes it; it returns a
``KvSnapshot`` (``harness.core.trace``). Runs inside the engine process.

Where the blocks live:

* vLLM V1: ``scheduler.kv_cache_manager`` (``KVCacheManager``) ->
  ``coordinator.single_type_managers[i].req_to_blocks`` and ``block_pool``
  (``blocks``, ``free_block_queue``, ``null_block``). Block 0 is the null block.
* sendnn-inference 2.x (2.6.3 read and run): vLLM's scheduler pool above is the ledger
  (block 0 is its null block, also the runner's left-padding block); the scheduler's
  ``reserved_blocks`` are promises still outstanding, and the runner's own block table
  (``runner.requests[id].block_ids``) is read beside it.
* vllm-spyre 1.x (1.10.0 read and run): the runner's own ``kv_cache_manager``
  (a vLLM ``FullAttentionManager``) and its ``block_pool``; block 0 is the pool's
  null block and stands for padding. The vLLM scheduler's pool is a stand-in whose
  block size is ``max_model_len``.
* vllm-spyre 0.3.x-0.4.0: ``free_blocks`` (deque of ints), ``req_ids2blocks`` and
  ``dummy_req_ids2blocks`` (blocks of the dummy request that pads a decode batch
  of one to two); no pad block.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from harness.core.trace import (
    SOURCE_SPYRE_LEGACY_RUNNER,
    SOURCE_SPYRE_RUNNER,
    SOURCE_VLLM_SCHEDULER,
    KvSnapshot,
    is_dummy_id,
)
from harness.in_engine.probe_delta import DeltaTracker

# Owner id of the legacy runner's batch-padding dummy request (it has no request id).
LEGACY_DUMMY_ID = "dummy"

# Managers that legitimately put the null block in a request's list as a placeholder.
_NULL_PLACEHOLDER_ATTRS = ("sliding_window", "attention_chunk_size", "mamba_cache_mode")

def _walk_free_queue(queue: Any, limit: int) -> list[int]:
    # Follows the links get_all_free_blocks() follows, but stops on a cycle.
    if hasattr(queue, "fake_free_list_head"):  # vLLM >= 0.10: sentinel head and tail
        tail = queue.fake_free_list_tail
        block = queue.fake_free_list_head.next_free_block
    else:  # vLLM 0.9: real head block, list ends in None
        tail = None
        block = queue.free_list_head
    ids: list[int] = []
    while block is not None and block is not tail and len(ids) <= limit:
        ids.append(int(block.block_id))
        block = block.next_free_block
    return ids


def _ref_counts(pool: Any, owned: Mapping[str, list[int]], pad: Iterable[int]) -> dict[int, int]:
    pad_set = set(pad)
    blocks = pool.blocks
    owned_ids = {b for ids in owned.values() for b in ids}
    counts: dict[int, int] = {}
    for block in blocks:
        bid = int(block.block_id)
        if bid in pad_set:
            continue
        if block.ref_cnt != 0 or bid in owned_ids:
            counts[bid] = int(block.ref_cnt)
    return counts


def _owned_from_managers(managers: Iterable[Any], null_block: Any) -> dict[str, list[int]]:
    owned: dict[str, list[int]] = {}
    for manager in managers:
        skips_null = any(getattr(manager, a, None) is not None for a in _NULL_PLACEHOLDER_ATTRS)
        # items() only: req_to_blocks is a defaultdict and indexing it would insert keys.
        for req_id, blocks in list(manager.req_to_blocks.items()):
            ids = [
                int(b.block_id)
                for b in blocks
                if not (skips_null and null_block is not None and b is null_block)
            ]
            if ids:
                owned.setdefault(str(req_id), []).extend(ids)
    return owned


def _dummy_ids(*id_sets: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for ids in id_sets:
        for r in ids:
            if is_dummy_id(r):
                seen[r] = None
    return list(seen)


def _vllm_managers(kv_cache_manager: Any) -> list[Any]:
    coordinator = getattr(kv_cache_manager, "coordinator", None)
    if coordinator is not None:
        return list(coordinator.single_type_managers)
    # vLLM 0.8.x had one manager and no coordinator; earlier ones kept req_to_blocks here.
    single = getattr(kv_cache_manager, "single_type_manager", None)
    return [single] if single is not None else [kv_cache_manager]


def _pool_snapshot(
    source: str,
    pool: Any,
    managers: list[Any],
    *,
    reserved: dict[str, int] | None,
    reported_free: int | None,
    tkv: int | None,
    block_size: int | None,
    tracker: DeltaTracker | None = None,
) -> KvSnapshot:
    null_block = getattr(pool, "null_block", None)
    pad = [int(null_block.block_id)] if null_block is not None else []
    num_blocks = len(pool.blocks)
    owned = _owned_from_managers(managers, null_block)
    counted = int(pool.free_block_queue.num_free_blocks)
    snap = KvSnapshot(
        source=source,
        num_blocks=num_blocks,
        pad_blocks=pad,
        owned=owned,
        dummy_ids=_dummy_ids(owned, reserved or {}),
        reserved=reserved,
        reported_free=reported_free,
        tkv=tkv,
        block_size=block_size,
        counted_free=counted,
        prefix_caching=bool(getattr(pool, "enable_caching", False)),
    )
    owned_ids = {b for ids in owned.values() for b in ids} - set(pad) if tracker else set()
    delta = tracker.delta(source, pool, owned_ids, counted) if tracker else None
    if delta is not None:  # O(owned): the host follows the deltas (harness.core.kv_delta)
        snap.free_taken, snap.free_returned = delta.taken, delta.returned
        snap.ref_counts = delta.ref_counts
        return snap
    snap.free_blocks = _walk_free_queue(pool.free_block_queue, num_blocks)
    snap.ref_counts = _ref_counts(pool, owned, pad)
    if tracker:
        tracker.record_full(source, owned_ids, counted)
    return snap


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def snapshot_vllm_scheduler(scheduler: Any, tracker: DeltaTracker | None = None) -> KvSnapshot:
    """Read a vLLM V1 ``Scheduler``'s block ledger without changing it.

    vLLM's scheduler reads its pool directly, so ``reported_free`` and ``reserved``
    are None; ``counted_free`` is the pool counter its admission uses. Null-block
    placeholders of sliding-window, chunked-local and Mamba managers are not owned.
    With ``tracker``, a large pool's snapshot may be a delta (``harness.in_engine.probe_delta``).
    """
    kvm = scheduler.kv_cache_manager
    pool = kvm.block_pool
    managers = _vllm_managers(kvm)
    block_size = getattr(managers[0], "block_size", None) if managers else None
    snap = _pool_snapshot(
        SOURCE_VLLM_SCHEDULER,
        pool,
        managers,
        reserved=None,
        reported_free=None,
        tkv=_opt_int(getattr(scheduler, "tkv", None)),
        block_size=_opt_int(block_size),
        tracker=tracker,
    )
    promised = getattr(scheduler, "reserved_blocks", None)
    if isinstance(promised, dict):  # sendnn-inference 2.x: what admission still promises
        snap.promised = {str(k): int(v) for k, v in promised.items()}
        snap.promised_total = _opt_int(getattr(scheduler, "total_reserved_blocks", None))
        snap.serving = [str(r) for r in list(scheduler.requests)]
    return snap


def runner_block_table(runner: Any) -> dict[str, list[int]] | None:
    """The block ids a sendnn-inference 2.x runner holds per request (its own copy, which it
    pads on the left with block 0 when it builds a batch); None for other runners."""
    table = getattr(runner, "requests", None)
    if not isinstance(table, dict) or getattr(runner, "kv_cache_manager", None) is not None:
        return None
    out: dict[str, list[int]] = {}
    for req_id, state in list(table.items()):
        ids = getattr(state, "block_ids", None)
        if ids is None:
            continue
        if ids and isinstance(ids[0], (list, tuple)):  # one list per KV cache group
            ids = [b for group in ids for b in group]
        out[str(req_id)] = [int(b) for b in ids]
    return out


def snapshot_spyre_runner(runner: Any, tracker: DeltaTracker | None = None) -> KvSnapshot:
    """Read a vllm-spyre 1.x continuous-batching runner's ledger without changing it.

    Works for ``ContinuousBatchingSpyreModelRunner`` and ``ChunkedPrefillModelRunner``.
    ``reported_free`` is what the getter ``get_n_free_blocks()`` returns, the value
    the runner sends the scheduler each step (CB: ``n_blocks`` minus all reservations;
    chunked prefill: the pool's counter). ``reserved`` is ``req_ids2num_reserved_blocks``;
    None for a chunked-prefill runner with no reservations (that runner does not reserve).
    """
    kvm = runner.kv_cache_manager
    pool = kvm.block_pool
    raw_reserved = dict(getattr(runner, "req_ids2num_reserved_blocks", None) or {})
    chunked = hasattr(runner, "chunk_blocks_count")
    reserved = (
        None if chunked and not raw_reserved else {str(k): int(v) for k, v in raw_reserved.items()}
    )
    getter = getattr(runner, "get_n_free_blocks", None)
    if callable(getter):
        reported: int | None = int(getter())
    elif hasattr(runner, "n_blocks"):
        reported = int(runner.n_blocks) - sum((reserved or {}).values())
    else:
        reported = None
    snap = _pool_snapshot(
        SOURCE_SPYRE_RUNNER,
        pool,
        [kvm],
        reserved=reserved,
        reported_free=reported,
        tkv=_opt_int(getattr(runner, "tkv", None)),
        block_size=_opt_int(getattr(runner, "block_size", None)),
        tracker=tracker,
    )
    # The runner's request table, read apart from its reservations (check_reported_free).
    table = getattr(runner, "requests", None)
    snap.serving = None if table is None else [str(r) for r in list(table)]
    return snap


def _legacy_total_blocks(runner: Any, ledger_ids: Iterable[int]) -> int:
    # The KV tensors' first dimension is the pool size the device actually has.
    try:
        past = runner.model.model.past_key_value_states
        return int(past[0][0].shape[0])
    except (AttributeError, IndexError, TypeError, KeyError):
        pass
    n_blocks = getattr(runner, "n_blocks", None)
    if n_blocks is not None:
        return int(n_blocks)
    ids = list(ledger_ids)
    return max(len(ids), max(ids, default=-1) + 1)


def snapshot_legacy_spyre_runner(runner: Any) -> KvSnapshot:
    """Read a vllm-spyre 0.3.x-0.4.0 continuous-batching runner's ledger without changing it.

    Request blocks come from ``req_ids2blocks``; the batch-padding dummy's blocks
    (``dummy_req_ids2blocks``, a list of ids) are owned by ``LEGACY_DUMMY_ID``
    (a mapping form is owned by ``dummy:<key>``). ``num_blocks`` is the first
    dimension of the model's KV tensors when readable. No pad block, no reservations.
    """
    free = [int(b) for b in runner.free_blocks]
    owned: dict[str, list[int]] = {}
    for req_id, blocks in list(runner.req_ids2blocks.items()):
        ids = [int(b) for b in blocks]
        if ids:
            owned[str(req_id)] = ids
    dummy_ids: list[str] = []
    dummy = getattr(runner, "dummy_req_ids2blocks", None) or []
    if isinstance(dummy, Mapping):
        for key, blocks in dummy.items():
            ids = [int(b) for b in blocks]
            if ids:
                owned[f"dummy:{key}"] = ids
                dummy_ids.append(f"dummy:{key}")
    else:
        ids = [int(b) for b in dummy]
        if ids:
            owned[LEGACY_DUMMY_ID] = ids
            dummy_ids.append(LEGACY_DUMMY_ID)
    ledger = free + [b for ids in owned.values() for b in ids]
    block_size = getattr(runner, "BLOCK_SIZE", None) or getattr(runner, "block_size", None)
    return KvSnapshot(
        source=SOURCE_SPYRE_LEGACY_RUNNER,
        num_blocks=_legacy_total_blocks(runner, ledger),
        pad_blocks=[],
        free_blocks=free,
        owned=owned,
        dummy_ids=_dummy_ids(dummy_ids, owned),
        reserved=None,
        reported_free=None,
        tkv=_opt_int(getattr(runner, "tkv", None)),
        block_size=_opt_int(block_size),
    )


def _model_runner(engine_core: Any) -> Any:
    executor = getattr(engine_core, "model_executor", None)
    worker = getattr(executor, "driver_worker", None)
    # WorkerWrapperBase wraps the worker; older layouts expose the runner directly.
    inner = getattr(worker, "worker", None) or worker
    return getattr(inner, "model_runner", None)


def is_spyre_runner(runner: Any) -> bool:
    """True for a vllm-spyre 1.x continuous-batching runner whose block pool is set up."""
    kvm = getattr(runner, "kv_cache_manager", None)
    return (
        hasattr(runner, "req_ids2num_reserved_blocks")
        and hasattr(kvm, "req_to_blocks")
        and hasattr(kvm, "block_pool")
    )


def is_legacy_spyre_runner(runner: Any) -> bool:
    """True for a vllm-spyre 0.3.x-0.4.0 continuous-batching runner."""
    return (
        hasattr(runner, "req_ids2blocks")
        and hasattr(runner, "free_blocks")
        and hasattr(runner, "dummy_req_ids2blocks")
    )


def snapshot_engine(engine_core: Any, tracker: DeltaTracker | None = None) -> list[KvSnapshot]:
    """Snapshots of an in-process vLLM ``EngineCore``: the scheduler's, then the runner's.

    The runner (``model_executor.driver_worker.worker.model_runner``) is read only
    when it is a vllm-spyre continuous-batching runner, new or legacy, recognised by
    its attributes. With vllm-spyre the scheduler's pool is a stand-in. ``tracker``
    (one per step-driven run) lets large pools send deltas; legacy runners are always full.
    """
    snaps = [snapshot_vllm_scheduler(engine_core.scheduler, tracker)]
    runner = _model_runner(engine_core)
    if runner is not None:
        if snaps[0].promised is not None:  # 2.x: the scheduler's pool is the ledger
            snaps[0].runner_blocks = runner_block_table(runner)
        elif is_spyre_runner(runner):
            snaps.append(snapshot_spyre_runner(runner, tracker))
        elif is_legacy_spyre_runner(runner):
            snaps.append(snapshot_legacy_spyre_runner(runner))
    return snaps

