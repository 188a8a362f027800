"""Faults injected into the real stacks make the KV suites fail with the right invariant,
filed under the report category the invariant belongs to.

Each ledger invariant (harness/checks/ledger.py) has a fault that makes exactly it fire
first on a running engine. To keep the cost down, one child pytest proves two faults at
once: each is installed only in one target variant's engines (``variant=ID``), and
``--no-engine-reuse`` gives each test an engine of its own. The two-fault runs are made
twice: with the ledgers read in full every step, and read as per-step deltas (what pools
over 4096 blocks send, harness/in_engine/probe_delta.py), which must fail the same way.

On the default stack (sendnn-inference 2.x) the Spyre decoders' blocks live in vLLM's
scheduler pool, so vLLM's pool faults land on spyre-eager-cp as on vllm-cpu. The faults of
vllm-spyre 1.x's own CB runner pool and reservations (harness/targets/spyre/faults.py) run
on the spyre-1.10 stack, where that runner lives; its vllm-cpu engines run there too.
"""

import pytest

from tests.suite_runner import SPYRE_1X, needs_spyre_1x, run_suite

pytestmark = pytest.mark.e2e  # each test runs a suite in a child pytest with engines

BACK_TO_IDLE = "requests-finish-back-to-idle"
LEAK = "block leak"


def failing_messages(run):
    assert run.returncode == 1, run.output[-3000:]
    return [run.messages[name] for name in run.failed()]


# How the engines read their KV ledgers: in full every step (pools this small), or as
# per-step deltas from the first step on (what pools over 4096 blocks do), checkpoints off.
PROBES = {"full": None,
          "delta": {"HIL_FULL_PROBE_MAX_BLOCKS": "0", "HIL_PROBE_CHECKPOINT_EVERY": "100000"}}
DELTA_READS = "KV ledgers read as"


def two_faults(tmp_path, cpu_fault: str, spyre_fault: str, select: str = "finish-back-to-idle",
               probes: str = "full", spyre: str = "spyre-eager-cb", stack: tuple[str, ...] = ()):
    """The back-to-idle scenario on vllm-cpu with ``cpu_fault`` and on ``spyre`` with
    ``spyre_fault``, in one child pytest on ``stack`` (the default when empty), the ledgers
    read as ``probes`` says."""
    return run_suite(tmp_path, "suites/test_block_freeing.py", "-k", select, *stack,
                     "--model", "tiny-llama", "--target", f"vllm-cpu,{spyre}",
                     "--no-engine-reuse",
                     "--inject-fault", for_variant(cpu_fault, "vllm-cpu"),
                     "--inject-fault", for_variant(spyre_fault, spyre),
                     env=PROBES[probes])


def runner_faults(tmp_path, cpu_fault: str, runner_fault: str, probes: str):
    """``two_faults`` with a fault of vllm-spyre 1.x's CB runner, on its stack."""
    return two_faults(tmp_path, cpu_fault, runner_fault, probes=probes, stack=SPYRE_1X)


def assert_read_as(run, probes: str) -> None:
    """Each failure says whether the ledgers were read as deltas, as ``probes`` asked."""
    for name in run.failed():
        assert (DELTA_READS in run.messages[name]) == (probes == "delta"), run.messages[name][-2000:]


def for_variant(fault: str, variant: str) -> str:
    return f"{fault}{',' if ':' in fault else ':'}variant={variant}"


def assert_first_broken(run, fragment: str, invariant: str, source: str, *phrases: str) -> str:
    """Test ``fragment`` failed with ``kv_ledger.<invariant>`` first, in ``source``'s
    ledger, filed as a block leak; returns its message."""
    name = run.named(fragment)
    message = run.messages.get(name, "")
    assert run.outcomes[name] == "failed", (name, run.outcomes, run.output[-3000:])
    assert run.check(name) == f"kv_ledger.{invariant}", message[:2000]
    assert run.category(name) == LEAK, message[:2000]
    assert f"kv invariant {invariant} broken at step" in message, message[:2000]
    assert f"[{invariant}] {source}:" in message, message[:3000]  # the first listed violation
    assert ">>" in message  # the per-step table marks the first broken step
    for phrase in phrases:
        assert phrase in message, message[:3000]
    return message


