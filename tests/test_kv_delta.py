"""Delta KV snapshots of large pools: the host's rebuilt ledger equals a full probe's.

A fake vLLM block pool (linked free list between sentinel blocks, a free counter,
ref counts) is driven through allocations, frees and faults; every step is read once
with a ``DeltaTracker`` and once in full, and the deltas, sent through the wire
format and rebuilt, must give the same free set, counts and ref counts, and the
ledger checks must flag a fault at the same step.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from types import SimpleNamespace
from typing import Any

import pytest

from harness.checks.ledger import ledger_violations
from harness.engine import probe_delta
from harness.engine.probe_delta import DeltaTracker
from harness.engine.probes import snapshot_vllm_scheduler
from harness.kv_delta import DeltaWithoutBase, expand_deltas
from harness.serialise import trace_from_dict, trace_to_dict
from harness.trace import KvSnapshot, StepRecord, Trace


class Block:
    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.is_null = False
        self.prev_free_block: Block | None = None
        self.next_free_block: Block | None = None


class Pool:
    """vLLM's BlockPool bookkeeping: block 0 is the null block, the rest start free."""

    def __init__(self, n: int) -> None:
        self.blocks = [Block(i) for i in range(n)]
        self.null_block = self.blocks[0]
        self.enable_caching = False
        q = SimpleNamespace(num_free_blocks=0, fake_free_list_head=Block(-1),
                            fake_free_list_tail=Block(-1))
        q.fake_free_list_head.next_free_block = q.fake_free_list_tail
        q.fake_free_list_tail.prev_free_block = q.fake_free_list_head
        self.free_block_queue = q
        for b in self.blocks[1:]:
            self.append(b)

    def append(self, b: Block) -> None:  # as FreeKVCacheBlockQueue.append: no membership check
        q = self.free_block_queue
        last = q.fake_free_list_tail.prev_free_block
        last.next_free_block, b.prev_free_block = b, last
        b.next_free_block, q.fake_free_list_tail.prev_free_block = q.fake_free_list_tail, b
        q.num_free_blocks += 1

    def popleft(self) -> Block:
        q = self.free_block_queue
        b = q.fake_free_list_head.next_free_block
        q.fake_free_list_head.next_free_block = b.next_free_block
        b.next_free_block.prev_free_block = q.fake_free_list_head
        b.prev_free_block = b.next_free_block = None
        q.num_free_blocks -= 1
        return b


class Engine:
    def __init__(self, n: int) -> None:
        self.pool = Pool(n)
        self.req_to_blocks: defaultdict[str, list[Block]] = defaultdict(list)
        manager = SimpleNamespace(req_to_blocks=self.req_to_blocks, block_size=16)
        coordinator = SimpleNamespace(single_type_managers=(manager,), block_pool=self.pool)
        self.scheduler = SimpleNamespace(
            kv_cache_manager=SimpleNamespace(coordinator=coordinator, block_pool=self.pool))

    def alloc(self, req: str, n: int) -> None:
        for _ in range(n):
            b = self.pool.popleft()
            b.ref_cnt += 1
            self.req_to_blocks[req].append(b)

    def free(self, req: str) -> None:
        for b in reversed(self.req_to_blocks.pop(req)):
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self.pool.append(b)


def run(engine: Engine, ops: list[Any], tracker: DeltaTracker | None) -> Trace:
    """Snapshot after start-up and after each op (a callable); the last step is forced full."""
    def snap(last: bool = False) -> list[KvSnapshot]:
        if tracker is not None:
            tracker.force_full = last
        return [snapshot_vllm_scheduler(engine.scheduler, tracker)]

    initial = StepRecord(step=-1, kv=snap())
    steps = []
    for i, op in enumerate(ops):
        op()
        steps.append(StepRecord(step=i, kv=snap(last=i == len(ops) - 1)))
    return Trace(target="", steps=steps, initial=initial, idle_at_end=True)


def ops_for(engine: Engine) -> list[Any]:
    e = engine
    return [
        lambda: e.alloc("a", 3),
        lambda: e.alloc("b", 2),
        lambda: None,
        lambda: e.alloc("a", 1),
        lambda: e.free("b"),
        lambda: (e.alloc("c", 4), e.free("a")),
        lambda: None,
        lambda: e.free("c"),
    ]


def deltas(trace: Trace) -> int:
    return sum(1 for r in trace.steps for s in r.kv if s.free_taken is not None)


def ledger(s: KvSnapshot) -> tuple[Any, ...]:
    return (sorted(s.free_blocks), Counter(s.free_blocks), s.counted_free, s.ref_counts,
            s.owned)


@pytest.fixture
def small_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_delta, "FULL_PROBE_MAX_BLOCKS", 8)


def test_rebuilt_deltas_equal_full_snapshots(small_threshold: None) -> None:
    full_engine, delta_engine = Engine(40), Engine(40)
    full = run(full_engine, ops_for(full_engine), None)
    sent = run(delta_engine, ops_for(delta_engine), DeltaTracker())
    assert deltas(sent) >= 5  # all but the first step's base and the forced last one
    assert sent.steps[-1].kv[0].free_taken is None
    got = trace_from_dict(trace_to_dict(sent))
    assert deltas(got) == 0
    for a, b in zip([full.initial, *full.steps], [got.initial, *got.steps], strict=True):
        assert ledger(a.kv[0]) == ledger(b.kv[0]), a.step
    assert ledger_violations(got) == []


def test_small_pools_stay_full_every_step() -> None:
    engine = Engine(40)
    assert deltas(run(engine, ops_for(engine), DeltaTracker())) == 0


def test_checkpoint_every_n_snapshots(small_threshold: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_delta, "CHECKPOINT_EVERY", 3)
    engine = Engine(40)
    trace = run(engine, [lambda: None] * 7, DeltaTracker())
    kinds = ["d" if r.kv[0].free_taken is not None else "F" for r in trace.steps]
    assert kinds == ["d", "d", "F", "d", "d", "F", "F"]


@pytest.mark.parametrize("fault", ["refree", "free_pad", "lost_free"])
def test_free_list_faults_fire_at_the_same_step(small_threshold: None, fault: str) -> None:
    def faulty(engine: Engine) -> list[Any]:
        ops = ops_for(engine)
        pool = engine.pool
        if fault == "refree":  # an already free block appended again
            ops[2] = lambda: pool.append(pool.free_block_queue.fake_free_list_tail.prev_free_block)
        elif fault == "free_pad":  # the null block put in the free list
            ops[2] = lambda: pool.append(pool.null_block)
        else:  # a request's blocks dropped without being returned to the pool
            def drop() -> None:
                for b in engine.req_to_blocks.pop("b"):
                    b.ref_cnt -= 1
            ops[4] = drop
        return ops

    full_engine, delta_engine = Engine(40), Engine(40)
    want = ledger_violations(run(full_engine, faulty(full_engine), None))
    got = ledger_violations(trace_from_dict(trace_to_dict(
        run(delta_engine, faulty(delta_engine), DeltaTracker()))))
    assert want, "the fault must break an invariant"
    assert (got[0].step, got[0].invariant, got[0].message) == (
        want[0].step, want[0].invariant, want[0].message)


def test_a_delta_without_a_full_base_is_refused() -> None:
    s = KvSnapshot(source="vllm-scheduler", num_blocks=4, free_taken=[1], free_returned=[])
    with pytest.raises(DeltaWithoutBase, match="before any full snapshot"):
        expand_deltas(Trace(target="", steps=[StepRecord(step=0, kv=[s])]))
