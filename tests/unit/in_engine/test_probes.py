"""The KV ledger probes read the engine's objects (fakes of the real stacks here) into
snapshots without changing them, and a broken free list shows in the ledger checks."""

from __future__ import annotations

from types import SimpleNamespace

from harness.checks.ledger import check_idle_all_free, check_pad_never_owned, check_step
from harness.core.trace import SOURCE_VLLM_SCHEDULER
from harness.in_engine.probes import snapshot_engine, snapshot_vllm_scheduler
from tests.unit.kv_snapshots import only
from tests.unit.vllm_fakes import (
    FakeBlock,
    FakeFreeQueue,
    engine_core,
    fake_manager,
    fake_pool,
    fake_vllm_scheduler,
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


def test_free_queue_of_vllm_0_9_has_a_real_head_and_ends_in_none():
    from types import SimpleNamespace as NS

    from harness.in_engine.probes import _walk_free_queue

    c = NS(block_id=5, next_free_block=None)
    b = NS(block_id=3, next_free_block=c)
    a = NS(block_id=1, next_free_block=b)
    assert _walk_free_queue(NS(free_list_head=a, free_list_tail=c), 10) == [1, 3, 5]
    c.next_free_block = a  # a cycle is cut at the limit and shows up as a double free
    assert len(_walk_free_queue(NS(free_list_head=a, free_list_tail=c), 4)) == 5


def test_snapshot_engine_without_a_plugin_reader_is_the_scheduler_alone() -> None:
    pool = fake_pool(4, {})
    sched = fake_vllm_scheduler(pool, fake_manager(pool, {}, 256))
    snaps = snapshot_engine(engine_core(sched, SimpleNamespace(requests={})))
    assert [s.source for s in snaps] == [SOURCE_VLLM_SCHEDULER]
    assert check_step(snaps[0], 0) + check_idle_all_free(snaps[0]) == []


def test_a_tensor_parallel_engine_reads_each_rank_and_sets_rank_0s_part() -> None:
    """Where the harness started the ranks (its executor given), the runners are asked through
    the executor, rank 0's fields stand on the scheduler's snapshot and every rank's are kept;
    the runner in this process is not read."""
    pool = fake_pool(4, {})
    sched = fake_vllm_scheduler(pool, fake_manager(pool, {}, 256))
    answers = [{"rank": r, "fields": {"device_blocks": 4}, "table": {}} for r in (0, 1)]
    asked: list[str] = []

    class Executor:
        def collective_rpc(self, method: str) -> list[dict]:
            asked.append(method)
            return answers

    (snap,) = snapshot_engine(engine_core(sched, None), rank_executor=Executor())
    assert asked == ["hil_runner_facts"]
    assert snap.device_blocks == 4 and snap.ranks == answers
    (one,) = snapshot_engine(engine_core(sched, SimpleNamespace(requests={})))
    assert one.ranks is None
