"""KV block ledgers: the invariants on hand-built snapshots, the driver over a trace's steps
and the verdict it gives."""

from __future__ import annotations

from dataclasses import replace

from harness.checks.ledger import (
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
from harness.core.trace import KvSnapshot, StepRecord, Trace
from harness.targets.spyre.ledger_sources import SOURCE_SPYRE_RUNNER
from tests.unit.kv_snapshots import healthy, idle, only


def test_healthy_snapshot_passes_every_step_check() -> None:
    assert check_step(healthy(), 3) == []


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
