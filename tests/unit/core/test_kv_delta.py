"""Delta KV snapshots of large pools: the host's view of them equals a full probe's.

A fake vLLM block pool (linked free list between sentinel blocks, a free counter,
ref counts) is driven through allocations, frees and faults; every step is read once
with a ``DeltaTracker`` and once in full, and the deltas, sent through the wire
format and followed on the host, must give the same free count, free membership of
every owned, pad and touched block, blocks that are nowhere, and ref counts, and the
ledger checks must flag a fault at the same step with the same message.
"""

from __future__ import annotations

import random
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest

from harness.checks.ledger import ledger_violations
from harness.core.kv_delta import DeltaWithoutBase, expand_deltas
from harness.core.serialise import trace_from_dict, trace_to_dict
from harness.core.trace import KvSnapshot, StepRecord, Trace
from harness.in_engine import probe_delta
from harness.in_engine.probe_delta import DeltaTracker
from harness.in_engine.probes import snapshot_vllm_scheduler
from tests.unit.vllm_fakes import FakeBlock as Block


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
        for b in reversed(self.req_to_blocks.pop(req, [])):
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


def ledger(s: KvSnapshot, full: KvSnapshot) -> tuple[Any, ...]:
    """What the checks read of ``s``, with free membership asked for the blocks ``full``
    (the same step read in full) has owned, pad or free."""
    if s.delta_view is not None:
        members, nowhere = s.delta_view.free_hits, s.delta_view.nowhere
        assert members <= set(full.free_blocks)
    else:
        members = set(s.free_blocks)
        nowhere = {b for b in range(s.num_blocks) if b not in members and b not in s.pad_blocks
                   and all(b not in ids for ids in s.owned.values())}
    asked = {b for ids in full.owned.values() for b in ids} | set(full.pad_blocks)
    refs = {b: (s.ref_counts or {}).get(b, 0) for b in asked | set(s.ref_counts or {})}
    return (s.free_len(), s.free_count(), {b for b in asked if b in members}, set(nowhere),
            s.counted_free, refs, s.owned)


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
    assert sum(1 for r in got.steps for s in r.kv if s.delta_view is not None) == deltas(sent)
    for a, b in zip([full.initial, *full.steps], [got.initial, *got.steps], strict=True):
        want = ledger(a.kv[0], a.kv[0])
        have = ledger(b.kv[0], a.kv[0])
        assert have[:5] == want[:5] and have[6] == want[6], a.step
        assert all(want[5].get(k, 0) == n for k, n in have[5].items()), a.step
    assert ledger_violations(got) == []
    again = trace_from_dict(trace_to_dict(got))  # a followed trace goes back on the wire as deltas
    for a, b in zip(got.steps, again.steps, strict=True):
        assert (a.kv[0].delta_view, a.kv[0].ref_counts) == (b.kv[0].delta_view, b.kv[0].ref_counts)


def test_small_pools_stay_full_every_step() -> None:
    engine = Engine(40)
    assert deltas(run(engine, ops_for(engine), DeltaTracker())) == 0


def test_checkpoint_every_n_snapshots(small_threshold: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_delta, "CHECKPOINT_EVERY", 3)
    engine = Engine(40)
    trace = run(engine, [lambda: None] * 7, DeltaTracker())
    kinds = ["d" if r.kv[0].free_taken is not None else "F" for r in trace.steps]
    assert kinds == ["d", "d", "F", "d", "d", "F", "F"]


def test_checkpoints_thin_out_on_large_pools() -> None:
    every = probe_delta.checkpoint_every
    assert (every(1_000), every(10_000), every(100_000)) == (
        probe_delta.CHECKPOINT_EVERY, probe_delta.CHECKPOINT_EVERY, 98)


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


FAULTS = ("refree", "free_pad", "lost_free", "extra_ref", "share", "leak", "keep_owned", None)


def random_ops(engine: Engine, rng: random.Random, fault: str | None) -> list[Any]:
    """A random run of allocations and frees with ``fault`` at a random step."""
    e, pool = engine, engine.pool
    ops: list[Any] = []
    live: list[str] = []
    for i in range(30):
        if live and rng.random() < 0.4:
            req = live.pop(rng.randrange(len(live)))
            ops.append(lambda r=req: e.free(r))
        elif rng.random() < 0.8:
            req = f"r{i}"
            live.append(req)
            size = rng.randint(1, 4)
            ops.append(lambda r=req, n=size: e.alloc(r, n))
        else:
            ops.append(lambda: None)
    ops += [lambda r=r: e.free(r) for r in live]

    def injected() -> None:  # on a request of its own, owned since the step before
        victim = e.req_to_blocks["victim"]
        if fault == "refree":
            pool.append(pool.free_block_queue.fake_free_list_tail.prev_free_block)
        elif fault == "free_pad":
            pool.append(pool.null_block)
        elif fault == "lost_free":
            for b in e.req_to_blocks.pop("victim"):
                b.ref_cnt -= 1
        elif fault == "extra_ref":
            victim[0].ref_cnt += 1
        elif fault == "share":
            victim[0].ref_cnt += 1
            e.req_to_blocks["intruder"].append(victim[0])
        elif fault == "leak":
            e.req_to_blocks.pop("victim")
        elif fault == "keep_owned":
            pool.append(victim[-1])

    ops.append(lambda: e.free("victim"))
    if fault is not None:
        at = rng.randrange(2, len(ops) - 1)
        ops[at:at] = [lambda: e.alloc("victim", 2), injected]
    return ops


@pytest.mark.parametrize("seed", range(60))
def test_random_runs_break_the_same_invariants_at_the_same_step(small_threshold: None, seed: int) -> None:
    """Full and delta probes of the same random run, a fault injected at a random step:
    the first step with a violation, and every violation at it, are the same."""
    fault = FAULTS[seed % len(FAULTS)]
    full_engine, delta_engine = Engine(120), Engine(120)
    want = ledger_violations(run(full_engine, random_ops(full_engine, random.Random(seed), fault), None))
    sent = run(delta_engine, random_ops(delta_engine, random.Random(seed), fault), DeltaTracker())
    got = ledger_violations(trace_from_dict(trace_to_dict(sent)))
    assert deltas(sent) > 0
    if fault is None:
        assert want == got == []
        return
    assert want, f"{fault}: the fault must break an invariant"
    first = want[0].step
    assert [str(v) for v in got if v.step == first] == [str(v) for v in want if v.step == first]
    assert got[0].step == first


def test_a_verdict_says_when_the_ledgers_were_read_as_deltas(small_threshold: None) -> None:
    from harness.checks.ledger import check_ledger

    def leaky(engine: Engine) -> list[Any]:
        ops = ops_for(engine)
        ops[4] = lambda: engine.req_to_blocks.pop("b")  # blocks kept, owner gone
        return ops

    full_engine, delta_engine = Engine(40), Engine(40)
    full = check_ledger(run(full_engine, leaky(full_engine), None))
    delta = check_ledger(trace_from_dict(trace_to_dict(run(delta_engine, leaky(delta_engine),
                                                           DeltaTracker()))))
    assert full.check == delta.check == "kv_ledger.conservation"
    assert "read as" not in full.details
    assert "KV ledgers read as 7 per-step deltas and 2 full snapshots" in delta.details
