"""Engine-side readers of the Spyre plugin's own KV ledgers, registered with
``harness.in_engine.probes`` (imported in the engine process through the kind's
``probe_modules``). Each reads a live object and never changes it.

* sendnn-inference 2.x (2.6.3 read and run): vLLM's scheduler pool is the ledger (block 0
  is its null block, also the runner's left-padding block); the scheduler's
  ``reserved_blocks`` are promises still outstanding, and the runner's own block table
  (``runner.requests[id].block_ids``) and the block count of the KV cache the runner
  allocated (``device_kv_blocks``, sized apart from the pool) are read beside it; so are the
  scheduler's side of the batch TKV limit (``read_batch_tkv``: pausing, chunk, predicted TKV)
  and what the runner takes from the prefix cache per request (``runner_cached_tokens``).
* vllm-spyre 1.x (1.10.0 read and run): the runner's own ``kv_cache_manager`` (a vLLM
  ``FullAttentionManager``) and its ``block_pool``; block 0 is the pool's null block and
  stands for padding. The vLLM scheduler's pool is a stand-in whose block size is
  ``max_model_len``.
* vllm-spyre 0.3.x-0.4.0: ``free_blocks`` (deque of ints), ``req_ids2blocks`` and
  ``dummy_req_ids2blocks`` (blocks of the dummy request that pads a decode batch of one
  to two); no pad block.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from harness.core.trace import KvSnapshot
from harness.in_engine import probes
from harness.in_engine.probe_delta import DeltaTracker
from harness.targets.spyre.ledger_sources import SOURCE_SPYRE_LEGACY_RUNNER, SOURCE_SPYRE_RUNNER

# Owner id of the legacy runner's batch-padding dummy request (it has no request id).
LEGACY_DUMMY_ID = "dummy"


def read_promises(scheduler: Any, snap: KvSnapshot) -> bool:
    """sendnn-inference 2.x: what the scheduler's admission still promises (its
    ``reserved_blocks``) onto vLLM's scheduler snapshot; False for another scheduler."""
    promised = getattr(scheduler, "reserved_blocks", None)
    if not isinstance(promised, dict):
        return False
    snap.promised = {str(k): int(v) for k, v in promised.items()}
    snap.promised_total = probes.opt_int(getattr(scheduler, "total_reserved_blocks", None))
    snap.serving = [str(r) for r in list(scheduler.requests)]
    return True


def runner_block_table(runner: Any) -> dict[str, list[int]] | None:
    """The block ids a sendnn-inference 2.x runner holds per request (its own copy, which it
    pads on the left with block 0 when it builds a batch); None for other runners."""
    if getattr(runner, "kv_cache_manager", None) is not None:  # 1.x: the runner's own pool
        return None
    return probes.request_block_table(runner)


def read_batch_tkv(scheduler: Any, snap: KvSnapshot) -> None:
    """sendnn-inference 2.x: whether its scheduler pauses to keep the batch TKV limit (the
    plugin's ``SENDNN_INFERENCE_PAUSING_ENABLED`` as the scheduler's module reads it), its
    chunk, and the TKV it predicts for the next decode of the requests decoding now
    (``predict_next_decode_tkv``: a pure computation over the requests, changes nothing)."""
    snap.chunk_size = probes.opt_int(getattr(scheduler, "chunk_size", None))
    envs = getattr(inspect.getmodule(type(scheduler)), "envs_spyre", None)
    pausing = getattr(envs, "SENDNN_INFERENCE_PAUSING_ENABLED", None)
    snap.pausing = None if pausing is None else bool(pausing)
    predict = getattr(scheduler, "predict_next_decode_tkv", None)
    if callable(predict):
        prefilling = list(getattr(scheduler, "ongoing_prefills", ()))
        decoding = [r for r in list(scheduler.running) if r not in prefilling]
        snap.predicted_tkv = int(predict(decoding))
        snap.predicted_batch = [str(r.request_id) for r in decoding]


