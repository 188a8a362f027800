"""The sendnn-inference 2.x faults (harness/targets/spyre/faults_2x.py) on fake schedulers and
runners with the methods they patch: what each changes, that it fires once, and that it stays
dormant until the engine has started; the pure parts on plain values; and the Spyre fault
modules' choice of plugin generation."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from harness.in_engine import fault_registry
from harness.in_engine.faults import FAULTS
from harness.targets.spyre import faults as faults_1x
from harness.targets.spyre import faults_2x
from harness.targets.spyre.generations import SENDNN_INFERENCE, VLLM_SPYRE

NEW_FAULTS = ("keep-promise", "promise-total-drift", "pause-at-full-batch",
              "runner-keeps-finished", "runner-wrong-block")


@pytest.fixture
def armed(monkeypatch):
    monkeypatch.setitem(fault_registry._armed, "on", True)


def test_each_fault_is_registered_once_under_its_name():
    for name in NEW_FAULTS:
        assert FAULTS[name].__module__ == faults_2x.__name__


# -- pure parts


def test_dropped_promises_are_those_of_a_block_or_more():
    before = {"b": 2, "a": 1, "zero": 0, "kept": 3}
    assert faults_2x.dropped_promises(before, {"kept": 3}) == [("a", 1), ("b", 2)]
    assert faults_2x.dropped_promises(before, before) == []


def test_blocks_handed_out_per_running_request():
    got = faults_2x.blocks_handed_out(["a", "b", "c"], [None, ([7, 8],), ([],)])
    assert got == [("b", 2)]
    with pytest.raises(ValueError):
        faults_2x.blocks_handed_out(["a"], [])


def test_wrong_block_is_the_highest_block_neither_pad_nor_given():
    assert faults_2x.wrong_block([1], 20) == 19
    assert faults_2x.wrong_block([19, 18], 20) == 17
    with pytest.raises(ValueError, match="no block"):
        faults_2x.wrong_block([1, 2], 3)


def test_first_finished_is_one_the_runner_still_has():
    table = {"b": 1, "a": 2}
    assert faults_2x.first_finished({"b", "a", "gone"}, table) == "a"
    assert faults_2x.first_finished({"gone"}, table) is None
    assert faults_2x.first_finished(None, table) is None


# -- the scheduler faults on a fake scheduler


class FakeScheduler:
    """The promise bookkeeping of ChunkedPrefillSpyreScheduler that the faults touch."""

    max_num_running_reqs = 2

    def __init__(self, promised: dict[str, int]) -> None:
        self.reserved_blocks = dict(promised)
        self.total_reserved_blocks = sum(promised.values())
        self.handed: list[Any] = []

    def update_from_output(self, finished: list[str], _runner_output: Any) -> str:
        for r in finished:
            self.total_reserved_blocks -= self.reserved_blocks.pop(r, 0)
        return "out"

    def schedule(self) -> Any:
        ids, blocks = zip(*self.handed, strict=True) if self.handed else ((), ())
        for r, groups in self.handed:
            n = len(groups[0]) if groups else 0
            self.reserved_blocks[r] -= n
            self.total_reserved_blocks -= n
        return SimpleNamespace(scheduled_cached_reqs=SimpleNamespace(req_ids=list(ids),
                                                                     new_block_ids=list(blocks)))

    def _can_decode_all_requests(self, decoding_requests: list[Any]) -> bool:
        return True


@pytest.fixture
def scheduler_cls(monkeypatch):
    cls = type("Scheduler", (FakeScheduler,), {})
    monkeypatch.setattr(faults_2x, "scheduler_class", lambda name: cls)
    return cls


def test_keep_promise_keeps_the_first_promise_left_at_a_finish(scheduler_cls, armed, capsys):
    faults_2x.keep_promise({})
    s = scheduler_cls({"r0": 0, "r1": 1, "r2": 1})
    assert s.update_from_output(["r0"], None) == "out"  # a promise of 0: nothing to keep
    assert "r0" not in s.reserved_blocks
    s.update_from_output(["r1"], None)
    assert s.reserved_blocks == {"r1": 1, "r2": 1} and s.total_reserved_blocks == 2
    assert "keep_promise fired: r1 finished, its promise of 1 block(s) kept" in capsys.readouterr().out
    s.update_from_output(["r2"], None)  # fired once: the next finish drops its promise
    assert s.reserved_blocks == {"r1": 1} and s.total_reserved_blocks == 1


def test_keep_promise_is_dormant_until_armed(scheduler_cls):
    faults_2x.keep_promise({})
    s = scheduler_cls({"r1": 1})
    s.update_from_output(["r1"], None)
    assert s.reserved_blocks == {} and s.total_reserved_blocks == 0


def test_promise_total_drift_keeps_the_first_handed_blocks_in_the_total(scheduler_cls, armed):
    faults_2x.promise_total_drift({})
    s = scheduler_cls({"r0": 1, "r1": 2})
    s.handed = [("r0", None), ("r1", ([5],))]
    s.schedule()
    assert s.reserved_blocks == {"r0": 1, "r1": 1}
    assert s.total_reserved_blocks == 3, "the total still counts the block handed to r1"
    s.handed = [("r1", ([6],))]
    s.schedule()  # fired once
    assert s.reserved_blocks == {"r0": 1, "r1": 0} and s.total_reserved_blocks == 2


def test_pause_at_full_batch_refuses_one_full_batch(scheduler_cls, armed):
    faults_2x.pause_at_full_batch({}, after="1")
    s = scheduler_cls({})
    one, two = [SimpleNamespace(request_id="a")], [SimpleNamespace(request_id=r) for r in "ab"]
    assert s._can_decode_all_requests(one)  # not full: no chance counted
    assert s._can_decode_all_requests(two)  # full, chance 0: after=1 lets it pass
    assert not s._can_decode_all_requests(two)  # chance 1: paused
    assert s._can_decode_all_requests(two)  # fired once


# -- the runner faults on a fake runner


class FakeRunner:
    """The request table of ChunkedPrefillModelRunner that the faults touch."""

    vllm_config = None

    def __init__(self) -> None:
        self.requests: dict[str, Any] = {}

    def update_states(self, scheduler_output: Any) -> None:
        for r in scheduler_output.finished_req_ids:
            self.requests.pop(r, None)

    def add_new_request(self, request: Any) -> None:
        self.requests[request.req_id] = SimpleNamespace(block_ids=list(request.block_ids[0]))


@pytest.fixture
def runner_module(monkeypatch):
    module = SimpleNamespace(ChunkedPrefillModelRunner=type("Runner", (FakeRunner,), {}),
                             SpyrePlatform=SimpleNamespace(get_total_spyre_blocks=lambda c: 8))
    monkeypatch.setattr(faults_2x, "plugin_module", lambda name, fault_name: module)
    return module


def finished(*ids: str) -> Any:
    return SimpleNamespace(finished_req_ids=set(ids))


def test_runner_keeps_the_first_finished_requests_blocks(runner_module, armed):
    faults_2x.runner_keeps_finished({})
    runner = runner_module.ChunkedPrefillModelRunner()
    for r, ids in (("r0", [1]), ("r1", [2, 3]), ("r2", [4])):
        runner.add_new_request(SimpleNamespace(req_id=r, block_ids=(ids,)))
    runner.update_states(finished())
    runner.update_states(finished("r1", "r0"))
    assert runner.requests["r0"].block_ids == [1], "the first finished (by id) is kept"
    assert "r1" not in runner.requests
    runner.update_states(finished("r2"))  # fired once
    assert set(runner.requests) == {"r0"}


def test_runner_wrong_block_replaces_the_first_requests_last_block(runner_module, armed):
    faults_2x.runner_wrong_block({})
    runner = runner_module.ChunkedPrefillModelRunner()
    runner.add_new_request(SimpleNamespace(req_id="r0", block_ids=([1, 7],)))
    assert runner.requests["r0"].block_ids == [1, 6]  # block 7 taken: 6, the highest free
    runner.add_new_request(SimpleNamespace(req_id="r1", block_ids=([2],)))
    assert runner.requests["r1"].block_ids == [2]  # fired once


# -- which plugin generation the Spyre fault modules patch


def test_a_2x_fault_refuses_a_stack_without_sendnn_inference(monkeypatch):
    monkeypatch.setattr(faults_2x.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="fault keep-promise patches sendnn-inference 2.x"):
        faults_2x.keep_promise({})


def test_the_installed_generation_is_the_newest_importable(monkeypatch):
    have = {VLLM_SPYRE.module}
    monkeypatch.setattr(faults_1x.importlib.util, "find_spec",
                        lambda name: object() if name in have else None)
    assert faults_1x.installed_generation() is VLLM_SPYRE
    have.add(SENDNN_INFERENCE.module)
    assert faults_1x.installed_generation() is SENDNN_INFERENCE


def test_a_1x_runner_fault_names_the_2x_faults_on_sendnn_inference(monkeypatch):
    monkeypatch.setattr(faults_1x, "runner_module", lambda: SimpleNamespace())
    monkeypatch.setattr(faults_1x, "installed_generation", lambda: SENDNN_INFERENCE)
    with pytest.raises(ValueError, match=r"which sendnn-inference 2.x .*/spyre/faults_2x.py"):
        faults_1x.reserve_short({})


def test_the_ledger_pool_hook_leaves_2x_to_vllms_pool(monkeypatch):
    monkeypatch.setattr(faults_1x, "runner_module", lambda: SimpleNamespace())
    assert faults_1x.tag_runner_pool({}) is None


def test_a_forced_preemption_is_refused_on_2x(monkeypatch):
    monkeypatch.setattr(faults_1x, "installed_generation", lambda: SENDNN_INFERENCE)
    with pytest.raises(ValueError, match="sendnn-inference 2.x has no path for a preemption"):
        faults_1x.runner_preemption({})
