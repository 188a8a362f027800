"""Ledger invariants of sendnn-inference 2.x: scheduler promises and the runner's block table."""

from __future__ import annotations

from harness.checks.ledger import check_idle, check_step, ledger_violations
from harness.checks.preemption import check_no_preemption, check_pausing_seen
from harness.core.trace import KvSnapshot, RequestTrace, StepRecord, Trace

SRC = "vllm-scheduler"


def snap(owned=None, free=None, promised=None, total=None, serving=None, runner=None, n=10):
    owned = owned or {}
    used = {b for ids in owned.values() for b in ids}
    free = [b for b in range(1, n) if b not in used] if free is None else free
    return KvSnapshot(source=SRC, num_blocks=n, pad_blocks=[0], free_blocks=free, owned=owned,
                      counted_free=len(free), promised=promised, promised_total=total,
                      serving=serving, runner_blocks=runner,
                      ref_counts={b: 1 for b in used})


def names(violations):
    return [v.invariant for v in violations]


def test_consistent_promises_and_table_pass():
    s = snap(owned={"a": [1, 2]}, promised={"a": 2}, total=2, serving=["a"], runner={"a": [1, 2]})
    assert check_step(s, 0) == []


def test_promise_total_disagrees():
    s = snap(owned={"a": [1]}, promised={"a": 2}, total=3, serving=["a"], runner={"a": [1]})
    v = check_step(s, 3)
    assert names(v) == ["promises"] and "total is 3" in v[0].message and v[0].step == 3


def test_promises_beyond_free_blocks():
    s = snap(owned={"a": [1]}, promised={"a": 9}, total=9, serving=["a"], runner={"a": [1]})
    assert any("only 8 are free" in v.message for v in check_step(s, 0))


def test_promise_left_for_a_finished_request():
    s = snap(promised={"gone": 2}, total=2, serving=[], runner={})
    v = check_step(s, 0)
    assert names(v) == ["promises"] and "leaked reservation" in v[0].message


def test_idle_with_promises_fails():
    s = snap(promised={"a": 1}, total=1, serving=["a"], runner={})
    assert "idle_all_free" in names(check_idle(s, 5))


def test_runner_table_diverges_from_pool():
    s = snap(owned={"a": [1, 2]}, promised={"a": 0}, total=0, serving=["a"], runner={"a": [1, 3]})
    v = check_step(s, 0)
    assert names(v) == ["runner_table"] and "pool gives it [1, 2]" in v[0].message


def test_runner_stores_the_pad_block():
    s = snap(owned={"a": [1]}, promised={}, total=0, serving=["a"], runner={"a": [0, 1]})
    assert any("pad block" in v.message for v in check_step(s, 0))


def test_freed_block_reaching_another_request_while_runner_holds_it():
    # "a" finished: the pool gave its block 1 to "b", the runner still lists it for "a".
    s = snap(owned={"b": [1]}, promised={"b": 0}, total=0, serving=["b"],
             runner={"a": [1], "b": [1]})
    v = check_step(s, 0)
    assert any("still holds block 1 for request a" in x.message and "gave it to b" in x.message
               for x in v)


def _trace(steps):
    return Trace(target="t", steps=steps, initial=None, idle_at_end=True)


def test_one_step_lag_is_allowed_two_are_not():
    fresh = snap(owned={}, promised={}, total=0, serving=[], runner={"a": [1]})
    gone = snap(owned={}, promised={}, total=0, serving=[], runner={})
    ok = ledger_violations(_trace([StepRecord(step=0, kv=[fresh]), StepRecord(step=1, kv=[gone])]))
    assert "runner_table" not in names(ok)
    kept = ledger_violations(_trace([StepRecord(step=0, kv=[fresh]),
                                     StepRecord(step=1, kv=[snap(promised={}, total=0, serving=[],
                                                                 runner={"a": [1]})])]))
    assert any(v.invariant == "runner_table" and v.step == 1 and "a step after" in v.message
               for v in kept)


def _paused_trace(paused_at):
    steps = [StepRecord(step=i, running=["a"], paused=["b"] if i == paused_at else [],
                        executed={"a": 1} if i == 0 else {}) for i in range(3)]
    t = _trace(steps)
    t.metrics = {"vllm:num_preemptions": 0.0}
    t.requests["a"] = RequestTrace(request_id="a", prompt_token_ids=[1, 2], steps=[])
    return t


def test_a_pause_fails_no_preemption_with_its_step():
    v = check_no_preemption(_paused_trace(1))
    assert not v.ok and v.why.startswith("pause:") and "step 1: ['b']" in v.why and v.at == 1


def test_pausing_seen_needs_a_pause():
    assert check_pausing_seen(_paused_trace(2)).ok
    assert not check_pausing_seen(_paused_trace(-1)).ok
