"""One bug, one failure: a test that leaves its engine dirty fails at its own step, and the
tests after it run on a fresh engine (harness.engine.hygiene), each judged on its own run."""

import json
import re

import pytest

from tests.suite_runner import run_suite

pytestmark = pytest.mark.e2e  # each test runs a suite in a child pytest with engines

STEP = re.compile(r"kv invariant (\w+) broken at step (-?\d+)")


def hygiene_stats(tmp_path):
    return json.loads((tmp_path / "reports" / "stats" / "main.json").read_text())["hygiene"]


def test_a_leak_once_fails_only_its_own_test_and_the_rest_pass_on_a_fresh_engine(tmp_path):
    run = run_suite(tmp_path, "suites/test_block_freeing.py", "-k", "blocks_return and not aborted",
                    "--model", "tiny-llama", "--target", "spyre-eager-cp",
                    "--inject-fault", "forget-free-once", "--max-live-engines", "1")
    assert run.returncode == 1, run.output[-3000:]
    names = list(run.outcomes)
    assert len(names) == 4 and run.failed() == names[:1], run.outcomes  # the first, only
    invariant, step = STEP.search(run.messages[names[0]]).groups()
    assert invariant == "conservation" and int(step) >= 0  # its own step, not the start
    stats = hygiene_stats(tmp_path)
    assert stats["restarts"] == 1, stats
    (event,) = stats["events"]
    assert names[0] in event["left_by"]
    assert event["replaced"] and names[1] in event["test"]
    assert "engine hygiene: 1 restart(s) of dirty engines" in run.output


def test_a_leak_on_every_free_fails_each_test_at_its_own_step(tmp_path):
    run = run_suite(tmp_path, "suites/test_block_freeing.py", "-k", "blocks_return and not aborted",
                    "--model", "tiny-llama", "--target", "vllm-cpu",
                    "--inject-fault", "forget-free-each", "--max-live-engines", "1")
    assert run.returncode == 1, run.output[-3000:]
    assert len(run.outcomes) == 4 and len(run.failed()) == 4, run.outcomes
    for name in run.failed():
        invariant, step = STEP.search(run.messages[name]).groups()
        assert int(step) >= 0, f"{name} failed at the inherited start: {run.messages[name][:300]}"
    stats = hygiene_stats(tmp_path)
    assert stats["restarts"] == 3, stats  # each later test on a fresh engine
