"""hil explore's known failures of the stacks are quarantine.toml's entries of explorer verdicts
(data, beside the suites' known failures; harness/explore/known.py keeps only the named
conditions): each failure the explorer knew when the list was code is still known, on the
stacks and targets it was known on and no others, and lifting its entry from the file makes it
a finding again."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.paths import REPO_ROOT
from harness.core.verdict import Verdict
from harness.explore import known as known_module
from harness.explore.example import Example, RequestShape, geometry_of
from harness.explore.known import known_failure, load_known
from harness.explore.runner import FAILED, Outcome
from harness.lab.known_conditions import CONDITIONS

SHIPPED = REPO_ROOT / "quarantine.toml"
KNOWN = load_known(SHIPPED)
FULL = geometry_of({"max_model_len": 256, "max_num_seqs": 2, "chunk_size": 128,
                    "pool": "full-batch"})


def test_an_aborted_requests_kept_promise_on_2x_is_known_and_nothing_else():
    aborting = Example.of(FULL, (RequestShape(30, 60, abort_after=6), RequestShape(40, 20)))
    leak = Verdict.failed("kv_ledger.promises", "kv invariant promises broken at step 6: 1"
                          " blocks are still promised to request r0, which the scheduler no"
                          " longer has (a leaked reservation)")
    assert known_failure(leak, aborting, "spyre-eager-cp", "default", KNOWN) is not None
    assert known_failure(leak, aborting, "spyre-eager-cp", "spyre-1.10", KNOWN) is None
    assert known_failure(leak, aborting, "vllm-cpu", "default", KNOWN) is None
    not_aborted = Example.of(FULL, (RequestShape(30, 60), RequestShape(40, 20)))
    assert known_failure(leak, not_aborted, "spyre-eager-cp", "default", KNOWN) is None
    other = Verdict.failed("kv_ledger.conservation", "request r0 lists block 3 twice")
    assert known_failure(other, aborting, "spyre-eager-cp", "default", KNOWN) is None


def test_a_queue_starved_by_the_kept_promise_is_known_only_after_an_abort():
    stuck = Verdict.failed("engine_error", "EngineRequestError: engine spyre-eager-cp raised"
                           " RuntimeError: scenario did not finish within 2000 engine steps;"
                           " still running [], waiting ['r0-816bea9e']")
    aborting = Example.of(FULL, (RequestShape(53, 44, arrival=13),
                                 RequestShape(9, 64, abort_after=19)))
    assert known_failure(stuck, aborting, "spyre-eager-pc", "default", KNOWN) is not None
    plain = Example.of(FULL, (RequestShape(53, 44),))
    assert known_failure(stuck, plain, "spyre-eager-pc", "default", KNOWN) is None
    crash = Verdict.failed("engine_error", "EngineCrashed: died with exit code 3")
    assert known_failure(crash, aborting, "spyre-eager-pc", "default", KNOWN) is None


def test_an_override_the_device_rounds_down_for_its_batch_is_known_on_2x_only():
    four = Example.of(FULL, (RequestShape(30, 20),))
    batch = four.geometry.max_num_seqs
    assert batch > 1
    pool = 5 * batch + 1

    def short(device: int) -> Verdict:
        return Verdict.failed("kv_ledger.device_blocks", "kv invariant device_blocks broken at"
                              f" step -1: the pool has {pool} blocks but the device's KV cache"
                              f" holds {device} (ids 0..{device - 1}): the scheduler can hand"
                              " out blocks ...")

    assert known_failure(short(pool - 1), four, "spyre-eager-cp", "default", KNOWN) is not None
    assert known_failure(short(pool - 1), four, "spyre-eager-cp", "spyre-1.10", KNOWN) is None
    assert known_failure(short(pool - 1), four, "vllm-cpu", "default", KNOWN) is None
    assert known_failure(short(pool - 2), four, "spyre-eager-cp", "default", KNOWN) is None  # not it
    even = Verdict.failed("kv_ledger.device_blocks", f"the pool has {5 * batch} blocks but the"
                          f" device's KV cache holds {4 * batch}")
    assert known_failure(even, four, "spyre-eager-cp", "default", KNOWN) is None


def test_a_block_past_the_rounded_down_cache_is_known_as_the_same_defect():
    four = Example.of(FULL, (RequestShape(30, 20),))
    batch = four.geometry.max_num_seqs

    def crash(index: int, size: int) -> Verdict:
        return Verdict.failed("engine_error", "EngineRequestError: engine spyre-eager-cp raised"
                              f" IndexError: index {index} is out of bounds for dimension 0"
                              f" with size {size}")

    size = 4 * batch
    assert known_failure(crash(size, size), four, "spyre-eager-cp", "default", KNOWN) is not None
    assert known_failure(crash(size, size), four, "vllm-cpu", "default", KNOWN) is None
    assert known_failure(crash(size + batch, size), four, "spyre-eager-cp", "default", KNOWN) is None
    assert known_failure(crash(size + 1, size + 1), four, "spyre-eager-cp", "default", KNOWN) is None


def test_a_known_failure_is_no_finding_and_a_regression_test_does_not_expect_it():
    aborting = Example.of(FULL, (RequestShape(30, 60, abort_after=6),))
    leak = Verdict.failed("kv_ledger.promises", "1 blocks are still promised to request r0")
    tokens = Verdict.failed("token_equality", "token mismatch")
    known = known_failure(leak, aborting, "spyre-eager-cp", "default", KNOWN)
    only_known = Outcome(FAILED, verdicts=[leak, Verdict.passed("x")], known=[known])
    assert only_known.failure is None and only_known.judged == [Verdict.passed("x")]
    both = Outcome(FAILED, verdicts=[leak, tokens], known=[known])
    assert both.failure == tokens and both.judged == [tokens]


def test_no_list_of_known_failures_is_left_in_code():
    assert not hasattr(known_module, "KNOWN")
    assert {c for k in KNOWN for c in k.when} <= set(CONDITIONS)
    assert len(KNOWN) == 4


def test_the_default_list_is_the_file_the_suites_read_and_lifting_an_entry_unknows_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    aborting = Example.of(FULL, (RequestShape(30, 60, abort_after=6),))
    leak = Verdict.failed("kv_ledger.promises", "1 blocks are still promised to request r0")
    monkeypatch.setattr(known_module, "default_file", lambda: SHIPPED)
    assert known_failure(leak, aborting, "spyre-eager-cp", "default") is not None
    text = SHIPPED.read_text(encoding="utf-8")
    lifted = tmp_path / "quarantine.toml"  # the kept promise fixed: its entry removed
    start = text.index("[[known]]\ntest = \"suites/test_block_freeing.py")
    lifted.write_text(text[:start] + text[text.index("[[known]]", start + 1):], encoding="utf-8")
    monkeypatch.setattr(known_module, "default_file", lambda: lifted)
    assert known_failure(leak, aborting, "spyre-eager-cp", "default") is None


def test_an_entry_combines_its_why_and_its_conditions(tmp_path: Path):
    path = tmp_path / "q.toml"
    path.write_text('[[known]]\ncheck = "engine_error"\nwhy = "did not finish"\n'
                    'when = ["aborts", "names_an_aborted_request"]\nreason = "r"\nissue = "I"\n',
                    encoding="utf-8")
    (entry,) = known = load_known(path)
    aborting = Example.of(FULL, (RequestShape(30, 60), RequestShape(9, 64, abort_after=3)))
    stuck = Verdict.failed("engine_error", "scenario did not finish: request r1 waits")
    assert known_failure(stuck, aborting, "vllm-cpu", "canary", known) is entry
    other = Verdict.failed("engine_error", "scenario did not finish: request r0 waits")
    assert known_failure(other, aborting, "vllm-cpu", "canary", known) is None  # r0 not aborted
    crashed = Verdict.failed("engine_error", "EngineCrashed: request r1")
    assert known_failure(crashed, aborting, "vllm-cpu", "canary", known) is None
    assert known_failure(Verdict.passed("engine_error"), aborting, "x", "y", known) is None


def test_hil_explore_refuses_a_bad_quarantine_file_before_any_engine_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    from harness import cli
    from harness.explore import session

    bad = tmp_path / "quarantine.toml"
    bad.write_text('[[known]]\ncheck = "engine_error"\nwhen = ["aborted"]\nreason = "r"\n'
                   'issue = "I"\n', encoding="utf-8")
    monkeypatch.setattr(known_module, "default_file", lambda: bad)
    monkeypatch.setattr(session, "open_session",
                        lambda *a, **k: pytest.fail("an engine session was opened"))
    reports = tmp_path / "reports"
    assert cli.main(["explore", "--reports-dir", str(reports), "--budget", "5",
                     "--target", "vllm-cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hil explore: {bad}: known #1 ('engine_error'): when names 'aborted',"
                          " which is no condition hil explore knows"), err
    assert len(err.strip().splitlines()) == 1 and not reports.exists()
