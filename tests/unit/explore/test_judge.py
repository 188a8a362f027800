"""The judge asks of each example what the suites ask of such a run: the batch checks follow
from the geometry (a binding TKV limit, a pool that holds the batch or a smaller one), a full
batch only where the workload must fill it, block boundaries only where blocks follow tokens;
and a known failure of the stack is told apart from a finding."""

from __future__ import annotations

from harness.core.trace import (
    SOURCE_VLLM_SCHEDULER,
    KvSnapshot,
    RequestTrace,
    StepRecord,
    TokenStep,
    Trace,
)
from harness.core.verdict import FULL_BATCH, NO_PREEMPTION, Verdict
from harness.explore.example import Example, RequestShape, geometry_of
from harness.explore.judge import batch_verdicts, boundary_verdicts, full_batch_expected
from harness.explore.known import known_failure
from harness.explore.runner import FAILED, Outcome

BASE = {"max_model_len": 256, "max_num_seqs": 2, "chunk_size": 128}
FULL = geometry_of({**BASE, "pool": "full-batch"})
TIGHT = geometry_of({**BASE, "pool_requests": 1})
BOUND = geometry_of({**BASE, "pool": "full-batch", "batch_tkv_limit": 256})
LONG = (RequestShape(64, 10), RequestShape(64, 10))


def run(paused: bool = False, prefix_caching: bool = False) -> Trace:
    """Two requests of 4 prompt tokens and 2 outputs, run together (one paused, if asked)."""
    pool = KvSnapshot(source=SOURCE_VLLM_SCHEDULER, num_blocks=5, pad_blocks=[0],
                      free_blocks=[3, 4], owned={"r0": [1], "r1": [2]}, block_size=16,
                      prefix_caching=prefix_caching)
    steps = [StepRecord(step=0, running=["r0", "r1"], executed={"r0": 4, "r1": 4}, kv=[pool]),
             StepRecord(step=1, running=["r0", "r1"], executed={"r0": 1, "r1": 1},
                        paused=["r1"] if paused else [], kv=[pool])]
    tokens = [TokenStep(5, -0.1, {5: -0.1}), TokenStep(6, -0.1, {6: -0.1})]
    requests = {r: RequestTrace(r, [1, 2, 3, 4], list(tokens)) for r in ("r0", "r1")}
    return Trace(target="t", steps=steps, requests=requests,
                 metrics={"vllm:num_preemptions": 0.0})


def checks(verdicts: list[Verdict]) -> list[str]:
    return [v.check for v in verdicts]


def test_a_full_batch_is_expected_only_where_the_workload_must_fill_it():
    assert full_batch_expected(FULL, LONG)
    assert not full_batch_expected(FULL, LONG[:1])  # fewer requests than the batch
    assert not full_batch_expected(FULL, (RequestShape(64, 10), RequestShape(64, 10, arrival=1)))
    assert not full_batch_expected(FULL, (RequestShape(64, 10),
                                          RequestShape(64, 10, abort_after=2)))
    # two chunks each: the first must outlast both prefills (2 x 4 chunks + 2 tokens)
    assert not full_batch_expected(FULL, (RequestShape(200, 9), RequestShape(200, 20)))
    assert full_batch_expected(FULL, (RequestShape(200, 10), RequestShape(200, 10)))


def test_a_pool_that_holds_the_batch_may_neither_preempt_nor_pause():
    assert checks(batch_verdicts(FULL, LONG, (), run())) == [NO_PREEMPTION, FULL_BATCH]
    assert all(batch_verdicts(FULL, LONG, (), run()))
    paused = batch_verdicts(FULL, LONG, (), run(paused=True))
    assert not paused[0].ok and "pause:" in paused[0].why
    # a scheduler that may hold a newcomer back for its TKV is not asked for a full batch
    assert checks(batch_verdicts(FULL, LONG, (), run(), holds_back_for_tkv=True)) == [
        NO_PREEMPTION]


def test_a_binding_tkv_limit_allows_pauses_but_no_recompute():
    verdicts = batch_verdicts(BOUND, LONG, (), run(paused=True))
    assert checks(verdicts) == [NO_PREEMPTION] and verdicts[0].ok


def test_a_smaller_pool_asks_no_recompute_only_of_a_scheduler_that_holds_back():
    assert batch_verdicts(TIGHT, LONG, ("kv_ledger",), run()) == []
    assert checks(batch_verdicts(TIGHT, LONG, ("holds_back_on_blocks",), run())) == [
        NO_PREEMPTION]


def test_block_boundaries_are_judged_where_blocks_follow_tokens():
    sized = ("kv_ledger", "harness_sized_pool")
    assert checks(boundary_verdicts(LONG, sized, run())) == ["kv_ledger.block_boundary"]
    assert boundary_verdicts(LONG, ("kv_ledger",), run()) == []  # a pool the device sizes
    assert boundary_verdicts(LONG, sized, run(prefix_caching=True)) == []  # shared blocks
    assert boundary_verdicts((RequestShape(4, 1),), sized, run()) == []  # done in one step


