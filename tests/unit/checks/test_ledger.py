"""KV block ledgers: invariants on hand-built snapshots, adapters on fake engine objects.

The fakes mirror the attribute names of vLLM 0.17.1 (``KVCacheBlock``,
``FreeKVCacheBlockQueue``, ``BlockPool``, ``KVCacheManager``), vllm-spyre 1.10
(``ContinuousBatchingSpyreModelRunner``, ``ChunkedPrefillModelRunner``) and
vllm-spyre 0.4.0 (the legacy continuous-batching runner).
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from harness.checks.ledger import (
    Violation,
    check_conservation,
    check_free_counter,
    check_idle_all_free,
    check_ledger,
    check_no_double_free,
    check_pad_never_owned,
    check_ref_counts,
    check_reported_free,
    check_step,
    check_within_reservation,
    ledger_violations,
)
from harness.core.serialise import (
    snapshot_from_dict,
    snapshot_to_dict,
    trace_from_dict,
    trace_to_dict,
)
from harness.core.trace import (
    SOURCE_SPYRE_LEGACY_RUNNER,
    SOURCE_SPYRE_RUNNER,
    SOURCE_VLLM_SCHEDULER,
    KvSnapshot,
    RequestTrace,
    StepRecord,
    TokenStep,
    Trace,
)
from harness.in_engine.probes import (
    LEGACY_DUMMY_ID,
    snapshot_engine,
    snapshot_legacy_spyre_runner,
    snapshot_spyre_runner,
    snapshot_vllm_scheduler,
)
from harness.render.ledger_table import format_step_table

# ------------------------------------------------------------- snapshots


def healthy(**overrides: Any) -> KvSnapshot:
    """Ten blocks: pad 0, r0 holds 1-3, warmup-0 holds 4, the rest free."""
    fields: dict[str, Any] = dict(
        source=SOURCE_SPYRE_RUNNER,
        num_blocks=10,
        pad_blocks=[0],
        free_blocks=[5, 6, 7, 8, 9],
        owned={"r0": [1, 2, 3], "warmup-0": [4]},
        dummy_ids=["warmup-0"],
        reserved={"r0": 4, "warmup-0": 1},
        reported_free=4,
        tkv=130,
        block_size=64,
        counted_free=5,
        ref_counts={1: 1, 2: 1, 3: 1, 4: 1},
    )
    fields.update(overrides)
    return KvSnapshot(**fields)


def idle(**overrides: Any) -> KvSnapshot:
    fields: dict[str, Any] = dict(
        source=SOURCE_SPYRE_RUNNER,
        num_blocks=6,
        pad_blocks=[0],
        free_blocks=[1, 2, 3, 4, 5],
        reserved={},
        reported_free=5,
        counted_free=5,
        ref_counts={},
    )
    fields.update(overrides)
    return KvSnapshot(**fields)


def only(violations: list[Violation], invariant: str) -> Violation:
    assert len(violations) == 1, violations
    assert violations[0].invariant == invariant
    return violations[0]


def test_healthy_snapshot_passes_every_step_check() -> None:
    assert check_step(healthy(), 3) == []


def test_roundtrip_through_json() -> None:
    s = healthy()
    d = json.loads(json.dumps(snapshot_to_dict(s)))
    assert all(isinstance(k, str) for k in d["ref_counts"])
    assert snapshot_from_dict(d) == s
    bare = KvSnapshot(source=SOURCE_SPYRE_LEGACY_RUNNER, num_blocks=4, free_blocks=[0, 1, 1])
    assert snapshot_from_dict(json.loads(json.dumps(snapshot_to_dict(bare)))) == bare


def test_trace_with_step_records_roundtrips_through_json() -> None:
    req = RequestTrace("r0", [1, 2], [TokenStep(7, -0.5, {7: -0.5, 8: -1.0})], 1, "length")
    trace = Trace(
        target="t",
        requests={"r0": req},
        steps=[StepRecord(0, running=["r0"], preempted=["r1"], preemptions={"r0": 1},
                          scheduled=True, num_scheduled_tokens=3, tkv=64, kv=[healthy()])],
        initial=StepRecord(-1, kv=[idle()]),
        idle_at_end=True,
        metrics={"vllm:num_preemptions": 1.0},
        info={"pid": 1},
    )
    assert trace_from_dict(json.loads(json.dumps(trace_to_dict(trace)))) == trace


def test_from_dict_fills_missing_optional_keys() -> None:
    s = snapshot_from_dict({"source": "vllm-scheduler", "num_blocks": 3, "free_blocks": [1, 2]})
    assert s.owned == {} and s.reserved is None and s.ref_counts is None


# ------------------------------------------------------------ conservation


def test_conservation_holds() -> None:
    assert check_conservation(healthy()) == []


def test_conservation_lost_block() -> None:
    v = only(check_conservation(healthy(free_blocks=[5, 6, 8, 9])), "conservation")
    assert "[7]" in v.message and "neither free, owned nor pad" in v.message


def test_conservation_block_free_and_owned() -> None:
    v = only(check_conservation(healthy(free_blocks=[3, 5, 6, 7, 8, 9])), "conservation")
    assert "block 3" in v.message and "r0" in v.message and "free" in v.message


def test_conservation_block_owned_twice() -> None:
    s = healthy(owned={"r0": [1, 2, 3], "r1": [3], "warmup-0": [4]})
    v = only(check_conservation(s), "conservation")
    assert "block 3" in v.message and "r0 and r1" in v.message


def test_conservation_block_listed_twice_by_one_request() -> None:
    s = healthy(owned={"r0": [1, 2, 2, 3], "warmup-0": [4]})
    v = only(check_conservation(s), "conservation")
    assert "request r0" in v.message and "block 2" in v.message and "2 times" in v.message


def test_conservation_block_outside_pool() -> None:
    v = only(check_conservation(healthy(free_blocks=[5, 6, 7, 8, 9, 12])), "conservation")
    assert "block 12" in v.message and "outside the pool" in v.message


def test_conservation_allows_prefix_sharing_only_when_ref_counts_agree() -> None:
    shared = healthy(
        owned={"r0": [1, 2, 3], "r1": [1, 2], "warmup-0": [4]},
        ref_counts={1: 2, 2: 2, 3: 1, 4: 1},
        prefix_caching=True,
    )
    assert check_conservation(shared) == []
    assert check_ref_counts(shared) == []
    wrong = healthy(
        owned={"r0": [1, 2, 3], "r1": [1, 2], "warmup-0": [4]},
        ref_counts={1: 2, 2: 1, 3: 1, 4: 1},
        prefix_caching=True,
    )
    v = only(check_conservation(wrong), "conservation")
    assert "block 2" in v.message and "r0 and r1" in v.message


# ----------------------------------------------------------- pad / frees


def test_pad_never_owned_holds() -> None:
    assert check_pad_never_owned(healthy()) == []


def test_pad_block_owned() -> None:
    s = healthy(owned={"r0": [1, 2, 3], "warmup-0": [4], "r1": [0]})
    v = only(check_pad_never_owned(s), "pad_never_owned")
    assert "pad block 0" in v.message and "r1" in v.message
    assert check_conservation(s) == []


def test_pad_block_in_free_list() -> None:
    v = only(check_pad_never_owned(healthy(free_blocks=[5, 6, 7, 8, 9, 0])), "pad_never_owned")
    assert "pad block 0" in v.message and "free list" in v.message


def test_no_double_free_holds() -> None:
    assert check_no_double_free(healthy()) == []


def test_double_free() -> None:
    v = only(check_no_double_free(healthy(free_blocks=[5, 6, 7, 6, 8, 9])), "no_double_free")
    assert "block 6" in v.message and "2 times" in v.message


def test_free_counter_holds_and_breaks() -> None:
    assert check_free_counter(healthy()) == []
    assert check_free_counter(healthy(counted_free=None)) == []
    v = only(check_free_counter(healthy(counted_free=6)), "free_counter")
    assert "6" in v.message and "holds 5" in v.message


def test_ref_counts_break() -> None:
    v = only(check_ref_counts(healthy(ref_counts={1: 1, 2: 1, 3: 1, 4: 1, 7: -1})), "ref_counts")
    assert "block 7" in v.message and "-1" in v.message
    v = only(check_ref_counts(healthy(ref_counts={1: 1, 2: 1, 4: 1})), "ref_counts")
    assert "block 3" in v.message and "r0" in v.message
    assert check_ref_counts(healthy(ref_counts=None)) == []


# ------------------------------------------------- reservations / reports


def test_within_reservation_holds_and_is_skipped_without_reservations() -> None:
    assert check_within_reservation(healthy()) == []
    assert check_within_reservation(healthy(reserved=None)) == []


def test_owns_more_than_reserved() -> None:
    v = only(
        check_within_reservation(healthy(reserved={"r0": 2, "warmup-0": 1})), "within_reservation"
    )
    assert "r0" in v.message and "3 blocks" in v.message and "reserved 2" in v.message


def test_owns_without_reservation() -> None:
    v = only(check_within_reservation(healthy(reserved={"r0": 4})), "within_reservation")
    assert "warmup-0" in v.message and "no reservation" in v.message


def test_reported_free_counts_outstanding_reservations() -> None:
    # 5 free, r0 still has 1 reserved block to allocate: the runner may offer 4.
    assert check_reported_free(healthy()) == []
    assert check_reported_free(healthy(reported_free=None)) == []
    assert check_reported_free(healthy(reserved=None, reported_free=5)) == []


def test_wrong_reported_free() -> None:
    v = only(check_reported_free(healthy(reported_free=6)), "reported_free")
    assert "reported 6" in v.message and "ledger has 4" in v.message


# ------------------------------------------------------------------ idle


def test_idle_all_free_holds() -> None:
    assert check_idle_all_free(idle()) == []


def test_idle_request_still_owns() -> None:
    s = idle(free_blocks=[1, 2, 3], owned={"r7": [4, 5]}, ref_counts={4: 1, 5: 1})
    v = only(check_idle_all_free(s), "idle_all_free")
    assert "r7" in v.message and "[4, 5]" in v.message


def test_idle_leaked_warmup_block() -> None:
    s = idle(free_blocks=[1, 2, 3, 4], owned={"warmup-1": [5]}, dummy_ids=["warmup-1"])
    v = only(check_idle_all_free(s), "idle_all_free")
    assert "dummy request warmup-1" in v.message and "[5]" in v.message


def test_idle_leftover_reservation() -> None:
    v = only(check_idle_all_free(idle(reserved={"warmup-0": 2})), "idle_all_free")
    assert "warmup-0" in v.message and "reserves 2" in v.message


def test_idle_lost_block() -> None:
    v = only(check_idle_all_free(idle(free_blocks=[1, 2, 4, 5])), "idle_all_free")
    assert "[3]" in v.message


def test_check_step_tags_step_and_source() -> None:
    vs = check_step(healthy(free_blocks=[5, 6, 6, 7, 8, 9], counted_free=6), 7)
    assert {v.invariant for v in vs} == {"no_double_free"}
    assert all(v.step == 7 and v.source == SOURCE_SPYRE_RUNNER for v in vs)


def run_of(snaps: list[KvSnapshot], idle_at_end: bool, first: int = 0) -> Trace:
    """A step-driven trace with one snapshot per step, numbered from ``first``; r0 runs
    alone (so the warmup block of ``healthy()`` is a legal lone-request dummy)."""
    steps = [StepRecord(first + i, running=["r0"], kv=[s]) for i, s in enumerate(snaps)]
    return Trace(target="t", steps=steps, idle_at_end=idle_at_end)


def test_ledger_driver_adds_idle_at_the_last_step_only_when_idle() -> None:
    snaps = [
        healthy(),
        healthy(),
        idle(
            owned={"r0": [1]},
            free_blocks=[2, 3, 4, 5],
            counted_free=4,
            ref_counts={1: 1},
            reserved={"r0": 1},
            reported_free=4,
        ),
    ]
    assert ledger_violations(run_of(snaps, idle_at_end=False)) == []
    leaks = ledger_violations(run_of(snaps, idle_at_end=True))
    assert {v.invariant for v in leaks} == {"idle_all_free"}
    assert [v.step for v in leaks] == [2, 2]
    assert "owns blocks [1]" in leaks[0].message and "reserves 1 block" in leaks[1].message
    broken = [healthy(), healthy(free_blocks=[5, 6, 7, 8])]
    assert [v.step for v in ledger_violations(run_of(broken, idle_at_end=False))] == [1, 1, 1]


def test_ledger_driver_checks_the_initial_record_as_idle_and_uses_step_numbers() -> None:
    trace = run_of([healthy(), healthy(reported_free=9), idle()], idle_at_end=True, first=10)
    v = only(ledger_violations(trace), "reported_free")
    assert v.step == 11
    trace.initial = StepRecord(-1, kv=[idle(owned={"warmup-0": [1]}, free_blocks=[2, 3, 4, 5],
                                            counted_free=4, ref_counts={1: 1}, reported_free=4)])
    assert ("idle_all_free", -1) in [(v.invariant, v.step) for v in ledger_violations(trace)]


def test_ledger_verdict_names_invariant_step_values_and_marks_the_table() -> None:
    trace = run_of([healthy(), healthy(free_blocks=[5, 6, 7, 8], counted_free=4), idle()],
                   idle_at_end=True)
    verdict = check_ledger(trace)
    assert not verdict.ok and verdict.check == "kv_ledger.conservation" and verdict.at == 1
    assert verdict.why == ("kv invariant conservation broken at step 1: 1 of 10 blocks are"
                           " neither free, owned nor pad: [9]")
    marked = [ln for ln in verdict.details.splitlines() if ln.startswith(">>")]
    assert len(marked) == 1 and marked[0].split()[1] == "1"
    assert "invariants broken: conservation, reported_free" in verdict.details
    assert check_ledger(run_of([healthy(), idle()], idle_at_end=True)).ok


def test_ledger_verdict_without_snapshots_is_a_harness_problem() -> None:
    verdict = check_ledger(Trace(target="t", steps=[StepRecord(0)]))
    assert not verdict.ok and verdict.check == "kv_ledger.unrecorded"
    assert "no KV snapshots were recorded" in verdict.why


def step_record(n: int, snaps: list[KvSnapshot], **kw: Any) -> StepRecord:
    return StepRecord(step=n, kv=list(snaps), **kw)


# ----------------------------------------------------------- step table


def test_format_step_table_marks_first_bad_and_prefers_runner() -> None:
    sched = KvSnapshot(
        source=SOURCE_VLLM_SCHEDULER,
        num_blocks=4,
        pad_blocks=[0],
        free_blocks=[3],
        owned={"r0": [1], "r1": [2]},
    )
    steps = [
        step_record(
            i,
            [sched, healthy()],
            running=["r0", "r1"],
            waiting=["r2"] if i < 3 else [],
            preempted=["r1"] if i == 4 else [],
            tkv=100 + i,
        )
        for i in range(10)
    ]
    table = format_step_table(steps, first_bad=4, context=2)
    lines = table.splitlines()
    assert len(lines) == 1 + 5
    assert lines[0].split()[:4] == ["step", "run", "wait", "preempted"]
    bad = [ln for ln in lines if ln.startswith(">>")]
    assert len(bad) == 1 and bad[0].split()[1] == "4"
    assert "r0:3 warmup-0:1" in bad[0] and "spyre-runner" in bad[0] and " r1 " in bad[0]
    assert [ln.split()[0] for ln in lines[1:] if not ln.startswith(">>")] == ["2", "3", "5", "6"]
    with pytest.raises(ValueError):
        format_step_table(steps, first_bad=99)


def test_format_step_table_without_runner_uses_scheduler() -> None:
    sched = KvSnapshot(
        source=SOURCE_VLLM_SCHEDULER,
        num_blocks=4,
        pad_blocks=[0],
        free_blocks=[3],
        owned={"r0": [1, 2]},
    )
    table = format_step_table([step_record(0, [sched]), step_record(1, [])], first_bad=0)
    assert "vllm-scheduler" in table and "r0:2" in table


# ------------------------------------------------- fakes of the real stacks


class FakeBlock:
    """Mirrors vllm.v1.core.kv_cache_utils.KVCacheBlock."""

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.is_null = False
        self.prev_free_block: FakeBlock | None = None
        self.next_free_block: FakeBlock | None = None


class FakeFreeQueue:
    """Mirrors FreeKVCacheBlockQueue: a doubly linked list between fake head and tail."""

    def __init__(self, blocks: list[FakeBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = FakeBlock(-1)
        self.fake_free_list_tail = FakeBlock(-1)
        chain = [self.fake_free_list_head, *blocks, self.fake_free_list_tail]
        for a, b in zip(chain, chain[1:], strict=False):
            a.next_free_block, b.prev_free_block = b, a

    def popleft(self) -> FakeBlock:
        raise AssertionError("a snapshot must not pop the free queue")

    def get_all_free_blocks(self) -> list[FakeBlock]:
        raise AssertionError("the adapter walks the links itself")


def fake_pool(
    num_blocks: int,
    owned: dict[str, list[int]],
    free_order: list[int] | None = None,
    caching: bool = False,
) -> SimpleNamespace:
    """A BlockPool with block 0 as null block, ``owned`` allocated, the rest free."""
    blocks = [FakeBlock(i) for i in range(num_blocks)]
    blocks[0].is_null = True
    held = {b for ids in owned.values() for b in ids}
    for ids in owned.values():
        for b in ids:
            blocks[b].ref_cnt += 1
    if free_order is None:
        free_order = [i for i in range(1, num_blocks) if i not in held]
    return SimpleNamespace(
        blocks=blocks,
        free_block_queue=FakeFreeQueue([blocks[i] for i in free_order]),
        null_block=blocks[0],
        enable_caching=caching,
    )


def fake_manager(
    pool: SimpleNamespace, owned: dict[str, list[int]], block_size: int, **attrs: Any
) -> SimpleNamespace:
    """A SingleTypeKVCacheManager: ``req_to_blocks`` is a defaultdict(list) of blocks."""
    req_to_blocks: defaultdict[str, list[FakeBlock]] = defaultdict(list)
    for req_id, ids in owned.items():
        req_to_blocks[req_id] = [pool.blocks[i] for i in ids]
    return SimpleNamespace(
        req_to_blocks=req_to_blocks, block_pool=pool, block_size=block_size, **attrs
    )


def fake_vllm_scheduler(pool: SimpleNamespace, *managers: SimpleNamespace) -> SimpleNamespace:
    coordinator = SimpleNamespace(single_type_managers=tuple(managers), block_pool=pool)
    return SimpleNamespace(
        kv_cache_manager=SimpleNamespace(coordinator=coordinator, block_pool=pool)
    )


class FakeCBRunner:
    """Mirrors ContinuousBatchingSpyreModelRunner's block bookkeeping."""

    def __init__(
        self, num_blocks: int, owned: dict[str, list[int]], reserved: dict[str, int]
    ) -> None:
        self.block_size = 64
        self.n_blocks = num_blocks - 1
        self.block_pool = fake_pool(num_blocks, owned)
        self.kv_cache_manager = fake_manager(self.block_pool, owned, self.block_size)
        self.req_ids2num_reserved_blocks = dict(reserved)
        self.tkv = 129

    def get_n_free_blocks(self) -> int:
        return self.n_blocks - sum(self.req_ids2num_reserved_blocks.values())


