"""Aborted requests, on hand-built traces: the abort must have been exercised, the engine
must not serve an aborted request, and its blocks are free after its abort step
(block timing); and the scenario side: the abort step travels to the engine, and token
equality compares only the requests that run to their end."""

from __future__ import annotations

from harness.checks.aborts import NAME, check_aborts
from harness.checks.ledger import ledger_violations
from harness.core import verdict as checks
from harness.core.serialise import step_from_dict, step_to_dict
from harness.core.trace import RequestTrace, StepRecord, Trace
from harness.report.categories import category_of_check
from harness.scenario.prompts import EngineLimits, shaped_scenario
from harness.targets.spyre.ledger_sources import SOURCE_SPYRE_RUNNER
from tests.unit.checks.test_block_timing import pool, trace


class Words:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [len(w) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join("x" * i for i in ids)


def aborted_run(freed: bool) -> Trace:
    """r1 is aborted before step 2 while r2 runs on; with ``freed`` its blocks are free in
    the snapshot after step 2, else it keeps them to the end (a leak at idle)."""
    after = {"r2": [3]} if freed else {"r1": [1, 2], "r2": [3]}
    return trace(
        StepRecord(0, running=["r1", "r2"], kv=[pool({"r1": [1, 2], "r2": [3]})]),
        StepRecord(1, running=["r1", "r2"], kv=[pool({"r1": [1, 2], "r2": [3]})]),
        StepRecord(2, running=["r2"], aborted=["r1"], delivered_finished=["r1"],
                   kv=[pool(after)]),
        StepRecord(3, finished=["r2"], kv=[pool({} if freed else {"r1": [1, 2]})]),
        StepRecord(4, delivered_finished=["r2"], kv=[pool({} if freed else {"r1": [1, 2]})]),
    )


def test_an_abort_exercised_and_not_served_passes() -> None:
    assert check_aborts({"r1": 2}, aborted_run(freed=True)).ok
    assert check_aborts({}, aborted_run(freed=True)).ok
    assert ledger_violations(aborted_run(freed=True)) == []


def test_an_abort_never_exercised_says_the_run_tests_none() -> None:
    v = check_aborts({"r1": 5}, aborted_run(freed=True))
    assert not v.ok and v.check == checks.KV_LEDGER_UNRECORDED
    assert "request r1 before step 5: aborted at step 2 instead" in v.why
    missing = check_aborts({"r2": 1}, aborted_run(freed=True))
    assert "it was not live then (finished earlier, or had not arrived)" in missing.why
    assert category_of_check("failed", missing.check) == "engine crash / harness error"


def test_an_aborted_request_served_to_its_end_fails() -> None:
    t = aborted_run(freed=True)
    t.requests["r1"] = RequestTrace("r1", (1, 2), [])
    v = check_aborts({"r1": 2}, t)
    assert not v.ok and v.check == NAME and "went on serving them" in v.why
    assert category_of_check("failed", NAME) == "block leak"


def test_an_aborted_request_that_keeps_its_blocks_is_a_leak() -> None:
    found = {(v.invariant, v.step) for v in ledger_violations(aborted_run(freed=False))}
    assert ("idle_all_free", 4) in found  # kept to the end: a leak at the idle point


def test_blocks_an_aborted_request_gives_back_a_step_late_are_late() -> None:
    t = aborted_run(freed=True)
    t.steps[2].kv = [pool({"r1": [1, 2], "r2": [3]})]  # given back at step 3 instead
    (v,) = [v for v in ledger_violations(t) if v.invariant == "freed_on_finish"]
    assert v.step == 2 and "request r1 was aborted at step 2 but still owns blocks [1, 2]" in v.message
    runner = aborted_run(freed=True)
    runner.steps[2].kv = [pool({"r1": [1, 2], "r2": [3]}, source=SOURCE_SPYRE_RUNNER)]
    runner.steps[3].kv = [pool({"r2": [3]}, source=SOURCE_SPYRE_RUNNER)]
    msgs = [v.message for v in ledger_violations(runner) if v.invariant == "freed_on_finish"]
    assert msgs and "was aborted and its runner heard of it at step 2" in msgs[0]


def test_the_abort_step_travels_and_token_equality_skips_aborted_requests() -> None:
    limits = EngineLimits(max_model_len=256, max_num_seqs=4)
    s = shaped_scenario("abort", Words(), [(10, 20, 0, 3), (12, 5, 0)], limits)
    assert s.aborts() == {"r0": 3}
    payload = s.payload()
    assert payload[0]["abort_step"] == 3 and "abort_step" not in payload[1]
    assert [r.request_id for r in s.completing().requests] == ["r1"]
    assert s.requests[0].abort_step == 3  # the scenario itself is kept whole


def test_a_step_records_its_aborts() -> None:
    step = StepRecord(2, aborted=["r1"])
    assert step_from_dict(step_to_dict(step)).aborted == ["r1"]
    assert step_from_dict({"step": 1}).aborted == []