def test_an_aborted_requests_kept_promise_on_2x_is_known_and_nothing_else():
    aborting = Example.of(FULL, (RequestShape(30, 60, abort_after=6), RequestShape(40, 20)))
    leak = Verdict.failed("kv_ledger.promises", "kv invariant promises broken at step 6: 1"
                          " blocks are still promised to request r0, which the scheduler no"
                          " longer has (a leaked reservation)")
    assert known_failure(leak, aborting, "spyre-eager-cp", "default") is not None
    assert known_failure(leak, aborting, "spyre-eager-cp", "spyre-1.10") is None
    assert known_failure(leak, aborting, "vllm-cpu", "default") is None
    not_aborted = Example.of(FULL, (RequestShape(30, 60), RequestShape(40, 20)))
    assert known_failure(leak, not_aborted, "spyre-eager-cp", "default") is None
    other = Verdict.failed("kv_ledger.conservation", "request r0 lists block 3 twice")
    assert known_failure(other, aborting, "spyre-eager-cp", "default") is None


def test_a_queue_starved_by_the_kept_promise_is_known_only_after_an_abort():
    stuck = Verdict.failed("engine_error", "EngineRequestError: engine spyre-eager-cp raised"
                           " RuntimeError: scenario did not finish within 2000 engine steps;"
                           " still running [], waiting ['r0-816bea9e']")
    aborting = Example.of(FULL, (RequestShape(53, 44, arrival=13),
                                 RequestShape(9, 64, abort_after=19)))
    assert known_failure(stuck, aborting, "spyre-eager-pc", "default") is not None
    plain = Example.of(FULL, (RequestShape(53, 44),))
    assert known_failure(stuck, plain, "spyre-eager-pc", "default") is None
    crash = Verdict.failed("engine_error", "EngineCrashed: died with exit code 3")
    assert known_failure(crash, aborting, "spyre-eager-pc", "default") is None


def test_an_override_the_device_rounds_down_for_its_batch_is_known_on_2x_only():
    four = Example.of(FULL, (RequestShape(30, 20),))
    batch = four.geometry.max_num_seqs
    assert batch > 1
    pool = 5 * batch + 1

    def short(device: int) -> Verdict:
        return Verdict.failed("kv_ledger.device_blocks", "kv invariant device_blocks broken at"
                              f" step -1: the pool has {pool} blocks but the device's KV cache"
                              f" holds {device} (ids 0..{device - 1}): the scheduler can hand"
                              " out blocks ...")

    assert known_failure(short(pool - 1), four, "spyre-eager-cp", "default") is not None
    assert known_failure(short(pool - 1), four, "spyre-eager-cp", "spyre-1.10") is None
    assert known_failure(short(pool - 1), four, "vllm-cpu", "default") is None
    assert known_failure(short(pool - 2), four, "spyre-eager-cp", "default") is None  # not it
    even = Verdict.failed("kv_ledger.device_blocks", f"the pool has {5 * batch} blocks but the"
                          f" device's KV cache holds {4 * batch}")
    assert known_failure(even, four, "spyre-eager-cp", "default") is None


def test_a_block_past_the_rounded_down_cache_is_known_as_the_same_defect():
    four = Example.of(FULL, (RequestShape(30, 20),))
    batch = four.geometry.max_num_seqs

    def crash(index: int, size: int) -> Verdict:
        return Verdict.failed("engine_error", "EngineRequestError: engine spyre-eager-cp raised"
                              f" IndexError: index {index} is out of bounds for dimension 0"
                              f" with size {size}")

    size = 4 * batch
    assert known_failure(crash(size, size), four, "spyre-eager-cp", "default") is not None
    assert known_failure(crash(size, size), four, "vllm-cpu", "default") is None
    assert known_failure(crash(size + batch, size), four, "spyre-eager-cp", "default") is None
    assert known_failure(crash(size + 1, size + 1), four, "spyre-eager-cp", "default") is None


def test_a_known_failure_is_no_finding_and_a_regression_test_does_not_expect_it():
    aborting = Example.of(FULL, (RequestShape(30, 60, abort_after=6),))
    leak = Verdict.failed("kv_ledger.promises", "1 blocks are still promised to request r0")
    tokens = Verdict.failed("token_equality", "token mismatch")
    known = known_failure(leak, aborting, "spyre-eager-cp", "default")
    only_known = Outcome(FAILED, verdicts=[leak, Verdict.passed("x")], known=[known])
    assert only_known.failure is None and only_known.judged == [Verdict.passed("x")]
    both = Outcome(FAILED, verdicts=[leak, tokens], known=[known])
    assert both.failure == tokens and both.judged == [tokens]