def runner_cached_tokens(runner: Any) -> dict[str, int] | None:
    """Per request a sendnn-inference 2.x runner holds: the prompt tokens it takes from the
    prefix cache (its ``usable_blocks`` times its block size; it computes the rest of the
    prompt, whole chunks); None for other runners."""
    table = getattr(runner, "requests", None)
    block_size = getattr(runner, "block_size", None)
    if not isinstance(table, dict) or block_size is None:
        return None
    return {str(r): int(s.usable_blocks) * int(block_size)
            for r, s in list(table.items()) if hasattr(s, "usable_blocks")}



def device_kv_blocks(runner: Any) -> int | None:
    """How many blocks the KV cache the Spyre model allocated holds: the smallest first
    dimension over its layers' key and value tensors (``past_key_value_states``: per layer
    ``(k, v)`` of ``[num_blocks, block_size, kv_heads, head_dim]``), read from their shapes,
    no data touched. sendnn-inference 2.x keeps them on ``runner.model``, vllm-spyre 0.x-1.x
    on ``runner.model.model``. None before the model is loaded, or where it keeps none."""
    for path in (("model",), ("model", "model")):
        try:
            holder = runner
            for name in path:
                holder = getattr(holder, name)
            layers = holder.past_key_value_states
            counts = [int(t.shape[0]) for layer in layers for t in layer]
        except (AssertionError, AttributeError, IndexError, TypeError):
            continue  # 2.x's ``model`` asserts that it is loaded
        if counts:
            return min(counts)
    return None


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
    snap = probes.pool_snapshot(
        SOURCE_SPYRE_RUNNER,
        pool,
        [kvm],
        reserved=reserved,
        reported_free=reported,
        tkv=probes.opt_int(getattr(runner, "tkv", None)),
        block_size=probes.opt_int(getattr(runner, "block_size", None)),
        tracker=tracker,
    )
    # The runner's request table, read apart from its reservations (check_reported_free).
    table = getattr(runner, "requests", None)
    snap.serving = None if table is None else [str(r) for r in list(table)]
    snap.device_blocks = device_kv_blocks(runner)
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
        dummy_ids=probes.dummy_owner_ids(dummy_ids, owned),
        reserved=None,
        reported_free=None,
        tkv=probes.opt_int(getattr(runner, "tkv", None)),
        block_size=probes.opt_int(block_size),
        device_blocks=device_kv_blocks(runner),
    )



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


# The Spyre plugins' packages (harness/targets/spyre/generations.py), whose runners this reads.
PLUGIN_MODULES = ("sendnn_inference.", "vllm_spyre.")


@probes.register_rank_fact_reader
def spyre_rank_facts(runner: Any) -> dict[str, Any] | None:
    """What one rank's sendnn-inference 2.x runner holds for the ledgers (in the rank's own
    process): the fields ``read_spyre_ledgers`` sets from a one-rank engine's runner; None for
    vLLM's own runners and the 1.x and 0.x ones (whose pool is the runner's own)."""
    if runner is None or not type(runner).__module__.startswith(PLUGIN_MODULES):
        return None
    table = runner_block_table(runner)
    if table is None:
        return None
    return {"runner_blocks": table, "device_blocks": device_kv_blocks(runner),
            "runner_cached": runner_cached_tokens(runner)}


@probes.register_runner_reader
def read_spyre_ledgers(scheduler: Any, runner: Any, snaps: list[KvSnapshot],
                       tracker: DeltaTracker | None) -> bool:
    """2.x: promises and the runner's table on the scheduler's snapshot; 1.x and 0.x: the
    runner's own pool as a second snapshot (the scheduler's is a stand-in there)."""
    if read_promises(scheduler, snaps[0]):
        if runner is not None:
            snaps[0].runner_blocks = runner_block_table(runner)
            # The pool is the scheduler's; the KV cache it indexes is the runner's.
            snaps[0].device_blocks = device_kv_blocks(runner)
            snaps[0].runner_cached = runner_cached_tokens(runner)
        read_batch_tkv(scheduler, snaps[0])
        return True
    if runner is None:
        return False
    if is_spyre_runner(runner):
        snaps.append(snapshot_spyre_runner(runner, tracker))
        return True
    if is_legacy_spyre_runner(runner):
        snaps.append(snapshot_legacy_spyre_runner(runner))
        return True
    return False
