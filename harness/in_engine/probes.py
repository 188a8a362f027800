"""Engine-side probes: read the KV block ledgers of a live vLLM engine.

Each adapter reads a live object and never changes it; it returns a ``KvSnapshot``
(``harness.core.trace``). Runs inside the engine process.

vLLM V1 keeps its blocks in ``scheduler.kv_cache_manager`` (``KVCacheManager``) ->
``coordinator.single_type_managers[i].req_to_blocks`` and ``block_pool`` (``blocks``,
``free_block_queue``, ``null_block``); block 0 is the null block. A plugin that keeps
a ledger of its own (a runner's pool, promises, a runner's block table) registers a
reader for it (``register_runner_reader``) from its kind's probe module, which the engine
process imports by the name its configuration carries (the Spyre kind's is
``harness.targets.spyre.ledger``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from harness.core.trace import SOURCE_VLLM_SCHEDULER, KvSnapshot, is_dummy_id
from harness.in_engine.probe_delta import DeltaTracker

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


def dummy_owner_ids(*id_sets: Iterable[str]) -> list[str]:
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


def pool_snapshot(
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
        dummy_ids=dummy_owner_ids(owned, reserved or {}),
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


def opt_int(value: Any) -> int | None:
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
    snap = pool_snapshot(
        SOURCE_VLLM_SCHEDULER,
        pool,
        managers,
        reserved=None,
        reported_free=None,
        tkv=opt_int(getattr(scheduler, "tkv", None)),
        block_size=opt_int(block_size),
        tracker=tracker,
    )
    return snap


def vllm_runner_kv_blocks(runner: Any) -> int | None:
    """How many blocks the KV cache of one of vLLM's own model runners (GPU, CPU) holds: per
    layer tensor of ``runner.kv_caches``, its storage's bytes over a block's page size
    (``kv_cache_config``), as vLLM itself sizes it; the smallest over the layers. Metadata
    only, no data touched. None for a plugin's runner (its kind's probe module reads that),
    before the cache exists, or for layouts this does not cover (page sizes that differ
    between groups, blocks packed across layers, one cache across layers)."""
    if runner is None or not type(runner).__module__.startswith("vllm."):
        return None
    try:
        caches = list(runner.kv_caches)
        config = runner.kv_cache_config
        pages = {int(g.kv_cache_spec.page_size_bytes) for g in config.kv_cache_groups}
        packed = any(getattr(t, "block_stride", 0) for t in config.kv_cache_tensors)
        counts = [int(t.untyped_storage().nbytes()) for t in caches]
    except (AttributeError, TypeError):
        return None
    if (not counts or len(pages) != 1 or packed
            or getattr(runner, "cross_layers_kv_cache", None) is not None):
        return None
    (page,) = pages
    return min(counts) // page if page > 0 else None


def _model_runner(engine_core: Any) -> Any:
    executor = getattr(engine_core, "model_executor", None)
    worker = getattr(executor, "driver_worker", None)
    # WorkerWrapperBase wraps the worker; older layouts expose the runner directly.
    inner = getattr(worker, "worker", None) or worker
    return getattr(inner, "model_runner", None)


# Readers of a plugin's own ledger, registered by the engine's kind's probe modules
# (``TargetKind.probe_modules``, named in the engine's configuration and imported by the engine
# process: ``harness.in_engine.kind_modules``).
# Each reads the scheduler and the model runner beside vLLM's scheduler snapshot: it adds
# what its plugin keeps (its own pool, promises, a runner's block table) to ``snaps`` and
# says True, or says False for a scheduler and runner that are not its plugin's.
RunnerReader = Callable[[Any, Any, list[KvSnapshot], "DeltaTracker | None"], bool]
RUNNER_READERS: list[RunnerReader] = []


def register_runner_reader(reader: RunnerReader) -> RunnerReader:
    if reader not in RUNNER_READERS:
        RUNNER_READERS.append(reader)
    return reader


# Readers of what one rank's model runner holds for the KV ledgers, registered by the kinds'
# probe modules beside their runner readers: each takes a runner and returns the
# ``KvSnapshot`` fields it sets on the scheduler's snapshot (``runner_blocks``,
# ``device_blocks``, ``runner_cached``), or None for a runner not its plugin's. Run in each
# rank's own process (``harness.in_engine.ranks``), where a tensor-parallel engine's runners are.
RankFactReader = Callable[[Any], "dict[str, Any] | None"]
RANK_FACT_READERS: list[RankFactReader] = []
# The snapshot fields a rank's facts may set.
RANK_FIELDS = ("runner_blocks", "device_blocks", "runner_cached")


def register_rank_fact_reader(reader: RankFactReader) -> RankFactReader:
    if reader not in RANK_FACT_READERS:
        RANK_FACT_READERS.append(reader)
    return reader


def request_block_table(runner: Any) -> dict[str, list[int]] | None:
    """The block ids a runner's request table holds per request (vLLM's runners and the
    plugins' keep ``requests[id].block_ids``, one list per KV cache group); None where it
    keeps no such table."""
    table = getattr(runner, "requests", None)
    if not isinstance(table, dict):
        return None
    out: dict[str, list[int]] = {}
    for req_id, state in list(table.items()):
        ids = getattr(state, "block_ids", None)
        if ids is None:
            continue
        if ids and isinstance(ids[0], (list, tuple)):
            ids = [b for group in ids for b in group]
        out[str(req_id)] = [int(b) for b in ids]
    return out


def rank_runner_facts(runner: Any) -> dict[str, Any]:
    """What one rank's ``runner`` holds: the snapshot fields its kind's reader sets
    (``fields``; vLLM's own runner: its KV cache's block count) and its request block table
    (``table``), which every rank of an engine must hold alike."""
    for reader in RANK_FACT_READERS:
        found = reader(runner)
        if found is not None:
            fields = found
            break
    else:
        fields = {"device_blocks": vllm_runner_kv_blocks(runner)}
    return {"fields": {k: v for k, v in fields.items() if k in RANK_FIELDS},
            "table": request_block_table(runner)}


def snapshot_engine(engine_core: Any, tracker: DeltaTracker | None = None,
                    rank_executor: Any = None) -> list[KvSnapshot]:
    """Snapshots of an in-process vLLM ``EngineCore``: the scheduler's, then what a registered
    reader finds in the plugin's scheduler and model runner
    (``model_executor.driver_worker.worker.model_runner``); where no reader claims the runner,
    the block count of vLLM's own runner's KV cache on the scheduler's. ``tracker`` (one per
    step-driven run) lets large pools send deltas. In a tensor-parallel engine the harness
    started with its rank extension (``rank_executor``: the engine's executor) the runners are
    in the ranks' processes: each rank is asked for its runner's facts, rank 0's are set on
    the scheduler's snapshot as a one-rank engine's runner's would be, and every rank's are kept
    there (``KvSnapshot.ranks``) for the ranks' agreement (harness.checks.ranks)."""
    snaps = [snapshot_vllm_scheduler(engine_core.scheduler, tracker)]
    if rank_executor is not None:
        facts = list(rank_executor.collective_rpc("hil_runner_facts"))
        for reader in RUNNER_READERS:  # the scheduler's part of the plugin's ledgers
            if reader(engine_core.scheduler, None, snaps, tracker):
                break
        for key, value in (facts[0]["fields"] if facts else {}).items():
            setattr(snaps[0], key, value)
        snaps[0].ranks = facts
        return snaps
    runner = _model_runner(engine_core)
    for reader in RUNNER_READERS:
        if reader(engine_core.scheduler, runner, snaps, tracker):
            break
    else:  # vLLM's own runner: the KV cache its scheduler's pool indexes
        snaps[0].device_blocks = vllm_runner_kv_blocks(runner)
    return snaps