class FakeCPRunner(FakeCBRunner):
    """Mirrors ChunkedPrefillModelRunner: no reservations, reports the pool's count."""

    def __init__(self, num_blocks: int, owned: dict[str, list[int]]) -> None:
        super().__init__(num_blocks, owned, {})
        self.chunk_size = 128
        self.chunk_blocks_count = 2

    def get_n_free_blocks(self) -> int:
        return self.kv_cache_manager.block_pool.free_block_queue.num_free_blocks


class FakeLegacyRunner:
    """Mirrors vllm-spyre 0.4.0's ContinuousBatchingSpyreModelRunner."""

    def __init__(self, num_blocks: int) -> None:
        self.BLOCK_SIZE = 64
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.req_ids2blocks: dict[str, deque[int]] = {}
        self.req_ids2left_pads: dict[str, int] = {}
        self.dummy_req_ids2blocks: list[int] = []
        self.tkv = 0
        kv_tensor = SimpleNamespace(shape=(num_blocks, 64, 2, 32))
        self.model = SimpleNamespace(
            model=SimpleNamespace(past_key_value_states=[(kv_tensor, kv_tensor)])
        )


def engine_core(scheduler: Any, runner: Any) -> SimpleNamespace:
    worker = SimpleNamespace(model_runner=runner)
    return SimpleNamespace(
        scheduler=scheduler,
        model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=worker)),
    )


