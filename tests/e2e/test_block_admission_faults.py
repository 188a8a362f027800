"""Admission by KV blocks on sendnn-inference 2.x, the default stack's plugin: faults injected
into its running scheduler make a suite fail with the check, report category and message of
the invariant they break (harness/checks/promises.py, harness/checks/admission.py).

``promise_exact`` by a request promised one block fewer than its prompt and max_tokens need
(``promise-one-short``) and by one promised one block more (``promise-one-extra``);
``hold_back`` by a newcomer held back for a step although it fits (``hold-back-once``);
``overcommit`` by a scheduler that counts two blocks more free than its pool has
(``free-blocks-overcounted``), in the pool smaller than a full batch of
suites/test_block_admission.py, where it admits a third request the pool cannot hold beside
its promises. Each fault is installed in one target variant's engines, one engine per test;
the faults are in harness/targets/spyre/faults_2x.py.
"""

from harness.core.trace import SOURCE_VLLM_SCHEDULER
from tests.e2e.test_spyre2_faults import CP, PC, assert_failed_as, run_faults

FREEING = "suites/test_block_freeing.py"
ADMISSION = "suites/test_block_admission.py"
NP = "spyre-eager-np"
LEAK, SCHEDULING = "block leak", "scheduling"


def assert_broke_first(run, fragment: str, invariant: str, *phrases: str) -> str:
    """``kv_ledger.<invariant>`` broke first, in vLLM's scheduler pool (2.x's ledger), and the
    failure lists the requests' admission lines."""
    category = LEAK if invariant.startswith("promise") else SCHEDULING
    return assert_failed_as(run, fragment, f"kv_ledger.{invariant}", category,
                            f"kv invariant {invariant} broken at step",
                            f"[{invariant}] {SOURCE_VLLM_SCHEDULER}:", ">>",
                            "requests (admission):", *phrases)


def test_promises_one_short_and_one_extra_and_a_newcomer_held_back(tmp_path):
    """A request of 64 + 40 tokens decodes; a second of 30 + 20 arrives at step 5 and fits.
    spyre-eager-np: the first is promised one block fewer than its two blocks need ->
    promise_exact at step 0. spyre-eager-pc: one block more -> promise_exact at step 0.
    spyre-eager-cp: the second is held back at step 5 beside one running request, blocks to
    spare -> hold_back at step 5."""
    run = run_faults(tmp_path, FREEING, "second-request-joins",
                     {NP: "promise-one-short", PC: "promise-one-extra", CP: "hold-back-once"})
    assert_broke_first(run, NP, "promise_exact", "broken at step 0: request r0 owns 1 and is"
                       " promised 0 block(s), 1 in all, but its prompt of 64 tokens and"
                       " max_tokens 40 need ceil(104/64) = 2: 1 block(s) too few promised")
    assert_broke_first(run, PC, "promise_exact", "broken at step 0: request r0 owns 1 and is"
                       " promised 2 block(s), 3 in all", "1 block(s) too many promised")
    message = assert_broke_first(run, CP, "hold_back", "broken at step 5: request r1 was held"
                                 " back although the scheduler had room for it: 1 of 4 running",
                                 "r1: arrived at step 5, waited at steps 5, admitted at step 6")
    assert "invariants broken: hold_back\n" in message, message[:3000]


def test_admission_beyond_the_free_blocks_in_a_pool_smaller_than_a_full_batch(tmp_path):
    """spyre-eager-cp, four requests of 65 + 64 tokens, a pool of 7 usable blocks: the third
    waits for blocks until the scheduler counts two more free than there are; it is admitted
    at step 4 into room for one block -> overcommit (then promises beyond the free blocks).
    Each request's last promised block is one its output never reaches, so the pool does not
    really run out and the run completes."""
    run = run_faults(tmp_path, ADMISSION, "holds_newcomers_back",
                     {CP: "free-blocks-overcounted"})
    message = assert_broke_first(run, CP, "overcommit", "broken at step 4: request r2 was"
                                 " admitted: it needs ceil(129/64) = 3 blocks, but the pool had"
                                 " room for 1 block (3 free - 2 promised)")
    assert "invariants broken: overcommit, promises\n" in message, message[:3000]
