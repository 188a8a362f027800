"""The condition faults (harness/in_engine/faults/conditions.py): their pure parts on plain
values (the row of a request, recycled blocks, continued prefills, the engine-start counter)
and ``stack=``, which every fault takes: installed only in that stack's engines."""

from __future__ import annotations

import threading

import pytest
import torch

from harness.in_engine.faults import FAULTS, apply_faults, conditions, engine_stack

CONDITION_FAULTS = ("mix-batch-rows", "stale-recycled-block", "chunk-continuation",
                    "prefix-hit", "flaky-logit")


def test_each_condition_fault_is_registered_under_its_name():
    for name in CONDITION_FAULTS:
        assert FAULTS[name].__module__ == conditions.__name__


# -- stack=NAME


@pytest.fixture
def recorded(monkeypatch):
    calls: list[dict[str, str]] = []
    monkeypatch.setitem(FAULTS, "probe-fault", lambda config, **kw: calls.append(kw))
    monkeypatch.delenv("HIL_FAULTS", raising=False)
    return calls


def test_stack_argument_installs_the_fault_only_on_that_stack(recorded, capsys):
    apply_faults(["probe-fault:stack=default,x=1"], {"target": "vllm-cpu"})
    apply_faults(["probe-fault:stack=default,x=2"], {"target": "vllm-cpu", "stack": "default"})
    apply_faults(["probe-fault:stack=default,x=3"], {"target": "spyre", "stack": "spyre-1.10"})
    apply_faults(["probe-fault:stack=spyre-1.10,x=4"],
                 {"target": "spyre", "backend": "eager", "mode": "cb", "stack": "spyre-1.10"})
    # stack= is the harness's, never passed to the fault; the third was not installed.
    assert recorded == [{"x": "1"}, {"x": "2"}, {"x": "4"}]
    assert "fault not installed (for stack default): probe-fault:stack=default,x=3" in (
        capsys.readouterr().out)


def test_stack_and_variant_must_both_match(recorded):
    config = {"target": "spyre", "backend": "eager", "mode": "cp", "stack": "default"}
    apply_faults(["probe-fault:stack=default,variant=vllm-cpu"], config)
    apply_faults(["probe-fault:stack=canary,variant=spyre-eager-cp"], config)
    apply_faults(["probe-fault:stack=default,variant=spyre-eager-cp"], config)
    assert recorded == [{}]


def test_engine_stack_defaults_to_the_default_stack():
    assert engine_stack({}) == "default"
    assert engine_stack({"stack": None}) == "default"
    assert engine_stack({"stack": "canary"}) == "canary"


# -- the corruption of one request's row


def test_worst_token_becomes_the_argmax_of_that_row_only():
    logits = torch.tensor([[1.0, 5.0, -3.0], [0.0, 2.0, 1.0]])
    assert conditions.worst_token_wins(logits, 1) == 0
    assert int(logits[1].argmax()) == 0 and logits[1, 0] > logits[1, 1] + 19
    assert logits[0].tolist() == [1.0, 5.0, -3.0]


def test_rows_of_due_requests_follow_the_runner_batch_order():
    assert conditions.rows_to_corrupt(["b"], ["a", "b", "c"]) == [("b", 1)]
    assert conditions.rows_to_corrupt(["c", "x"], ["a", "b", "c"]) == [("c", 2)]  # x not sampled
    assert conditions.rows_to_corrupt(["b", "c"], None) == [("b", 0)]  # order unknown: row 0
    assert conditions.rows_to_corrupt([], None) == []


def test_due_rows_are_corrupted_once_and_named(capsys, monkeypatch):
    monkeypatch.setitem(conditions._STEP, "due", {"r1": ("prefix_hit", "64 prompt tokens")})
    monkeypatch.setitem(conditions._STEP, "rows", ["r0", "r1"])
    logits = torch.zeros(2, 4)
    logits[:, 2] = 1.0
    out = conditions._corrupt_due_rows(logits)
    assert int(out[0].argmax()) == 2 and int(out[1].argmax()) != 2
    assert logits[1, 2] == 1.0  # the caller's tensor is left alone
    assert "[hil] fault prefix_hit fired: request r1 (row 1)" in capsys.readouterr().out
    assert conditions._STEP["due"] == {} and conditions._STEP["rows"] is None


# -- the block history of stale-recycled-block


def test_recycled_blocks_are_the_ones_that_held_kv_before():
    used: set[int] = set()
    assert conditions.recycled(used, [1, 2, 3]) == []  # a fresh pool: never used
    assert conditions.recycled(used, [4]) == []
    assert conditions.recycled(used, [3, 5]) == [3]  # 3 came back to the head of the queue
    assert used == {1, 2, 3, 4, 5}


# -- the continued prefills of chunk-continuation


def test_a_continued_prefill_has_some_but_not_all_of_its_prompt_computed():
    got = conditions.continued_prefills(
        ["chunk2", "decode", "resumed", "last-chunk"],
        [128, 200, 64, 128],
        [190, 190, 190, 129],
        resumed={"resumed"},
    )
    assert got == [("chunk2", 128, 190), ("last-chunk", 128, 129)]


# -- the engine-start counter of flaky-logit


def test_engine_starts_are_numbered_without_gaps_or_repeats(tmp_path):
    got: list[int] = []
    lock = threading.Lock()

    def start() -> None:
        n = conditions.claim_start_number(tmp_path, "flaky-logit")
        with lock:
            got.append(n)

    threads = [threading.Thread(target=start) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 13))
    assert conditions.claim_start_number(tmp_path, "other") == 1  # counted per fault name


def test_first_start_and_every_nth_after_it_are_faulty():
    assert [n for n in range(1, 8) if conditions.faulty_start(n, 2)] == [1, 3, 5, 7]
    assert [n for n in range(1, 8) if conditions.faulty_start(n, 3)] == [1, 4, 7]
    # Three fresh repeats after a failing first run fail one or two of three.
    for every in (2, 3):
        assert 1 <= sum(conditions.faulty_start(n, every) for n in (2, 3, 4)) <= 2


def test_flaky_logit_leaves_a_clean_start_unpatched(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(conditions.FAULT_STATE_ENV, str(tmp_path))
    patched: list[object] = []
    monkeypatch.setattr(conditions, "_patch_logits", patched.append)
    FAULTS["flaky-logit"]({"target": "vllm-cpu"})  # start 1: faulty
    FAULTS["flaky-logit"]({"target": "vllm-cpu"})  # start 2: clean
    FAULTS["flaky-logit"]({"target": "vllm-cpu"})  # start 3: faulty
    assert len(patched) == 2
    assert "engine start 2 is clean" in capsys.readouterr().out