def test_vllm_scheduler_adapter_reads_pool_and_managers() -> None:
    owned = {"a-1f": [3, 1], "b-2e": [2]}
    pool = fake_pool(8, owned, free_order=[5, 4, 6, 7])
    mgr = fake_manager(pool, owned, 16)
    mgr.req_to_blocks["gone"]  # an empty defaultdict entry owns nothing
    sched = fake_vllm_scheduler(pool, mgr)
    keys = list(mgr.req_to_blocks)

    s = snapshot_vllm_scheduler(sched)

    assert s.source == SOURCE_VLLM_SCHEDULER
    assert s.num_blocks == 8 and s.pad_blocks == [0] and s.block_size == 16
    assert s.free_blocks == [5, 4, 6, 7] and s.counted_free == 4
    assert s.owned == {"a-1f": [3, 1], "b-2e": [2]}
    assert s.reserved is None and s.reported_free is None and s.tkv is None
    assert s.ref_counts == {1: 1, 2: 1, 3: 1}
    assert check_step(s, 0) == []
    assert list(mgr.req_to_blocks) == keys
    assert pool.free_block_queue.num_free_blocks == 4


def test_vllm_scheduler_adapter_merges_groups_and_skips_window_placeholders() -> None:
    owned = {"r": [1, 2, 3]}
    pool = fake_pool(6, owned)
    full = fake_manager(pool, {"r": [1, 2]}, 16)
    window = fake_manager(pool, {"r": [3]}, 16, sliding_window=32)
    window.req_to_blocks["r"].insert(0, pool.null_block)
    s = snapshot_vllm_scheduler(fake_vllm_scheduler(pool, full, window))
    assert s.owned == {"r": [1, 2, 3]}
    assert check_step(s, 0) == []
    # In a full-attention manager the null block is a real ownership bug.
    full.req_to_blocks["r"].append(pool.null_block)
    v = only(
        check_pad_never_owned(snapshot_vllm_scheduler(fake_vllm_scheduler(pool, full))),
        "pad_never_owned",
    )
    assert "pad block 0" in v.message and "owned by r" in v.message


