"""A greedy sampler that does not take the maximum fails the token-equality suite on its own
logprobs ("sampler not greedy"), whatever the reference says.

``runner-up-when-close`` (harness.in_engine.faults.logits) makes vLLM's greedy argmax return the
runner-up wherever a row's top two logits are within 0.5 nats, leaving the returned logprobs
true. On tiny-llama the long prompt's top two come that close at a few positions, so the
free run's chosen token there is the device's own second: greedy self-consistency
(harness.checks.self_consistency) fails before token equality is consulted. One child pytest
on vllm-cpu; the fault works the same on spyre-eager-cp (the selftest has that case).
"""

import re

import pytest

from harness.report.categories import classify
from tests.suite_runner import run_suite

pytestmark = pytest.mark.e2e  # runs a suite in a child pytest with engines

CHOSE = re.compile(
    r"\[check greedy_self_consistency\] greedy self-consistency: request 0-long-190 position"
    r" (\d+) chose token (\d+) \(logprob (-[\d.]+)\) but the device's own top-1 is token (\d+)"
    r" \(logprob (-[\d.]+)\): the sampler did not take the maximum")


def test_runner_up_when_close_fails_greedy_self_consistency(tmp_path):
    run = run_suite(
        tmp_path, "suites/test_token_equality.py", "-k", "long-prompt",
        "--model", "tiny-llama", "--target", "vllm-cpu",
        "--inject-fault", "runner-up-when-close",
    )
    assert run.returncode == 1, run.output[-3000:]
    failed = run.failed()
    assert len(failed) == 1, run.outcomes
    message = run.messages[failed[0]]
    assert run.check(failed[0]) == "greedy_self_consistency", message[:2000]
    assert run.category(failed[0]) == "sampler not greedy", message[:2000]
    first = message.strip().splitlines()[0]
    assert classify("failed", first) == "sampler not greedy"  # as Allure files it
    found = CHOSE.search(message)
    assert found, message[:2000]
    chose_lp, top_lp = float(found.group(3)), float(found.group(5))
    assert found.group(2) != found.group(4) and chose_lp < top_lp
    assert "token equality against the reference:" in message
    logs = "".join(p.read_text() for p in (tmp_path / "reports").rglob("*.log"))
    assert "[hil] fault runner_up_when_close fired" in logs
