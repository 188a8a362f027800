"""Admission by KV blocks: never an admission the pool cannot hold (``overcommit``), never the
head of the queue held back where the scheduler had room for it (``hold_back``), and the
block-admission suite's precondition."""

from __future__ import annotations

from dataclasses import replace

from harness.checks.admission import (
    admission_violations,
    check_blocks_limited_admission,
    check_hold_back,
    check_overcommit,
    step_ranges,
)
from harness.checks.ledger import check_ledger
from harness.core.trace import KvSnapshot, StepRecord
from harness.targets.spyre.ledger_sources import SOURCE_SPYRE_RUNNER
from tests.unit.checks.admission_traces import request, snap, step, trace

A, B = request("a", 64, 40), request("b", 30, 20)  # two blocks; one block


def joining(held: bool = True, before: dict | None = None, at: dict | None = None,
            info: dict | None = None, n: int = 10):
    """a runs from step 0 (prefill), decodes at 1; b arrives at 2 and is held there (``held``)
    or admitted. ``before`` / ``at`` replace fields of the records of step 1 / step 2."""
    decoding = snap({"a": [1, 2]}, {"a": 0}, n=n)
    s1 = step(1, decoding, ["a"])
    s2 = (step(2, decoding, ["a"], ["b"], arrived=["b"]) if held else
          step(2, snap({"a": [1, 2], "b": [3]}, {"a": 0, "b": 0}, n=n), ["b", "a"],
               arrived=["b"], prefilled=["b"]))
    steps = [step(0, snap({"a": [1]}, {"a": 1}, n=n), ["a"], arrived=["a"], prefilled=["a"]),
             replace(s1, **(before or {})), replace(s2, **(at or {}))]
    return trace(steps, [A, B], initial=snap(n=n), **(info or {}))


# -------------------------------------------------------------------------- hold_back


def test_a_newcomer_admitted_at_once_passes():
    assert admission_violations(joining(held=False)) == []


def test_a_newcomer_held_back_with_room_fails_naming_it_and_the_room():
    (v,) = check_hold_back(joining())
    assert v.invariant == "hold_back" and v.step == 2 and v.source == "vllm-scheduler"
    assert v.message == ("request b was held back although the scheduler had room for it: 1 of"
                         " 4 running, no prefill under way, nobody paused, and its 1 block fit"
                         " in 7 blocks (7 free - 0 promised)")


def test_the_ledger_verdict_files_the_hold_back_with_its_table():
    verdict = check_ledger(joining())
    assert not verdict.ok and verdict.check == "kv_ledger.hold_back" and verdict.at == 2
    assert ">>  2" in verdict.details
    assert ("  b: arrived at step 2, waited at steps 2, admitted at step -, finished at step -;"
            " needs 1 block") in verdict.details


def test_reasons_a_newcomer_may_wait():
    assert check_hold_back(joining(info={"max_num_seqs": 1})) == []  # the batch is full
    assert check_hold_back(joining(before={"prefilling": ["a"]})) == []  # a prefill under way
    assert check_hold_back(joining(before={"prefilled": ["a"]})) == []  # interleaved decode
    assert check_hold_back(joining(before={"paused": ["c"]})) == []  # paused requests first
    assert check_hold_back(joining(at={"paused": ["a"]})) == []
    assert check_hold_back(joining(at={"aborted": ["c"]})) == []  # an abort freed blocks


def test_where_the_batch_tkv_limit_may_bind_it_says_nothing():
    # a with b at max_model_len each: 2 x 256 = 512 tokens
    assert check_hold_back(joining(info={"max_batch_tkv_limit": 511})) == []
    assert check_hold_back(joining(info={"max_batch_tkv_limit": 512})) != []
    # without the limit recorded: max_model_len x max_num_seqs, the plugin's default
    assert check_hold_back(joining(info={"max_num_seqs": 2})) != []


def test_with_pausing_off_the_limit_may_bind_beside_any_running_request():
    t = joining()
    object.__setattr__(t.steps[1].kv[0], "pausing", False)
    assert check_hold_back(t) == []


def test_blocks_short_is_a_reason():
    # a pool of a's two blocks and the pad block: nothing left for b
    assert check_hold_back(joining(n=3)) == []


def test_the_room_counts_the_promises_the_requests_need_not_those_recorded():
    # a is recorded as promised 7 blocks (one too many each); by its need it is promised none
    t = joining(before={"kv": [snap({"a": [1, 2]}, {"a": 7})]})
    (v,) = check_hold_back(t)
    assert "fit in 7 blocks (7 free - 0 promised)" in v.message


def test_a_trace_without_the_admission_fields_says_nothing():
    assert check_hold_back(joining(at={"arrived": None})) == []
    assert check_hold_back(joining(before={"prefilling": None})) == []
    t = joining()
    t.requests["b"] = request("b", 30, None)
    assert admission_violations(t) == []


