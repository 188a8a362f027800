"""The legacy stack (vllm-spyre 0.4.0): its dummy-block padding is seen step by step, and a
dummy that keeps its blocks when a second request joins fails the suite at that step."""

import re

import pytest

from harness.stacks import stack_python
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