def test_free_that_forgets_a_block_breaks_the_ledger(tmp_path):
    """forget-free on both targets in one child pytest: conservation first, then at idle."""
    run = run_suite(tmp_path, "suites/test_block_freeing.py", "-k", "finish-back-to-idle",
                    "--model", "tiny-llama", "--target", "vllm-cpu,spyre-eager-cp",
                    "--inject-fault", "forget-free")
    messages = failing_messages(run)
    assert len(messages) == 2
    # sendnn-inference 2.x keeps a request's blocks in vLLM's scheduler pool: the ledger.
    for target in ("vllm-cpu", "spyre-eager-cp"):
        assert_first_broken(run, f"{target}-{BACK_TO_IDLE}", "conservation", "vllm-scheduler",
                            "idle_all_free")


@needs_spyre_1x
@pytest.mark.parametrize("probes", list(PROBES))
def test_pad_block_freed_and_runner_pool_forgetting_a_block(tmp_path, probes):
    """vllm-cpu: pad block put in the free list -> pad_never_owned. spyre-eager-cb: the
    runner's own pool drops a block at a free -> conservation in the runner's ledger."""
    run = runner_faults(tmp_path, "free-pad-block", "forget-free-in-runner", probes)
    assert len(run.failed()) == 2, run.outcomes
    assert_read_as(run, probes)
    assert_first_broken(run, f"vllm-cpu-{BACK_TO_IDLE}", "pad_never_owned", "vllm-scheduler",
                        "pad block 0 is in the free list")
    assert_first_broken(run, f"spyre-eager-cb-{BACK_TO_IDLE}", "conservation", "spyre-runner",
                        "are neither free, owned nor pad")


@needs_spyre_1x
@pytest.mark.parametrize("probes", list(PROBES))
def test_block_freed_twice_and_reservation_kept_after_finish(tmp_path, probes):
    """vllm-cpu: a block appended to the free list twice -> free_counter. spyre-eager-cb:
    a finished request's reservation kept -> reported_free (before idle_all_free)."""
    run = runner_faults(tmp_path, "refree-block", "leak-reservation", probes)
    assert len(run.failed()) == 2, run.outcomes
    assert_read_as(run, probes)
    assert_first_broken(run, f"vllm-cpu-{BACK_TO_IDLE}", "free_counter", "vllm-scheduler",
                        "the pool counts")
    message = assert_first_broken(run, f"spyre-eager-cb-{BACK_TO_IDLE}", "reported_free",
                                  "spyre-runner", "reservations of requests not served")
    assert "idle_all_free" in message  # and at idle the reservation is still there


@needs_spyre_1x
@pytest.mark.parametrize("probes", list(PROBES))
def test_extra_reference_and_reservation_short_of_the_owned_blocks(tmp_path, probes):
    """vllm-cpu: a block handed out with one reference too many -> ref_counts.
    spyre-eager-cb: a reservation one block short of what the request owns ->
    within_reservation."""
    run = runner_faults(tmp_path, "extra-ref", "reserve-short", probes)
    assert len(run.failed()) == 2, run.outcomes
    assert_read_as(run, probes)
    assert_first_broken(run, f"vllm-cpu-{BACK_TO_IDLE}", "ref_counts", "vllm-scheduler",
                        "has ref count 2 but is held by")
    assert_first_broken(run, f"spyre-eager-cb-{BACK_TO_IDLE}", "within_reservation",
                        "spyre-runner", "but reserved")


# vLLM's pool faults that the runner-fault runs above prove on vllm-cpu of the spyre-1.10 stack,
# on the default stack: each on both targets, whose ledger is vLLM's scheduler pool.
VLLM_POOL_FAULTS = {
    "free-pad-block": ("pad_never_owned", "pad block 0 is in the free list"),
    "refree-block": ("free_counter", "the pool counts"),
    "extra-ref": ("ref_counts", "has ref count 2 but is held by"),
}


# Each in full reads; the ref-count fault (the one a delta carries least directly) also as
# deltas: the delta reads of every fault are proven on the spyre-1.10 runs above.
@pytest.mark.parametrize(("fault", "probes"), [
    *((f, "full") for f in VLLM_POOL_FAULTS), ("extra-ref", "delta")])