# ------------------------------------------------------------------------- overcommit


def tight(b_owns: list[int], shared: bool = False):
    """A pool of blocks 1-3: a holds 1 and 2 and needs no more; b (64 + 100: three blocks)
    is admitted at step 2 into room for one block."""
    b = request("b", 64, 100)
    a_blocks = {"a": [1, 2]}
    s2 = snap({**a_blocks, "b": b_owns}, {"a": 0, "b": 3 - len(b_owns)}, n=4)
    if shared:
        s2.ref_counts = {1: 2, 2: 1, **{x: 1 for x in b_owns if x != 1}}
        s2.prefix_caching = True
    steps = [step(0, snap({"a": [1]}, {"a": 1}, n=4), ["a"], ["b"], arrived=["a", "b"],
                  prefilled=["a"]),
             step(1, snap(a_blocks, {"a": 0}, n=4), ["a"], ["b"]),
             step(2, s2, ["b", "a"], prefilled=["b"])]
    return trace(steps, [A, b], initial=snap(n=4))


def test_an_admission_beyond_the_room_fails():
    (v,) = check_overcommit(tight([3]))
    assert v.invariant == "overcommit" and v.step == 2
    assert v.message == ("request b was admitted: it needs ceil(164/64) = 3 blocks, but the pool"
                         " had room for 1 block (1 free - 0 promised): admission overcommitted"
                         " the pool")
    assert check_ledger(tight([3])).check == "kv_ledger.overcommit"


def test_blocks_shared_from_the_prefix_cache_are_not_taken_from_the_pool():
    # b's first block is a's (a prefix-cache hit): it takes two of the pool's blocks
    (v,) = check_overcommit(tight([1, 3], shared=True))
    assert "needs ceil(164/64) = 3 blocks, 1 shared from the prefix cache" in v.message
    assert "room for 1 block" in v.message


def test_an_admission_that_fits_passes():
    t = tight([3])
    t.requests["b"] = request("b", 30, 20)  # one block
    for s in t.steps[2].kv:
        s.promised = {"a": 0, "b": 0}
        s.promised_total = 0
    assert check_overcommit(t) == []


def runner(reserved: dict[str, int], reported: int) -> KvSnapshot:
    """A vllm-spyre 1.x runner snapshot (reservations and the free count it reports)."""
    return KvSnapshot(source=SOURCE_SPYRE_RUNNER, num_blocks=8, pad_blocks=[0], reserved=reserved,
                      reported_free=reported, block_size=64)


def test_a_1x_reservation_beyond_the_reported_free_blocks_fails():
    steps = [StepRecord(step=0, running=["a"], kv=[runner({"a": 3}, 4)]),
             StepRecord(step=1, running=["b", "a"], kv=[runner({"a": 3, "b": 5}, -1)])]
    (v,) = check_overcommit(trace(steps, [A, B], initial=runner({}, 7)))
    assert v.source == SOURCE_SPYRE_RUNNER and v.step == 1
    assert "request b was admitted: it reserves 5 blocks, but the pool had room for 4 blocks" \
           " (4 reported free)" in v.message


def test_a_1x_reservation_into_blocks_released_at_the_step_passes():
    # a finished at step 0; the runner drops its reservation as step 1 tells it
    steps = [StepRecord(step=0, finished=["a"], kv=[runner({"a": 3}, 4)]),
             StepRecord(step=1, running=["b"], delivered_finished=["a"],
                        kv=[runner({"b": 5}, 2)])]
    assert check_overcommit(trace(steps, [A, B], initial=runner({}, 7))) == []


# ------------------------------------------------------- the suite's precondition


def test_blocks_limited_admission_seen():
    # b waits at step 1 and 2 beside one running request, with no room for its three blocks
    verdict = check_blocks_limited_admission(tight([3]))
    assert verdict.ok and verdict.check == "full_batch.blocks_limited"
    assert "request b held back at step 1: 1 of 4 running, its 3 blocks beyond 1 block" in verdict.why


def test_blocks_never_limiting_admission_fails_with_what_waited():
    verdict = check_blocks_limited_admission(joining())
    assert not verdict.ok and "blocks never limited admission" in verdict.why
    assert "b waited at steps 2" in verdict.why and ">>" in verdict.details


def test_no_promises_nor_reservations_recorded_fails():
    t = joining()
    for record in t.ledger_steps():
        for s in record.kv:
            s.promised = None
    verdict = check_blocks_limited_admission(t)
    assert not verdict.ok and "records neither promises nor reservations" in verdict.why


def test_step_ranges():
    assert step_ranges([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert step_ranges([]) == "-"