def vllm_append(queue: FakeFreeQueue, block: FakeBlock) -> None:
    """FreeKVCacheBlockQueue.append, step for step (it trusts the block is not queued)."""
    last = queue.fake_free_list_tail.prev_free_block
    assert last is not None
    last.next_free_block, block.prev_free_block = block, last
    block.next_free_block = queue.fake_free_list_tail
    queue.fake_free_list_tail.prev_free_block = block
    queue.num_free_blocks += 1


def test_vllm_scheduler_adapter_sees_broken_free_list() -> None:
    pool = fake_pool(6, {}, free_order=[1, 2, 3, 4, 5])
    # Appending block 2 again moves it to the tail and unlinks 3, 4 and 5.
    vllm_append(pool.free_block_queue, pool.blocks[2])
    s = snapshot_vllm_scheduler(fake_vllm_scheduler(pool, fake_manager(pool, {}, 16)))
    assert s.free_blocks == [1, 2] and s.counted_free == 6
    found = {v.invariant: v.message for v in check_step(s, 0)}
    assert set(found) == {"conservation", "free_counter"}
    assert "[3, 4, 5]" in found["conservation"]


def test_vllm_scheduler_adapter_stops_on_a_cycle() -> None:
    pool = fake_pool(6, {}, free_order=[1, 2, 3, 4, 5])
    pool.blocks[2].next_free_block = pool.blocks[1]
    s = snapshot_vllm_scheduler(fake_vllm_scheduler(pool, fake_manager(pool, {}, 16)))
    assert s.free_blocks == [1, 2, 1, 2, 1, 2, 1]
    found = {v.invariant for v in check_step(s, 0)}
    assert "no_double_free" in found and "conservation" in found


