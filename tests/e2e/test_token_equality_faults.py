"""The token-equality suite fails, with a readable diff, when the device path is perturbed.

A fault (``perturb-logit``, harness.in_engine.faults.logits) is installed inside the real
vLLM and Spyre plugin engines (sendnn-inference 2.x on the default stack): once, at generated position 5 of one request, the least
likely token is made the argmax. The unmodified suite must then fail with
``token mismatch:`` at that position, and pass without the fault.
"""

import re

import pytest

from tests.suite_runner import run_suite

pytestmark = pytest.mark.e2e  # each test runs a suite in a child pytest with engines


@pytest.mark.parametrize("target", ["vllm-cpu", "spyre-eager-cp"])
def test_perturbed_logit_fails_token_equality(tmp_path, target):
    run = run_suite(
        tmp_path,
        "suites/test_token_equality.py",
        "-k", "single and not one-token",
        "--model", "tiny-llama",
        "--target", target,
        "--inject-fault", "perturb-logit:position=5",
    )
    assert run.returncode == 1, run.output[-3000:]
    failed = run.failed()
    assert len(failed) == 1, run.outcomes
    message = run.messages[failed[0]]
    assert run.check(failed[0]) == "token_equality", message[:2000]
    assert run.category(failed[0]) == "token mismatch", message[:2000]
    assert "token mismatch:" in message
    assert re.search(r"at position 5\b", message), message
    assert "not a near-tie" in message
    assert "preceding tokens" in message


def test_same_selection_passes_without_fault(tmp_path):
    run = run_suite(
        tmp_path,
        "suites/test_token_equality.py",
        "-k", "single and not one-token",
        "--model", "tiny-llama",
        "--target", "vllm-cpu,spyre-eager-cp",
    )
    assert run.returncode == 0, run.output[-3000:]
    assert sorted(run.outcomes.values()) == ["passed", "passed"]
