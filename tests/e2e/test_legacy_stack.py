"""The legacy stack (vllm-spyre 0.4.0): its dummy-block padding is seen step by step; a
dummy that keeps its blocks when a second request joins fails the suite at that step; a
block freed twice into the runner's free deque breaks no_double_free; and a ledger adapter
that no longer sees the dummy fails the dummy-padding test (the stack declares padding),
never skips it."""

import re

import pytest

from harness.stacks.spec import stack_python
from tests.suite_runner import run_suite

STACK = "legacy-spyre-0.4"

pytestmark = [
    pytest.mark.e2e,  # each test runs a suite in a child pytest on the legacy stack
    pytest.mark.skipif(
        stack_python(STACK) is None,
        reason=f"stack {STACK} is not installed: run ./setup.sh --stack {STACK}",
    ),
]


def test_dummy_kept_on_join_fails_at_the_join_step(tmp_path):
    run = run_suite(tmp_path, "suites/test_block_freeing.py", "-k", "dummy_padding",
                    "--stack", STACK, "--model", "tiny-llama", "--target", "spyre-eager-cb",
                    "--inject-fault", "keep-dummy-on-join")
    assert run.returncode == 1, run.output[-3000:]
    (name,) = run.failed()
    message = run.messages[name]
    assert run.check(name) == "kv_ledger.dummy_returned", message[:2000]
    assert run.category(name) == "block leak", message[:2000]
    m = re.search(r"kv invariant dummy_returned broken at step (\d+): dummy 'dummy' still holds"
                  r" blocks \[[\d, ]+\] although 2 real requests run", message)
    assert m, message
    # The per-step table marks that step as the first broken one.
    assert re.search(rf">>\s+{m.group(1)}\s", message), message


def test_same_scenario_passes_without_the_fault(tmp_path):
    run = run_suite(tmp_path, "suites/test_block_freeing.py", "-k", "dummy_padding",
                    "--stack", STACK, "--model", "tiny-llama", "--target", "spyre-eager-cb")
    assert run.returncode == 0, run.output[-3000:]
    assert list(run.outcomes.values()) == ["passed"]


def test_double_free_and_an_adapter_blind_to_the_dummy(tmp_path):
    """One child run, an engine per test: legacy-double-free (only for request r2, which
    only the back-to-idle scenario has) breaks no_double_free first; misname-dummy makes
    the ledger adapter list the dummy under an ordinary id, so the dummy-padding test
    must fail because the stack declares padding."""
    run = run_suite(tmp_path, "suites/test_block_freeing.py",
                    "-k", "finish-back-to-idle or dummy_padding", "--no-engine-reuse",
                    "--stack", STACK, "--model", "tiny-llama", "--target", "spyre-eager-cb",
                    "--inject-fault", "legacy-double-free:req=r2",
                    "--inject-fault", "misname-dummy")
    assert run.returncode == 1, run.output[-3000:]
    assert len(run.failed()) == 2, run.outcomes
    freed = run.named("requests-finish-back-to-idle")
    message = run.messages[freed]
    assert run.check(freed) == "kv_ledger.no_double_free", message[:2000]
    assert run.category(freed) == "block leak"
    assert re.search(r"kv invariant no_double_free broken at step \d+: block \d+ appears 2"
                     r" times in the free list", message), message[:2000]
    assert "invariants broken: no_double_free\n" in message, message[:3000]
    blind = run.named("dummy_padding")
    message = run.messages[blind]
    assert run.check(blind) == "dummy_padding", message[:2000]
    assert run.category(blind) == "block leak"
    assert "declares that spyre-eager-cb pads a lone decoding request" in message, message[:2000]