def test_spyre_runner_adapter() -> None:
    runner = FakeCBRunner(20, {"warmup-0": [1, 2], "r1": [3]}, {"warmup-0": 2, "r1": 3})
    s = snapshot_spyre_runner(runner)
    assert s.source == SOURCE_SPYRE_RUNNER
    assert s.num_blocks == 20 and s.pad_blocks == [0] and s.block_size == 64 and s.tkv == 129
    assert s.free_blocks == list(range(4, 20))
    assert s.owned == {"warmup-0": [1, 2], "r1": [3]}
    assert s.dummy_ids == ["warmup-0"]
    assert s.reserved == {"warmup-0": 2, "r1": 3}
    assert s.reported_free == 19 - 5
    assert check_step(s, 0) == []
    runner.req_ids2num_reserved_blocks["warmup-0"] = 1
    names = {v.invariant for v in check_step(snapshot_spyre_runner(runner), 0)}
    assert names == {"within_reservation", "reported_free"}


def test_spyre_chunked_prefill_runner_adapter() -> None:
    s = snapshot_spyre_runner(FakeCPRunner(20, {"r0": [1, 2, 3]}))
    assert s.reserved is None
    assert s.reported_free == 16 and s.counted_free == 16
    assert check_step(s, 0) == []


def test_legacy_runner_adapter() -> None:
    runner = FakeLegacyRunner(16)
    for req_id, n in (("warmup-0", 2), ("r1", 3)):
        runner.req_ids2blocks[req_id] = deque(runner.free_blocks.popleft() for _ in range(n))
    runner.dummy_req_ids2blocks = [runner.free_blocks.popleft()]
    runner.tkv = 65
    free_before = list(runner.free_blocks)

    s = snapshot_legacy_spyre_runner(runner)

    assert s.source == SOURCE_SPYRE_LEGACY_RUNNER
    assert s.num_blocks == 16 and s.pad_blocks == [] and s.block_size == 64 and s.tkv == 65
    assert s.free_blocks == list(range(6, 16))
    assert s.owned == {"warmup-0": [0, 1], "r1": [2, 3, 4], LEGACY_DUMMY_ID: [5]}
    assert set(s.dummy_ids) == {"warmup-0", LEGACY_DUMMY_ID}
    assert s.reserved is None and s.reported_free is None and s.ref_counts is None
    assert check_step(s, 0) == []
    assert list(runner.free_blocks) == free_before
    leaks = check_idle_all_free(s)
    assert any(f"dummy request {LEGACY_DUMMY_ID} " in v.message for v in leaks)


