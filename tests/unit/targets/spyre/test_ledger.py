"""The Spyre plugin's ledger readers read its runners (fakes of the real stacks here) into
snapshots without changing them, registered with the engine's probes."""

from __future__ import annotations

from collections import deque

from harness.checks.ledger import check_idle_all_free, check_step
from harness.core.trace import SOURCE_VLLM_SCHEDULER
from harness.in_engine.probes import snapshot_engine
from harness.targets.spyre.ledger import (
    LEGACY_DUMMY_ID,
    snapshot_legacy_spyre_runner,
    snapshot_spyre_runner,
)
from harness.targets.spyre.ledger_sources import SOURCE_SPYRE_LEGACY_RUNNER, SOURCE_SPYRE_RUNNER
from tests.unit.vllm_fakes import (
    FakeCBRunner,
    FakeCPRunner,
    FakeLegacyRunner,
    engine_core,
    fake_manager,
    fake_pool,
    fake_vllm_scheduler,
)


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
    new = snapshot_engine(engine_core(sched, FakeCBRunner(8, {}, {})))
    assert [s.source for s in new] == [SOURCE_VLLM_SCHEDULER, SOURCE_SPYRE_RUNNER]
    legacy = snapshot_engine(engine_core(sched, FakeLegacyRunner(8)))
    assert [s.source for s in legacy] == [SOURCE_VLLM_SCHEDULER, SOURCE_SPYRE_LEGACY_RUNNER]
    for snaps in (new, legacy):
        assert all(check_step(s, 0) + check_idle_all_free(s) == [] for s in snaps)
