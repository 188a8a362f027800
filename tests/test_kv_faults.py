"""Faults injected into the real stacks make the KV suites fail with the right invariant."""

import pytest

from tests.suite_runner import run_suite

pytestmark = pytest.mark.e2e  # each test runs a suite in a child pytest with engines


def failing_messages(run):
    assert run.returncode == 1, run.output[-3000:]
    return [run.messages[name] for name in run.failed()]


@pytest.mark.parametrize("target", ["vllm-cpu", "spyre-eager-cb"])
def test_free_that_forgets_a_block_breaks_the_ledger(tmp_path, target):
    run = run_suite(tmp_path, "suites/test_block_freeing.py", "-k", "finish-back-to-idle",
                    "--model", "tiny-llama", "--target", target, "--inject-fault", "forget-free")
    messages = failing_messages(run)
    assert len(messages) == 1
    assert "kv invariant conservation broken at step" in messages[0]
    assert ">>" in messages[0]  # the per-step table marks the first broken step
    assert "idle_all_free" in messages[0]


def test_leaked_warmup_reservation_is_caught_after_warmup(tmp_path):
    run = run_suite(tmp_path, "suites/test_block_freeing.py", "-k", "after_warmup",
                    "--model", "tiny-llama", "--target", "spyre-eager-cb",
                    "--inject-fault", "leak-warmup-block")
    messages = failing_messages(run)
    assert len(messages) == 1
    assert "after warmup: [" in messages[0] and "warmup-0" in messages[0]


def test_kv_cache_one_block_short_at_full_batch_fails_the_precondition(tmp_path):
    run = run_suite(tmp_path, "suites/test_no_recompute.py", "-k", "neuron_geometry and 4",
                    "--model", "tiny-llama", "--target", "vllm-cpu",
                    "--inject-fault", "kv-blocks-short:by=1")
    messages = failing_messages(run)
    assert len(messages) == 1
    assert "full batch never reached: max_num_seqs=4 but the largest batch seen was 3" in messages[0]
