"""The pool's blocks exist on the device (harness/checks/device_blocks.py): broken snapshots
and traces, and the ledger verdict they give."""

from __future__ import annotations

from harness.checks.device_blocks import (
    check_device_blocks,
    check_device_count,
    check_device_counts,
    check_device_ids,
    missing_ids,
)
from harness.checks.ledger import check_ledger, check_step, ledger_violations
from harness.core.serialise import snapshot_from_dict, snapshot_to_dict
from harness.core.trace import KvSnapshot, RequestTrace, StepRecord, Trace

SRC = "vllm-scheduler"


def snap(n=10, device=10, owned=None, runner=None, pad=(0,)):
    owned = owned or {}
    used = {b for ids in owned.values() for b in ids}
    free = [b for b in range(n) if b not in used and b not in pad]
    return KvSnapshot(source=SRC, num_blocks=n, pad_blocks=list(pad), free_blocks=free,
                      owned=owned, counted_free=len(free), runner_blocks=runner,
                      ref_counts={b: 1 for b in used}, device_blocks=device)


def names(violations):
    return [v.invariant for v in violations]


def test_a_pool_the_size_of_the_device_passes():
    s = snap(owned={"r0": [1, 9]}, runner={"r0": [1, 9]})
    assert check_device_blocks(s) == [] and check_step(s, 0) == []


def test_an_unread_device_count_judges_nothing():
    s = snap(n=10, device=None, owned={"r0": [1, 9]})
    assert check_device_blocks(s) == [] and missing_ids(s) == []


def test_a_pool_larger_than_the_device_is_a_defect():
    (v,) = check_device_count(snap(n=10, device=9))
    assert v.invariant == "device_blocks" and v.source == SRC
    assert v.message == ("the pool has 10 blocks but the device's KV cache holds 9 (ids 0..8):"
                         " the scheduler can hand out blocks [9], which do not exist on the"
                         " device (a defect: their KV is written out of bounds)")


def test_a_pool_smaller_than_the_device_is_a_waste():
    (v,) = check_device_count(snap(n=8, device=10))
    assert "the pool has 8 blocks but the device's KV cache holds 10 (ids 0..9)" in v.message
    assert "blocks [8, 9] are allocated and never handed out (a waste" in v.message


def test_a_block_the_pool_gives_beyond_the_device_names_the_request():
    s = snap(n=10, device=9, owned={"r0": [1, 9]}, runner={"r0": [1, 9]})
    ids = check_device_ids(s)
    assert names(ids) == ["device_blocks", "device_blocks"]
    assert ids[0].message == ("the pool gives request r0 blocks [9] beyond the device's KV cache"
                              " of 9 blocks (ids 0..8): the request's KV there has no memory"
                              " behind it")
    assert ids[1].message.startswith("the runner's table gives request r0 blocks [9] beyond")
    assert len(check_device_blocks(s)) == 3  # and the count


def test_the_runners_table_alone_beyond_the_device():
    s = snap(n=10, device=10, owned={"r0": [1]}, runner={"r0": [12]})
    (v,) = check_device_ids(s)
    assert "the runner's table gives request r0 blocks [12] beyond the device's KV cache of 10" \
        in v.message


def test_a_pad_block_beyond_the_device():
    s = snap(n=10, device=10, pad=(0, 11))
    (v,) = check_device_ids(s)
    assert v.message.startswith("pad blocks [11] lie beyond the device's KV cache of 10 blocks")


def test_many_missing_ids_are_listed_short():
    (v,) = check_device_count(snap(n=40, device=10))
    assert "blocks [10, 11, 12, 13, 14, 15, 16, 17, ... 22 more]" in v.message


def test_an_empty_device_cache():
    (v,) = check_device_count(snap(n=4, device=0))
    assert "the device's KV cache holds 0 (no ids)" in v.message


def record(step, s):
    return StepRecord(step=step, kv=[s])


def test_a_count_mismatch_is_reported_where_it_appears_and_where_it_changes():
    records = [record(-1, snap(device=10)), record(0, snap(device=9)), record(1, snap(device=9)),
               record(2, snap(device=8)), record(3, snap(device=8))]
    out = check_device_counts(records)
    assert [v.step for v in out] == [0, 2]
    assert "holds 9" in out[0].message and "holds 8" in out[1].message


def test_the_ledger_verdict_names_the_step_and_the_defect_once():
    bad = snap(n=10, device=9)
    steps = [StepRecord(step=i, running=["r0"], kv=[snap(n=10, device=9, owned={"r0": [1]})])
             for i in range(30)]
    trace = Trace(target="spyre-eager-cp", requests={"r0": RequestTrace("r0", [1, 2])},
                  steps=steps, initial=StepRecord(step=-1, kv=[bad]))
    violations = ledger_violations(trace)
    assert [(v.invariant, v.step) for v in violations] == [("device_blocks", -1)]
    verdict = check_ledger(trace)
    assert not verdict.ok and verdict.check == "kv_ledger.device_blocks" and verdict.at == -1
    assert verdict.why.startswith("kv invariant device_blocks broken at step -1: the pool has"
                                  " 10 blocks but the device's KV cache holds 9")
    assert "invariants broken: device_blocks\n1 violation(s):" in verdict.details


def test_a_block_handed_out_beyond_the_device_is_named_at_its_step():
    steps = [StepRecord(step=0, running=["r0"], kv=[snap(n=10, device=9, owned={"r0": [1]})]),
             StepRecord(step=1, running=["r0"], kv=[snap(n=10, device=9, owned={"r0": [1, 9]})])]
    trace = Trace(target="t", steps=steps)
    per_step = [(v.step, v.message[:40]) for v in ledger_violations(trace)]
    assert per_step == [(0, "the pool has 10 blocks but the device's "),
                        (1, "the pool gives request r0 blocks [9] bey")]


def test_the_device_count_crosses_the_engine_socket():
    s = snap(device=9)
    assert snapshot_from_dict(snapshot_to_dict(s)).device_blocks == 9
    assert snapshot_from_dict({"source": SRC, "num_blocks": 4}).device_blocks is None