def test_legacy_runner_adapter_double_free_and_lost_block() -> None:
    runner = FakeLegacyRunner(8)
    runner.req_ids2blocks["r0"] = deque([runner.free_blocks.popleft()])
    runner.free_blocks.append(3)
    runner.free_blocks.remove(5)
    s = snapshot_legacy_spyre_runner(runner)
    assert s.num_blocks == 8
    names = {v.invariant: v.message for v in check_step(s, 0)}
    assert set(names) == {"no_double_free", "conservation"}
    assert "block 3" in names["no_double_free"] and "[5]" in names["conservation"]


def test_legacy_runner_total_without_kv_tensors() -> None:
    runner = FakeLegacyRunner(8)
    del runner.model
    assert snapshot_legacy_spyre_runner(runner).num_blocks == 8


def test_snapshot_engine_detects_runner_kind() -> None:
    pool = fake_pool(4, {})
    sched = fake_vllm_scheduler(pool, fake_manager(pool, {}, 256))
    plain = snapshot_engine(engine_core(sched, SimpleNamespace(requests={})))
    assert [s.source for s in plain] == [SOURCE_VLLM_SCHEDULER]
    new = snapshot_engine(engine_core(sched, FakeCBRunner(8, {}, {})))
    assert [s.source for s in new] == [SOURCE_VLLM_SCHEDULER, SOURCE_SPYRE_RUNNER]
    legacy = snapshot_engine(engine_core(sched, FakeLegacyRunner(8)))
    assert [s.source for s in legacy] == [SOURCE_VLLM_SCHEDULER, SOURCE_SPYRE_LEGACY_RUNNER]
    for snaps in (plain, new, legacy):
        assert all(check_step(s, 0) + check_idle_all_free(s) == [] for s in snaps)


