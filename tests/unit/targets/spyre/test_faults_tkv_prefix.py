"""The batch-TKV and prefix-cache faults of sendnn-inference 2.x
(harness/targets/spyre/faults_tkv_prefix.py) on fake schedulers and runners with the methods
they patch: what each changes, and that each stays dormant until the engine has started."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from harness.core.trace import KvSnapshot
from harness.in_engine import fault_registry
from harness.in_engine.faults import FAULTS
from harness.targets.spyre import faults_tkv_prefix as faults
from harness.targets.spyre.ledger import read_batch_tkv, runner_cached_tokens

NAMES = ("pause-one-step-late", "pause-with-room", "tkv-prediction-without-padding",
         "runner-tkv-one-block-high", "hold-back-at-admission", "prefix-hit-underreported",
         "prefix-cache-drops-a-block")


@pytest.fixture
def armed(monkeypatch):
    monkeypatch.setitem(fault_registry._armed, "on", True)


def test_each_fault_is_registered_once_under_its_name():
    for name in NAMES:
        assert FAULTS[name].__module__ == faults.__name__


def test_pure_parts():
    assert faults.fits(4, 128, 512) and not faults.fits(4, 129, 512)
    groups, tokens = faults.dropped_last_block(([1, 2, 3],), 192, 64)
    assert groups == ([1, 2],) and tokens == 128
    assert faults.dropped_last_block(([],), 0, 64) == (([],), 0)


# -- fakes


def req(rid: str, computed: int) -> Any:
    return SimpleNamespace(request_id=rid, num_computed_tokens=computed)


class FakeScheduler:
    """What the TKV faults read and patch on ChunkedPrefillSpyreScheduler: its limit, the last
    TKV, and a prediction with the runner's left padding."""

    block_size = 64

    def __init__(self, tkv: int = 0, limit: int = 512) -> None:
        self.tkv, self.max_batch_tkv_limit = tkv, limit

    def predict_next_decode_tkv(self, running: list[Any]) -> int:
        n = [r.num_computed_tokens + 1 for r in running]
        top = max(-(-x // 64) for x in n)
        return max((top - -(-x // 64)) * 64 + x for x in n)

    def _can_decode_all_requests(self, batch: list[Any]) -> bool:
        return len(batch) * self.predict_next_decode_tkv(batch) <= self.max_batch_tkv_limit


@pytest.fixture
def scheduler_cls(monkeypatch):
    cls = type("Scheduler", (FakeScheduler,), {})
    monkeypatch.setattr(faults, "scheduler_class", lambda name: cls)
    return cls


@pytest.fixture
def runner_module(monkeypatch):
    platform = SimpleNamespace(get_max_batch_tkv_limit=lambda: 512, get_block_size=lambda: 64)
    module = SimpleNamespace(SpyrePlatform=platform)
    monkeypatch.setattr(faults, "plugin_module", lambda name, fault_name: module)
    return module


# -- pausing


def test_pause_one_step_late_judges_by_the_last_tkv(scheduler_cls, runner_module, armed):
    faults.pause_one_step_late({})
    four = [req(f"r{i}", 128) for i in range(4)]  # next TKV 129 (3 blocks: 192 with padding)
    s = scheduler_cls(tkv=128)
    assert not FakeScheduler._can_decode_all_requests(s, four)
    assert s._can_decode_all_requests(four), "4 x 128 fits: the pause comes a step late"
    assert runner_module.SpyrePlatform.get_max_batch_tkv_limit() == sys.maxsize
    assert runner_module.SpyrePlatform.get_block_size() == 64  # the rest is the platform's


def test_the_runner_guard_is_lifted_once(runner_module):
    faults.lift_runner_guard("x")
    lifted = runner_module.SpyrePlatform
    faults.lift_runner_guard("x")
    assert runner_module.SpyrePlatform is lifted


def test_pause_with_room_judges_a_block_high(scheduler_cls, armed):
    faults.pause_with_room({})
    four = [req(f"r{i}", 70) for i in range(4)]
    s = scheduler_cls()
    assert FakeScheduler._can_decode_all_requests(s, four)  # 4 x 71 fits 512
    assert not s._can_decode_all_requests(four)  # 4 x 135 does not


def test_tkv_prediction_without_padding_forgets_the_pad_blocks(scheduler_cls, armed):
    faults.tkv_prediction_without_padding({})
    s = scheduler_cls()
    assert s.predict_next_decode_tkv([req("a", 70), req("b", 30)]) == 71  # runner: 64 + 31 = 95
    assert s.predict_next_decode_tkv([req("a", 70)]) == 71


def test_the_tkv_faults_are_dormant_until_armed(scheduler_cls, runner_module):
    faults.pause_with_room({})
    faults.tkv_prediction_without_padding({})
    s = scheduler_cls()
    assert s._can_decode_all_requests([req(f"r{i}", 70) for i in range(4)])
    assert s.predict_next_decode_tkv([req("a", 70), req("b", 30)]) == 95


def test_runner_tkv_one_block_high(monkeypatch, armed):
    class Runner:
        block_size = 64

        def _prepare_decode(self, data: Any) -> str:
            self.tkv = 95
            return "inputs"

    monkeypatch.setattr(faults, "runner_class", lambda name: Runner)
    faults.runner_tkv_one_block_high({})
    runner = Runner()
    assert runner._prepare_decode(None) == "inputs" and runner.tkv == 159


# -- admission


def test_hold_back_at_admission_applies_the_pausing_off_rule(monkeypatch, armed):
    envs = SimpleNamespace(SENDNN_INFERENCE_PAUSING_ENABLED=True, OTHER=3)
    module = SimpleNamespace(envs_spyre=envs)

    class Scheduler:
        def _satisfies_last_chunk_constraints(self, request: Any) -> bool:
            # pausing on: room is enough; off: the worst case says no
            return bool(module.envs_spyre.SENDNN_INFERENCE_PAUSING_ENABLED
                        and module.envs_spyre.OTHER == 3)

    module.ChunkedPrefillSpyreScheduler = Scheduler
    monkeypatch.setattr(faults, "plugin_module", lambda name, fault_name: module)
    faults.hold_back_at_admission({})
    assert not Scheduler()._satisfies_last_chunk_constraints(req("r2", 0))
    assert module.envs_spyre is envs  # put back after the call


# -- the prefix cache


class Stats:
    """vLLM's PrefillStats, as far as the fault uses it."""

    def __init__(self, prompt: int, cached: int) -> None:
        self.num_external_cached_tokens = 0
        self.set(prompt, cached, 0)

    def set(self, num_prompt_tokens: int, num_local_cached_tokens: int,
            num_external_cached_tokens: int) -> None:
        self.num_prompt_tokens = num_prompt_tokens
        self.num_local_cached_tokens = num_local_cached_tokens
        self.num_external_cached_tokens = num_external_cached_tokens
        self.num_cached_tokens = num_local_cached_tokens + num_external_cached_tokens


def test_prefix_hit_underreported_lowers_the_first_hit_by_a_block(monkeypatch, armed):
    class Scheduler:
        block_size = 64

        def __init__(self) -> None:
            self.requests = {"a": SimpleNamespace(prefill_stats=Stats(300, 0)),
                             "b": SimpleNamespace(prefill_stats=Stats(300, 256)),
                             "c": SimpleNamespace(prefill_stats=Stats(300, 256))}
            self.new: list[str] = []

        def schedule(self) -> Any:
            return SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id=r)
                                                       for r in self.new])

    monkeypatch.setattr(faults, "scheduler_class", lambda name: Scheduler)
    faults.prefix_hit_underreported({})
    s = Scheduler()
    s.new = ["a", "b"]
    s.schedule()
    assert s.requests["a"].prefill_stats.num_cached_tokens == 0
    assert s.requests["b"].prefill_stats.num_cached_tokens == 192
    s.new = ["c"]
    s.schedule()  # fired once
    assert s.requests["c"].prefill_stats.num_cached_tokens == 256


def test_prefix_cache_drops_the_last_block_of_every_hit(monkeypatch, armed):
    class Manager:
        def get_computed_blocks(self, request: Any) -> Any:
            return SimpleNamespace(blocks=([1, 2, 3, 4],)), 256, 0

        def create_kv_cache_blocks(self, groups: Any) -> Any:
            return SimpleNamespace(blocks=groups)

    class Scheduler:
        block_size = 64

        def __init__(self) -> None:
            self.kv_cache_manager = Manager()

    monkeypatch.setattr(faults, "scheduler_class", lambda name: Scheduler)
    faults.prefix_cache_drops_a_block({})
    s = Scheduler()
    for _ in range(2):  # every hit, not once
        blocks, tokens, boundary = s.kv_cache_manager.get_computed_blocks(req("a", 0))
        assert blocks.blocks == ([1, 2, 3],) and tokens == 192 and boundary == 0


# -- what the probe records for the checks


def test_the_probe_reads_the_schedulers_side_of_the_limit(monkeypatch):
    module = type(sys)("fake_scheduler_module")
    module.envs_spyre = SimpleNamespace(SENDNN_INFERENCE_PAUSING_ENABLED=True)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cls = type("ChunkedPrefillSpyreScheduler", (FakeScheduler,), {"__module__": module.__name__})
    a, b, c = req("a", 70), req("b", 30), req("c", 10)
    s = cls()
    s.chunk_size, s.running, s.ongoing_prefills = 128, [a, b, c], [c]
    snap = KvSnapshot(source="vllm-scheduler", num_blocks=4)
    read_batch_tkv(s, snap)
    assert snap.pausing is True and snap.chunk_size == 128
    assert snap.predicted_batch == ["a", "b"] and snap.predicted_tkv == 95  # c still prefills


def test_the_probe_reads_what_the_runner_takes_from_the_cache():
    runner = SimpleNamespace(block_size=64, requests={
        "a": SimpleNamespace(usable_blocks=3), "b": SimpleNamespace(usable_blocks=0),
        "old": SimpleNamespace()})
    assert runner_cached_tokens(runner) == {"a": 192, "b": 0}
    assert runner_cached_tokens(SimpleNamespace()) is None
