"""Block timing: a request's blocks are free in the snapshot of the step it finished at, on
hand-built traces (vLLM's scheduler pool, and a runner's own pool that hears a step later)."""

from __future__ import annotations

from harness.checks.block_timing import check_freed_on_finish
from harness.checks.ledger import check_ledger, ledger_violations
from harness.core.trace import (
    SOURCE_VLLM_SCHEDULER,
    KvSnapshot,
    StepRecord,
    Trace,
)
from harness.report.categories import category_of_check
from harness.targets.spyre.ledger_sources import SOURCE_SPYRE_RUNNER

BLOCKS = 8  # block 0 is the pad (null) block


def pool(owned: dict[str, list[int]], source: str = SOURCE_VLLM_SCHEDULER) -> KvSnapshot:
    """A consistent pool of ``BLOCKS`` blocks where ``owned`` holds what it says."""
    held = {b for ids in owned.values() for b in ids}
    return KvSnapshot(
        source=source, num_blocks=BLOCKS, pad_blocks=[0],
        free_blocks=[b for b in range(1, BLOCKS) if b not in held], owned=dict(owned),
        dummy_ids=[r for r in owned if r.startswith("warmup")],
        counted_free=BLOCKS - 1 - len(held), ref_counts={b: 1 for b in held},
    )


def trace(*steps: StepRecord, idle_at_end: bool = True) -> Trace:
    return Trace(target="vllm-cpu", steps=list(steps), initial=StepRecord(-1, kv=[pool({})]),
                 idle_at_end=idle_at_end)


def two_requests(late: bool) -> Trace:
    """r1 and r2 run; r1 finishes at step 1 and r2 at step 2; with ``late`` the pool gives
    r1's blocks back at step 2 instead of step 1."""
    at_1 = {"r1": [1, 2], "r2": [3, 4]} if late else {"r2": [3, 4]}
    return trace(
        StepRecord(0, running=["r1", "r2"], kv=[pool({"r1": [1, 2], "r2": [3, 4]})]),
        StepRecord(1, running=["r2"], finished=["r1"], kv=[pool(at_1)]),
        StepRecord(2, finished=["r2"], delivered_finished=["r1"], kv=[pool({})]),
        StepRecord(3, delivered_finished=["r2"], kv=[pool({})]),
    )


def test_blocks_freed_at_the_finishing_step_pass() -> None:
    t = two_requests(late=False)
    assert check_freed_on_finish(t.ledger_steps(), t.idle_steps()) == []
    assert check_ledger(t).ok


def test_blocks_freed_one_step_late_fail_with_the_step_and_the_blocks() -> None:
    t = two_requests(late=True)
    (v,) = ledger_violations(t)  # nothing else breaks: the blocks are still owned
    assert (v.invariant, v.step, v.source) == ("freed_on_finish", 1, SOURCE_VLLM_SCHEDULER)
    assert v.message == ("block timing: request r1 finished at step 1 but still owns blocks"
                         " [1, 2] after that step (freed late: given back at step 2)")
    verdict = check_ledger(t)
    assert not verdict.ok and verdict.check == "kv_ledger.freed_on_finish" and verdict.at == 1
    assert "kv invariant freed_on_finish broken at step 1: block timing: request r1" in verdict.why
    assert category_of_check("failed", verdict.check) == "block leak"


def test_a_preempted_request_that_keeps_nothing_is_not_a_finish() -> None:
    """r2 is preempted (its blocks freed, back to waiting) at the step r1 finishes, and
    resumes later: neither is flagged."""
    t = trace(
        StepRecord(0, running=["r1", "r2"], kv=[pool({"r1": [1, 2], "r2": [3, 4]})]),
        StepRecord(1, running=[], waiting=["r2"], finished=["r1"], preempted=["r2"],
                   kv=[pool({})]),
        StepRecord(2, running=["r2"], delivered_finished=["r1"], kv=[pool({"r2": [5, 6]})]),
        StepRecord(3, finished=["r2"], kv=[pool({})]),
        StepRecord(4, delivered_finished=["r2"], kv=[pool({})]),
    )
    assert ledger_violations(t) == []


def test_a_paused_request_keeps_its_blocks_without_being_flagged() -> None:
    t = trace(
        StepRecord(0, running=["r1", "r2"], kv=[pool({"r1": [1], "r2": [2]})]),
        StepRecord(1, running=["r1"], paused=["r2"], kv=[pool({"r1": [1, 3], "r2": [2]})]),
        StepRecord(2, running=["r2"], finished=["r1"], kv=[pool({"r2": [2, 4]})]),
        StepRecord(3, finished=["r2"], delivered_finished=["r1"], kv=[pool({})]),
        StepRecord(4, delivered_finished=["r2"], kv=[pool({})]),
    )
    assert ledger_violations(t) == []


def test_blocks_never_given_back_are_left_to_the_idle_check() -> None:
    t = trace(
        StepRecord(0, running=["r1"], kv=[pool({"r1": [1, 2]})]),
        StepRecord(1, finished=["r1"], kv=[pool({"r1": [1, 2]})]),
        StepRecord(2, delivered_finished=["r1"], kv=[pool({"r1": [1, 2]})]),
    )
    assert {v.invariant for v in ledger_violations(t)} == {"idle_all_free"}
    # without an idle point to report the leak, block timing reports it
    t.idle_at_end = False
    (v,) = ledger_violations(t)
    assert v.invariant == "freed_on_finish" and "still held at step 2, the last recorded" in v.message


def test_warmup_and_padding_requests_are_not_judged() -> None:
    t = trace(
        StepRecord(0, running=["r1"], kv=[pool({"r1": [1], "warmup-0": [2]})]),
        StepRecord(1, finished=["r1", "warmup-0"], kv=[pool({"warmup-0": [2]})]),
        StepRecord(2, kv=[pool({})]),
    )
    assert check_freed_on_finish(t.ledger_steps(), t.idle_steps()) == []


def test_a_runner_pool_frees_at_the_step_it_hears_of_the_finish() -> None:
    """A runner's own pool (vllm-spyre 1.x) frees a request in the step whose scheduler
    output delivers its finish: holding it at the finishing step is on time."""
    def step(n: int, runner: dict[str, list[int]], **kw: list[str]) -> StepRecord:
        return StepRecord(n, kv=[pool({}), pool(runner, SOURCE_SPYRE_RUNNER)], **kw)

    on_time = [step(0, {"r1": [1, 2]}, running=["r1"]),
               step(1, {"r1": [1, 2]}, finished=["r1"]),
               step(2, {}, delivered_finished=["r1"]),
               step(3, {})]
    assert check_freed_on_finish(on_time, {3}) == []
    late = [*on_time[:2], step(2, {"r1": [1, 2]}, delivered_finished=["r1"]), step(3, {})]
    (v,) = check_freed_on_finish(late, {3})
    assert (v.step, v.source) == (2, SOURCE_SPYRE_RUNNER)
    assert ("request r1 finished and its runner heard of it at step 2 but still owns blocks"
            " [1, 2]") in v.message and "given back at step 3" in v.message
