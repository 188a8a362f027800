"""Exact promises (sendnn-inference 2.x): each request the scheduler serves owns and is promised
the blocks of its prompt and max_tokens; promises only shrink and go with the request."""

from __future__ import annotations

from harness.checks.ledger import check_ledger, ledger_violations
from harness.checks.promises import blocks_to_serve, promise_violations
from harness.core.serialise import trace_from_dict, trace_to_dict
from harness.core.trace import StepRecord
from tests.unit.checks.admission_traces import request, snap, step, trace


def exact(*steps, requests=None):
    reqs = [request("a", 64, 40)] if requests is None else requests
    return [v for v in promise_violations(trace(list(steps), reqs))
            if v.invariant == "promise_exact"]


def test_blocks_to_serve_counts_prompt_and_max_tokens():
    assert blocks_to_serve(64, 40, 64) == 2
    assert blocks_to_serve(64, 128, 64) == 3
    assert blocks_to_serve(65, 64, 64) == 3  # the over-reserved block: 128 tokens written


def test_owned_plus_promised_equal_to_the_need_passes():
    assert exact(step(0, snap({"a": [1]}, {"a": 1}), ["a"]),
                 step(1, snap({"a": [1, 2]}, {"a": 0}), ["a"])) == []


def test_one_block_too_few_names_the_request_and_the_arithmetic():
    (v,) = exact(step(0, snap({"a": [1]}, {"a": 0}), ["a"]))
    assert v.step == 0 and v.source == "vllm-scheduler"
    assert v.message == ("request a owns 1 and is promised 0 block(s), 1 in all, but its prompt"
                         " of 64 tokens and max_tokens 40 need ceil(104/64) = 2: 1 block(s) too"
                         " few promised (the pool can run short under it)")


def test_one_block_too_many():
    (v,) = exact(step(3, snap({"a": [1]}, {"a": 2}), ["a"]))
    assert "1 block(s) too many promised (a newcomer that fits can be held back)" in v.message
    assert v.step == 3


def test_the_plugins_over_reservation_is_accepted_to_the_end():
    # 65 + 64 tokens: three blocks promised, the output stops at 128 tokens in two
    reqs = [request("a", 65, 64)]
    assert exact(step(0, snap({"a": [1, 2]}, {"a": 1}), ["a"]),
                 step(63, snap({"a": [1, 2]}, {"a": 1}), ["a"]), requests=reqs) == []
    (v,) = exact(step(0, snap({"a": [1, 2]}, {"a": 0}), ["a"]), requests=reqs)
    assert "need ceil(129/64) = 3: 1 block(s) too few" in v.message


def test_prefix_cache_hits_count_among_the_requests_own_blocks():
    # b shares a's first block (a prefix-cache hit): both own it, each is judged on its list
    s = snap({"a": [1, 2], "b": [1, 3]}, {"a": 0, "b": 0})
    s.ref_counts = {1: 2, 2: 1, 3: 1}
    s.prefix_caching = True
    reqs = [request("a", 64, 40), request("b", 70, 20)]
    assert exact(step(0, s, ["a", "b"]), requests=reqs) == []


def test_a_trace_without_max_tokens_says_nothing():
    assert exact(step(0, snap({"a": [1]}, {"a": 5}), ["a"]),
                 requests=[request("a", 64, None)]) == []
    assert exact(step(0, snap({"a": [1]}, {"a": 5}), ["a"]), requests=[]) == []


def test_a_request_no_longer_served_is_left_to_promises():
    s = snap({}, {"gone": 2}, serving=[])
    assert exact(step(0, s), requests=[request("gone", 64, 40)]) == []
    assert "leaked reservation" in " ".join(v.message for v in ledger_violations(
        trace([step(0, s)], [request("gone", 64, 40)])))


def test_a_promise_that_grows_fails_even_without_max_tokens():
    (v,) = exact(step(0, snap({"a": [1]}, {"a": 1}), ["a"]),
                 step(1, snap({"a": [1]}, {"a": 2}), ["a"]), requests=[request("a", 64, None)])
    assert v.step == 1 and "grew from 1 to 2 blocks" in v.message


def test_a_finished_request_keeps_no_promise():
    # where the scheduler's request table is unknown, the leak check cannot see it
    s = snap({}, {"a": 1}, serving=None)
    s.serving = None
    (v,) = exact(step(0, snap({"a": [1]}, {"a": 1}), ["a"]),
                 step(1, s, finished=["a"]), requests=[request("a", 64, None)])
    assert v.step == 1 and "finished at this step but is still promised 1 blocks" in v.message


def test_the_ledger_verdict_files_it_and_lists_the_requests():
    t = trace([step(0, snap({"a": [1]}, {"a": 0}), ["a"], arrived=["a"], prefilled=["a"])],
              [request("a", 64, 40)])
    verdict = check_ledger(t)
    assert not verdict.ok and verdict.check == "kv_ledger.promise_exact" and verdict.at == 0
    assert "requests (admission):" in verdict.details
    assert "  a: arrived at step 0, waited at steps -, admitted at step 0" in verdict.details


def test_max_tokens_and_the_admission_fields_cross_the_wire_and_old_traces_lack_them():
    t = trace([step(0, snap({"a": [1]}, {"a": 1}), ["a"], arrived=["a"], prefilled=["a"],
                    prefilling=[])], [request("a", 64, 40)])
    back = trace_from_dict(trace_to_dict(t))
    assert back == t and back.requests["a"].max_tokens == 40 and back.steps[0].arrived == ["a"]
    old = trace_to_dict(t)
    del old["requests"]["a"]["max_tokens"]
    for key in ("arrived", "prefilled", "prefilling"):
        del old["steps"][0][key]
    back = trace_from_dict(old)
    assert back.requests["a"].max_tokens is None and back.steps[0].prefilling is None
    assert StepRecord(step=0).arrived is None


def test_an_aborted_request_is_judged_while_it_is_served():
    # the trace keeps an aborted request apart (Trace.aborted), with the max_tokens it was
    # sent with: its promise while the scheduler served it is judged as any other's
    t = trace([step(0, snap({"a": [1]}, {"a": 0}), ["a"])], [])
    t.aborted = {"a": request("a", 64, 40)}
    t.aborted["a"].aborted_at = 1
    (v,) = [v for v in promise_violations(t) if v.invariant == "promise_exact"]
    assert "request a owns 1 and is promised 0 block(s)" in v.message