def test_free_queue_of_vllm_0_9_has_a_real_head_and_ends_in_none():
    from types import SimpleNamespace as NS

    from harness.in_engine.probes import _walk_free_queue

    c = NS(block_id=5, next_free_block=None)
    b = NS(block_id=3, next_free_block=c)
    a = NS(block_id=1, next_free_block=b)
    assert _walk_free_queue(NS(free_list_head=a, free_list_tail=c), 10) == [1, 3, 5]
    c.next_free_block = a  # a cycle is cut at the limit and shows up as a double free
    assert len(_walk_free_queue(NS(free_list_head=a, free_list_tail=c), 4)) == 5


def test_reported_free_is_checked_against_the_request_table_not_the_reservations() -> None:
    # The runner serves r0 only; warmup-0's reservation is left over. The runner's own
    # count (blocks minus all reservations) then differs from the ledger's by that block.
    served = healthy(serving=["r0"], owned={"r0": [1, 2, 3]}, dummy_ids=[],
                     free_blocks=[4, 5, 6, 7, 8, 9], counted_free=6,
                     ref_counts={1: 1, 2: 1, 3: 1}, reported_free=4)
    v = only(check_reported_free(served), "reported_free")
    assert "reported 4" in v.message and "ledger has 5" in v.message
    assert "reservations of requests not served: warmup-0" in v.message
    # Every reservation belongs to a served request: the counts agree.
    assert check_reported_free(replace(served, reserved={"r0": 4}, reported_free=5)) == []
    # Without the table every reservation counts (the older rule).
    assert check_reported_free(replace(served, serving=None)) == []