def test_vllm_pool_fault_breaks_its_invariant_on_vllm_cpu_and_spyre_eager_cp(tmp_path, fault,
                                                                           probes):
    invariant, phrase = VLLM_POOL_FAULTS[fault]
    run = run_suite(tmp_path, "suites/test_block_freeing.py", "-k", "finish-back-to-idle",
                    "--model", "tiny-llama", "--target", "vllm-cpu,spyre-eager-cp",
                    "--no-engine-reuse", "--inject-fault", fault, env=PROBES[probes])
    assert len(failing_messages(run)) == 2, run.outcomes
    assert_read_as(run, probes)
    for target in ("vllm-cpu", "spyre-eager-cp"):
        assert_first_broken(run, f"{target}-{BACK_TO_IDLE}", invariant, "vllm-scheduler", phrase)


def test_blocks_freed_one_step_late_break_block_timing(tmp_path):
    """free-late on both targets in one child pytest: every block is still owned (conservation
    holds) and all are free at idle, so only block timing fires, at a finishing step."""
    run = run_suite(tmp_path, "suites/test_block_freeing.py", "-k", "finish-back-to-idle",
                    "--model", "tiny-llama", "--target", "vllm-cpu,spyre-eager-cp",
                    "--inject-fault", "free-late")
    assert len(failing_messages(run)) == 2, run.outcomes
    for target in ("vllm-cpu", "spyre-eager-cp"):
        message = assert_first_broken(run, f"{target}-{BACK_TO_IDLE}", "freed_on_finish",
                                      "vllm-scheduler", "block timing: request r",
                                      "after that step (freed late: given back at step")
        assert "invariants broken: freed_on_finish\n" in message, message[:3000]


def test_blocks_kept_after_finish_and_a_crash_mid_run(tmp_path):
    """vllm-cpu: a finished request's blocks never freed -> only idle_all_free, at idle.
    spyre-eager-cp: the engine process dies at its first step (crash-engine:when=step) ->
    each of its tests fails as an engine crash, and every collected test has a result."""
    run = two_faults(tmp_path, "keep-finished-blocks", "crash-engine:when=step",
                     select="finish-back-to-idle or single-request", spyre="spyre-eager-cp")
    assert len(run.outcomes) == 4 and len(run.failed()) == 4, run.outcomes
    for scenario in (BACK_TO_IDLE, "single-request-decodes-alone"):
        name = run.named(f"vllm-cpu-{scenario}")
        message = assert_first_broken(run, name, "idle_all_free", "vllm-scheduler",
                                      "at idle, request r", "still owns blocks")
        assert "invariants broken: idle_all_free\n" in message, message[:3000]
        crashed = run.named(f"spyre-eager-cp-{scenario}")
        assert run.check(crashed) is None
        assert run.category(crashed) == "engine crash / harness error", run.messages[crashed]
        assert "died with exit code 3" in run.messages[crashed], run.messages[crashed][:2000]


@needs_spyre_1x
def test_leaked_warmup_reservation_is_caught_after_warmup(tmp_path):
    """vllm-spyre 1.x: the CB runner keeps a warmup request's reservation."""
    run = run_suite(tmp_path, "suites/test_block_freeing.py", "-k", "after_warmup", *SPYRE_1X,
                    "--model", "tiny-llama", "--target", "spyre-eager-cb",
                    "--inject-fault", "leak-warmup-block")
    messages = failing_messages(run)
    assert len(messages) == 1
    name = run.failed()[0]
    assert run.check(name) == "kv_ledger.idle_all_free" and run.category(name) == LEAK
    assert "after warmup: [" in messages[0] and "warmup-0" in messages[0]


def test_kv_cache_one_block_short_at_full_batch_fails_the_precondition(tmp_path):
    run = run_suite(tmp_path, "suites/test_no_recompute.py", "-k", "one_block_per_sequence and 4",
                    "--model", "tiny-llama", "--target", "vllm-cpu",
                    "--inject-fault", "kv-blocks-short:by=1")
    messages = failing_messages(run)
    assert len(messages) == 1
    name = run.failed()[0]
    assert run.check(name) == "full_batch" and run.category(name) == "recompute"
    assert "full batch never reached: max_num_seqs=4 but the largest batch seen was 3" in messages[0]
