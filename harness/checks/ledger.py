"""KV-cache block ledgers read from live engines, and the invariants they must keep.

A ``KvSnapshot`` is one block ledger at one moment, as plain data: which blocks
are free, which request holds which blocks, which are reserved for padding.
Adapters read a live object (vLLM's scheduler, vllm-spyre's continuous-batching
model runner, or the legacy 0.3.x-0.4.0 runner) and never change it. Invariant
checks are pure functions of snapshots and return ``Violation`` lists; an empty
list means the invariant holds.

Where the blocks live:

* vLLM V1: ``scheduler.kv_cache_manager`` (``KVCacheManager``) ->
  ``coordinator.single_type_managers[i].req_to_blocks`` and ``block_pool``
  (``blocks``, ``free_block_queue``, ``null_block``). Block 0 is the null block.
* vllm-spyre 1.x (1.10.0 read and run): the runner's own ``kv_cache_manager``
  (a vLLM ``FullAttentionManager``) and its ``block_pool``; block 0 is the pool's
  null block and stands for padding. The vLLM scheduler's pool is a stand-in whose
  block size is ``max_model_len``.
* vllm-spyre 0.3.x-0.4.0: ``free_blocks`` (deque of ints), ``req_ids2blocks`` and
  ``dummy_req_ids2blocks`` (blocks of the dummy request that pads a decode batch
  of one to two); no pad block.

Deferred freeing: vLLM hands finished request ids to the worker in the next
scheduler output, so a runner still holds a finished request's blocks until the
engine schedules one more step. Only call ``check_idle_all_free`` on a snapshot
taken after that step (when ``scheduler.has_requests()`` is false).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

SOURCE_VLLM_SCHEDULER = "vllm-scheduler"
SOURCE_SPYRE_RUNNER = "spyre-runner"
SOURCE_SPYRE_LEGACY_RUNNER = "spyre-legacy-runner"

# Owner id of the legacy runner's batch-padding dummy request (it has no request id).
LEGACY_DUMMY_ID = "dummy"
# Id prefixes of warmup requests ("warmup-0" in CB, "warmup_0" in static batching) and dummies.
DUMMY_ID_PREFIXES = ("warmup-", "warmup_", "dummy")

# Managers that legitimately put the null block in a request's list as a placeholder.
_NULL_PLACEHOLDER_ATTRS = ("sliding_window", "attention_chunk_size", "mamba_cache_mode")


@dataclass
class KvSnapshot:
    """One KV block ledger at one moment.

    ``num_blocks`` counts every block of the pool, pad blocks included; block ids
    are ``range(num_blocks)``. ``free_blocks`` is the free list in its own order,
    duplicates kept. ``owned`` maps each request id (dummies included) that holds
    at least one block to its blocks in order. ``reserved`` and ``reported_free``
    are None where the stack has no such notion. ``counted_free`` is the count the
    pool keeps beside its free list (vLLM's ``num_free_blocks``). ``ref_counts``
    holds the pool's reference count of every non-pad block that is owned or has a
    nonzero count (absent means 0); ``prefix_caching`` says whether blocks may be shared.
    """

    source: str
    num_blocks: int
    pad_blocks: list[int] = field(default_factory=list)
    free_blocks: list[int] = field(default_factory=list)
    owned: dict[str, list[int]] = field(default_factory=dict)
    dummy_ids: list[str] = field(default_factory=list)
    reserved: dict[str, int] | None = None
    reported_free: int | None = None
    tkv: int | None = None
    block_size: int | None = None
    counted_free: int | None = None
    ref_counts: dict[int, int] | None = None
    prefix_caching: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (all mapping keys are strings)."""
        d = asdict(self)
        if self.ref_counts is not None:
            d["ref_counts"] = {str(k): v for k, v in self.ref_counts.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KvSnapshot:
        """Inverse of ``to_dict``; optional keys may be missing."""
        reserved = d.get("reserved")
        ref_counts = d.get("ref_counts")
        return cls(
            source=str(d["source"]),
            num_blocks=int(d["num_blocks"]),
            pad_blocks=[int(b) for b in d.get("pad_blocks", [])],
            free_blocks=[int(b) for b in d.get("free_blocks", [])],
            owned={str(k): [int(b) for b in v] for k, v in d.get("owned", {}).items()},
            dummy_ids=[str(r) for r in d.get("dummy_ids", [])],
            reserved=None if reserved is None else {str(k): int(v) for k, v in reserved.items()},
            reported_free=None if d.get("reported_free") is None else int(d["reported_free"]),
            tkv=None if d.get("tkv") is None else int(d["tkv"]),
            block_size=None if d.get("block_size") is None else int(d["block_size"]),
            counted_free=None if d.get("counted_free") is None else int(d["counted_free"]),
            ref_counts=None
            if ref_counts is None
            else {int(k): int(v) for k, v in ref_counts.items()},
            prefix_caching=bool(d.get("prefix_caching", False)),
        )

    def free_count(self) -> int:
        """Distinct usable (non-pad) blocks in the free list."""
        return len(set(self.free_blocks) - set(self.pad_blocks))

    def summary(self) -> str:
        """One line: source, free count, owners with block counts, pad blocks."""
        owners = " ".join(f"{r}:{len(b)}" for r, b in self.owned.items()) or "-"
        rep = "" if self.reported_free is None else f" reported={self.reported_free}"
        tkv = "" if self.tkv is None else f" tkv={self.tkv}"
        return (
            f"{self.source}: {self.num_blocks} blocks, free={len(self.free_blocks)}{rep}"
            f" pad={self.pad_blocks} owned[{owners}]{tkv}"
        )


@dataclass(frozen=True)
class Violation:
    """One broken invariant: a stable snake_case name and a sentence saying what was seen."""

    invariant: str
    message: str
    step: int | None = None
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return asdict(self)

    def __str__(self) -> str:
        where = "" if self.step is None else f"step {self.step}: "
        src = "" if self.source is None else f" [{self.source}]"
        return f"{where}{self.invariant}{src}: {self.message}"


# ---------------------------------------------------------------- adapters


def is_dummy_id(req_id: str) -> bool:
    """True for ids of warmup or batch-padding requests."""
    return req_id.startswith(DUMMY_ID_PREFIXES)


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
) -> KvSnapshot:
    null_block = getattr(pool, "null_block", None)
    pad = [int(null_block.block_id)] if null_block is not None else []
    num_blocks = len(pool.blocks)
    free = _walk_free_queue(pool.free_block_queue, num_blocks)
    owned = _owned_from_managers(managers, null_block)
    return KvSnapshot(
        source=source,
        num_blocks=num_blocks,
        pad_blocks=pad,
        free_blocks=free,
        owned=owned,
        dummy_ids=_dummy_ids(owned, reserved or {}),
        reserved=reserved,
        reported_free=reported_free,
        tkv=tkv,
        block_size=block_size,
        counted_free=int(pool.free_block_queue.num_free_blocks),
        ref_counts=_ref_counts(pool, owned, pad),
        prefix_caching=bool(getattr(pool, "enable_caching", False)),
    )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def snapshot_vllm_scheduler(scheduler: Any) -> KvSnapshot:
    """Read a vLLM V1 ``Scheduler``'s block ledger without changing it.

    vLLM's scheduler reads its pool directly, so ``reported_free`` and ``reserved``
    are None; ``counted_free`` is the pool counter its admission uses. Null-block
    placeholders of sliding-window, chunked-local and Mamba managers are not owned.
    """
    kvm = scheduler.kv_cache_manager
    pool = kvm.block_pool
    managers = _vllm_managers(kvm)
    block_size = getattr(managers[0], "block_size", None) if managers else None
    return _pool_snapshot(
        SOURCE_VLLM_SCHEDULER,
        pool,
        managers,
        reserved=None,
        reported_free=None,
        tkv=_opt_int(getattr(scheduler, "tkv", None)),
        block_size=_opt_int(block_size),
    )


def snapshot_spyre_runner(runner: Any) -> KvSnapshot:
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
    return _pool_snapshot(
        SOURCE_SPYRE_RUNNER,
        pool,
        [kvm],
        reserved=reserved,
        reported_free=reported,
        tkv=_opt_int(getattr(runner, "tkv", None)),
        block_size=_opt_int(getattr(runner, "block_size", None)),
    )


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


def snapshot_engine(engine_core: Any) -> list[KvSnapshot]:
    """Snapshots of an in-process vLLM ``EngineCore``: the scheduler's, then the runner's.

    The runner (``model_executor.driver_worker.worker.model_runner``) is read only
    when it is a vllm-spyre continuous-batching runner, new or legacy, recognised by
    its attributes. With vllm-spyre the scheduler's pool is a stand-in.
    """
    snaps = [snapshot_vllm_scheduler(engine_core.scheduler)]
    runner = _model_runner(engine_core)
    if runner is not None:
        if is_spyre_runner(runner):
            snaps.append(snapshot_spyre_runner(runner))
        elif is_legacy_spyre_runner(runner):
            snaps.append(snapshot_legacy_spyre_runner(runner))
    return snaps


# -------------------------------------------------------------- invariants


def _count(n: int, noun: str = "block") -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _blocks(ids: Iterable[int]) -> str:
    return "[" + ", ".join(str(b) for b in ids) + "]"


def _holders(s: KvSnapshot) -> dict[int, list[str]]:
    # block id -> owner ids, one entry per listing (so a repeat shows twice)
    holders: dict[int, list[str]] = defaultdict(list)
    for req_id, ids in s.owned.items():
        for b in ids:
            holders[b].append(req_id)
    return holders


def _v(invariant: str, s: KvSnapshot, message: str) -> Violation:
    return Violation(invariant=invariant, message=message, source=s.source)


def check_conservation(s: KvSnapshot) -> list[Violation]:
    """Free, owned and pad blocks together are exactly ``range(num_blocks)``, each in one place.

    Flags blocks that are nowhere, ids outside the pool, a block both free and owned,
    a block owned by two requests (unless prefix caching is on and the pool's ref
    count equals its number of holders), and a block listed twice by one request.
    Pad blocks in the free list or owned, and repeats within the free list, are left
    to ``check_pad_never_owned`` and ``check_no_double_free``.
    """
    name = "conservation"
    out: list[Violation] = []
    pad = set(s.pad_blocks)
    free = set(s.free_blocks)
    holders = _holders(s)

    for req_id, ids in s.owned.items():
        for b, n in sorted(Counter(ids).items()):
            if n > 1 and b not in pad:
                out.append(_v(name, s, f"request {req_id} lists block {b} {n} times"))

    for b in sorted(holders):
        if b in pad:
            continue
        owners = holders[b]
        distinct = list(dict.fromkeys(owners))
        if b in free:
            out.append(
                _v(name, s, f"block {b} is in the free list and owned by {', '.join(distinct)}")
            )
        if len(distinct) > 1:
            shared_ok = (
                s.prefix_caching and s.ref_counts is not None and s.ref_counts.get(b) == len(owners)
            )
            if not shared_ok:
                rc = "" if s.ref_counts is None else f" (ref count {s.ref_counts.get(b, 0)})"
                out.append(
                    _v(name, s, f"block {b} is owned by {' and '.join(distinct)} at once{rc}")
                )

    valid = range(s.num_blocks)
    for b in sorted({b for b in free | set(holders) | pad if b not in valid}):
        places = []
        if b in free:
            places.append("in the free list")
        if b in holders:
            places.append(f"owned by {', '.join(dict.fromkeys(holders[b]))}")
        if b in pad:
            places.append("a pad block")
        out.append(
            _v(
                name,
                s,
                f"block {b} ({'; '.join(places)}) is outside the pool of "
                f"{s.num_blocks} blocks (ids 0..{s.num_blocks - 1})",
            )
        )

    missing = [b for b in valid if b not in free and b not in holders and b not in pad]
    if missing:
        out.append(
            _v(
                name,
                s,
                f"{len(missing)} of {s.num_blocks} blocks are neither free, owned nor pad: "
                f"{_blocks(missing)}",
            )
        )
    return out


def check_pad_never_owned(s: KvSnapshot) -> list[Violation]:
    """No pad block is owned by any request or sits in the free list."""
    name = "pad_never_owned"
    out: list[Violation] = []
    holders = _holders(s)
    free = Counter(s.free_blocks)
    for b in s.pad_blocks:
        if b in holders:
            owners = ", ".join(dict.fromkeys(holders[b]))
            out.append(_v(name, s, f"pad block {b} is owned by {owners}"))
        if free[b]:
            times = "" if free[b] == 1 else f" {free[b]} times"
            out.append(_v(name, s, f"pad block {b} is in the free list{times}"))
    return out


def check_no_double_free(s: KvSnapshot) -> list[Violation]:
    """No block id appears twice in the free list."""
    return [
        _v("no_double_free", s, f"block {b} appears {n} times in the free list")
        for b, n in sorted(Counter(s.free_blocks).items())
        if n > 1
    ]


def check_free_counter(s: KvSnapshot) -> list[Violation]:
    """Where the pool keeps a free count, it equals the length of its free list.

    A block appended to vLLM's linked free list while already in it unlinks the
    blocks after it but still bumps the counter, so the two drift apart.
    """
    if s.counted_free is None or s.counted_free == len(s.free_blocks):
        return []
    return [
        _v(
            "free_counter",
            s,
            f"the pool counts {_count(s.counted_free, 'free block')} but its free list holds "
            f"{len(s.free_blocks)}",
        )
    ]


def check_ref_counts(s: KvSnapshot) -> list[Violation]:
    """Where ref counts are known, each non-pad block's count equals how often it is held.

    A free block must have count 0; a block held by k listings must have count k.
    """
    if s.ref_counts is None:
        return []
    name = "ref_counts"
    out: list[Violation] = []
    pad = set(s.pad_blocks)
    holders = _holders(s)
    for b in sorted((set(s.ref_counts) | set(holders)) - pad):
        held = holders.get(b, [])
        count = s.ref_counts.get(b, 0)
        if count != len(held):
            who = f"held by {', '.join(held)}" if held else "held by no request"
            out.append(_v(name, s, f"block {b} has ref count {count} but is {who}"))
    return out


def check_within_reservation(s: KvSnapshot) -> list[Violation]:
    """Where reservations are known, no request owns more blocks than it reserved.

    A request that owns blocks but has no reservation counts as having reserved 0.
    """
    if s.reserved is None:
        return []
    name = "within_reservation"
    out: list[Violation] = []
    for req_id, ids in s.owned.items():
        limit = s.reserved.get(req_id)
        if limit is None:
            out.append(
                _v(
                    name,
                    s,
                    f"request {req_id} owns {_count(len(ids))} {_blocks(ids)} "
                    "but has no reservation",
                )
            )
        elif len(ids) > limit:
            out.append(
                _v(
                    name,
                    s,
                    f"request {req_id} owns {_count(len(ids))} {_blocks(ids)} but reserved {limit}",
                )
            )
    return out


def expected_reported_free(s: KvSnapshot) -> int:
    """Usable free blocks minus blocks reserved but not yet allocated."""
    outstanding = sum(
        max(0, n - len(s.owned.get(req_id, []))) for req_id, n in (s.reserved or {}).items()
    )
    return s.free_count() - outstanding


def check_reported_free(s: KvSnapshot) -> list[Violation]:
    """Where a reported free count is known, it equals the ledger's.

    The ledger's count is the distinct non-pad blocks in the free list minus the
    blocks still promised to requests (reserved minus already owned).
    """
    if s.reported_free is None:
        return []
    expected = expected_reported_free(s)
    if s.reported_free == expected:
        return []
    free = s.free_count()
    detail = f"{free} free" if expected == free else f"{free} free - {free - expected} promised"
    return [
        _v(
            "reported_free",
            s,
            f"reported {_count(s.reported_free, 'free block')} but the ledger has {expected} ({detail})",
        )
    ]


def check_idle_all_free(s: KvSnapshot) -> list[Violation]:
    """At idle every non-pad block is free and no request, dummy or not, owns or reserves any."""
    name = "idle_all_free"
    out: list[Violation] = []
    dummies = set(s.dummy_ids)
    for req_id, ids in s.owned.items():
        if ids:
            kind = "dummy request" if req_id in dummies or is_dummy_id(req_id) else "request"
            out.append(_v(name, s, f"at idle, {kind} {req_id} still owns blocks {_blocks(ids)}"))
    for req_id, n in (s.reserved or {}).items():
        if n:
            out.append(_v(name, s, f"at idle, request {req_id} still reserves {_count(n)}"))
    pad = set(s.pad_blocks)
    free = set(s.free_blocks)
    holders = _holders(s)
    lost = [b for b in range(s.num_blocks) if b not in pad and b not in free and b not in holders]
    if lost:
        out.append(_v(name, s, f"at idle, blocks {_blocks(lost)} are not free and not owned"))
    return out


STEP_CHECKS = (
    check_conservation,
    check_pad_never_owned,
    check_no_double_free,
    check_free_counter,
    check_ref_counts,
    check_within_reservation,
    check_reported_free,
)


def _at(violations: list[Violation], step: int | None) -> list[Violation]:
    return [
        Violation(invariant=v.invariant, message=v.message, step=step, source=v.source)
        for v in violations
    ]


def check_step(s: KvSnapshot, step: int | None) -> list[Violation]:
    """Every per-step invariant (all but idle) on one snapshot, each violation tagged ``step``."""
    out: list[Violation] = []
    for check in STEP_CHECKS:
        out.extend(check(s))
    return _at(out, step)


def check_idle(s: KvSnapshot, step: int | None) -> list[Violation]:
    """``check_idle_all_free`` with ``step`` set."""
    return _at(check_idle_all_free(s), step)


def check_run(snapshots: list[KvSnapshot], idle_index: int | None) -> list[Violation]:
    """Per-step invariants on every snapshot (step = list index), plus idle at ``idle_index``."""
    out: list[Violation] = []
    for i, s in enumerate(snapshots):
        out.extend(check_step(s, i))
    if idle_index is not None:
        i = idle_index % len(snapshots)
        out.extend(check_idle(snapshots[i], i))
    return out


def check_engine_steps(
    steps: list[dict[str, Any]], idle_step: int | None = None
) -> list[Violation]:
    """Per-step invariants on every snapshot of step dicts (``Trace.engine_steps``).

    Violations carry each dict's ``step`` number; the idle check runs on every
    snapshot of the dict whose ``step`` equals ``idle_step``.
    """
    out: list[Violation] = []
    for d in steps:
        for kd in d.get("kv", []):
            s = KvSnapshot.from_dict(kd)
            out.extend(check_step(s, d["step"]))
            if idle_step is not None and d["step"] == idle_step:
                out.extend(check_idle(s, d["step"]))
    return out


# ------------------------------------------------------------------ report


def _most_specific(kv: list[dict[str, Any]]) -> dict[str, Any] | None:
    # The runner holds the real blocks; the scheduler's pool can be a stand-in.
    runners = [k for k in kv if k.get("source") != SOURCE_VLLM_SCHEDULER]
    if runners:
        return runners[-1]
    return kv[0] if kv else None


def _ids(ids: Iterable[Any]) -> str:
    return ",".join(str(i) for i in ids) or "-"


def format_step_table(steps: list[dict[str, Any]], first_bad: int, context: int = 3) -> str:
    """A text table of the steps within ``context`` of the step numbered ``first_bad``.

    ``first_bad`` is a ``step`` value (as in ``Violation.step``); its row is marked
    ``>>``. KV columns come from the runner's snapshot when there is one, else the
    scheduler's. Raises ValueError when no step has that number.
    """
    index = next((i for i, d in enumerate(steps) if d.get("step") == first_bad), None)
    if index is None:
        raise ValueError(f"no step numbered {first_bad} among {len(steps)} steps")
    lo, hi = max(0, index - context), min(len(steps), index + context + 1)
    header = [
        "",
        "step",
        "run",
        "wait",
        "preempted",
        "finished",
        "tkv",
        "src",
        "free",
        "rep",
        "pad",
        "owned",
    ]
    rows = [header]
    for i in range(lo, hi):
        d = steps[i]
        kd = _most_specific(d.get("kv", []))
        if kd is None:
            src = free = rep = pad = owned = "-"
        else:
            src = str(kd.get("source", "?"))
            free = str(len(kd.get("free_blocks", [])))
            rep = "-" if kd.get("reported_free") is None else str(kd["reported_free"])
            pad = _ids(kd.get("pad_blocks", []))
            owned = " ".join(f"{r}:{len(b)}" for r, b in kd.get("owned", {}).items() if b) or "-"
        tkv = d.get("tkv")
        rows.append(
            [
                ">>" if i == index else "",
                str(d.get("step", i)),
                str(len(d.get("running", []))),
                str(len(d.get("waiting", []))),
                _ids(d.get("preempted", [])),
                _ids(d.get("finished", [])),
                "-" if tkv is None else str(tkv),
                src,
                free,
                rep,
                pad,
                owned,
            ]
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------ verdict


def check_trace_ledger(
    initial: dict[str, Any] | None, steps: list[dict[str, Any]], idle_at_end: bool
) -> list[Violation]:
    """Every ledger invariant over a step-driven run.

    ``initial`` is the snapshot after engine start-up (warmup done, no request
    yet): an idle point. The last step is idle too when ``idle_at_end`` (the
    runner has been told of every finished request).
    """
    all_steps = ([initial] if initial else []) + list(steps)
    idle_steps = {initial["step"]} if initial else set()
    if idle_at_end and steps:
        idle_steps.add(steps[-1]["step"])
    out = check_engine_steps(all_steps, None) + check_dummy_returned(list(steps))
    for d in all_steps:
        if d["step"] in idle_steps:
            for kd in d.get("kv", []):
                out.extend(check_idle(KvSnapshot.from_dict(kd), d["step"]))
    return out


def ledger_report(
    initial: dict[str, Any] | None, steps: list[dict[str, Any]], idle_at_end: bool
) -> str | None:
    """None when every invariant holds; else the first broken invariant, its step,
    a per-step table around it, and every violation (first 20)."""
    if not any(d.get("kv") for d in ([initial] if initial else []) + steps):
        return "kv ledger: no KV snapshots were recorded (was the probe switched off?)"
    violations = check_trace_ledger(initial, steps, idle_at_end)
    if not violations:
        return None
    violations.sort(key=lambda v: (v.step if v.step is not None else -2))
    first = violations[0]
    all_steps = ([initial] if initial else []) + list(steps)
    lines = [
        f"kv invariant {first.invariant} broken at step {first.step}: {first.message}",
        format_step_table(all_steps, first.step if first.step is not None else -1),
        "invariants broken: " + ", ".join(sorted({v.invariant for v in violations})),
        f"{len(violations)} violation(s):",
    ]
    lines += [f"  step {v.step}: [{v.invariant}] {v.message}" for v in violations[:20]]
    if len(violations) > 20:
        lines.append(f"  ... {len(violations) - 20} more")
    return "\n".join(lines)


def check_dummy_returned(steps: list[dict[str, Any]]) -> list[Violation]:
    """Dummy blocks (legacy minimum-decode-batch padding) are back in the pool by the step
    where a second real request runs, or the batch empties: a dummy may hold blocks only at
    a step whose batch held exactly one real request (still running, or finishing in it:
    the runner hears of a finish one step later, as with every freed block)."""
    out: list[Violation] = []
    for d in steps:
        batch = {str(r) for r in [*d.get("running", []), *d.get("finished", [])]}
        running = sorted(r for r in batch if not is_dummy_id(r))
        if len(running) == 1:
            continue
        for kd in d.get("kv", []):
            s = KvSnapshot.from_dict(kd)
            for dummy in s.dummy_ids:
                held = s.owned.get(dummy) or []
                if held:
                    why = "the batch is empty" if not running else f"{len(running)} real requests run"
                    out.append(Violation(
                        "dummy_returned",
                        f"dummy {dummy!r} still holds blocks {sorted(held)} although {why}",
                        d["step"],
                    ))
    return out
