"""The Spyre readers read the block count of the KV cache the model allocated (its tensors'
shapes) beside each generation's pool, and the faults that make the two disagree
(harness/targets/spyre/ledger.py, faults_2x.py) do what they say, on fakes."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from harness.checks.device_blocks import check_device_blocks
from harness.in_engine.faults import FAULTS
from harness.in_engine.probes import snapshot_engine
from harness.targets.spyre import faults_2x
from harness.targets.spyre.ledger import (
    device_kv_blocks,
    snapshot_legacy_spyre_runner,
    snapshot_spyre_runner,
)
from tests.unit.vllm_fakes import (
    FakeCBRunner,
    FakeLegacyRunner,
    engine_core,
    fake_manager,
    fake_pool,
    fake_vllm_scheduler,
)


def kv_layers(*counts: int) -> list[tuple[Any, Any]]:
    """``past_key_value_states``: per layer (k, v) of [num_blocks, block_size, heads, dim]."""
    return [(SimpleNamespace(shape=(n, 64, 1, 16)), SimpleNamespace(shape=(n, 64, 1, 16)))
            for n in counts]


class Fake2xModel:
    """sendnn-inference 2.x's SpyreCausalLM: the KV cache on the model itself."""

    def __init__(self, blocks: int) -> None:
        self.set_past_key_value_states(blocks)

    def set_past_key_value_states(self, num_blocks: int) -> None:
        self.past_key_value_states = kv_layers(num_blocks, num_blocks)


class Fake2xRunner:
    """ChunkedPrefillModelRunner: a request table of its own, no block pool, the model behind
    a property that asserts it is loaded."""

    def __init__(self, blocks: int | None) -> None:
        self._model = None if blocks is None else Fake2xModel(blocks)
        self.requests: dict[str, Any] = {}

    @property
    def model(self) -> Fake2xModel:
        assert self._model is not None, "model accessed before loading"
        return self._model

    def complete_warmup(self) -> None:
        pass


def scheduler_2x(num_blocks: int) -> SimpleNamespace:
    pool = fake_pool(num_blocks, {})
    sched = fake_vllm_scheduler(pool, fake_manager(pool, {}, 64))
    sched.reserved_blocks, sched.total_reserved_blocks, sched.requests = {}, 0, {}
    return sched


def test_the_2x_reader_puts_the_runners_kv_cache_beside_the_scheduler_pool():
    (snap,) = snapshot_engine(engine_core(scheduler_2x(10), Fake2xRunner(10)))
    assert snap.num_blocks == 10 and snap.device_blocks == 10 and check_device_blocks(snap) == []
    (short,) = snapshot_engine(engine_core(scheduler_2x(10), Fake2xRunner(9)))
    assert short.device_blocks == 9
    assert "the scheduler can hand out blocks [9]" in check_device_blocks(short)[0].message


def test_a_model_not_loaded_yet_has_no_count():
    assert device_kv_blocks(Fake2xRunner(None)) is None
    (snap,) = snapshot_engine(engine_core(scheduler_2x(10), Fake2xRunner(None)))
    assert snap.device_blocks is None and check_device_blocks(snap) == []


def test_the_smallest_layer_is_what_every_layer_can_hold():
    runner = Fake2xRunner(10)
    runner.model.past_key_value_states = kv_layers(10, 7, 10)
    assert device_kv_blocks(runner) == 7


def test_the_1x_and_legacy_readers_read_the_model_behind_the_runner():
    runner = FakeCBRunner(12, {}, {})
    runner.model = SimpleNamespace(model=SimpleNamespace(past_key_value_states=kv_layers(12)))
    s = snapshot_spyre_runner(runner)
    assert s.num_blocks == 12 and s.device_blocks == 12 and check_device_blocks(s) == []
    runner.model.model.past_key_value_states = kv_layers(11)
    assert check_device_blocks(snapshot_spyre_runner(runner))[0].message.startswith(
        "the pool has 12 blocks but the device's KV cache holds 11")
    assert snapshot_spyre_runner(FakeCBRunner(12, {}, {})).device_blocks is None  # no model
    assert snapshot_legacy_spyre_runner(FakeLegacyRunner(16)).device_blocks == 16


# -- the faults


def test_the_faults_are_registered_in_the_2x_module():
    for name in ("runner-kv-short", "formula-forgets-pad-block"):
        assert FAULTS[name].__module__ == faults_2x.__name__


def test_runner_kv_short_allocates_fewer_blocks_after_warmup(monkeypatch, capsys):
    cls = type("Runner", (Fake2xRunner,), {})
    monkeypatch.setattr(faults_2x, "runner_class", lambda name: cls)
    FAULTS["runner-kv-short"]({}, by="2")
    runner = cls(10)
    runner.complete_warmup()
    assert device_kv_blocks(runner) == 8
    assert "[hil] fault runner_kv_short fired: the runner's KV cache holds 8 blocks of the 10" \
        in capsys.readouterr().out


class FakePlatform:
    """SpyrePlatform.get_total_spyre_blocks: a full batch plus the pad block (or the override),
    rounded to a multiple of max_num_seqs, refusing fewer than a full batch plus the pad."""

    @classmethod
    def get_total_spyre_blocks(cls, vllm_config: Any) -> int:
        seqs = vllm_config.scheduler_config.max_num_seqs
        full = seqs * (vllm_config.model_config.max_model_len // 64)
        override = vllm_config.cache_config.num_gpu_blocks_override
        n = (override // seqs * seqs if override
             else math.ceil((full + 1) / seqs) * seqs)
        if n < full + 1:
            raise ValueError(f"Number of pages available on Spyre {n} is not enough")
        return n


def vllm_config(override: int | None) -> SimpleNamespace:
    return SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=2),
                           model_config=SimpleNamespace(max_model_len=256),
                           cache_config=SimpleNamespace(num_gpu_blocks_override=override))


def test_shifted_block_count_is_a_rounding_step_short_and_judged_a_step_lower():
    seen: list[int | None] = []

    def count(o):
        seen.append(o)
        return 10 if o is None else o

    assert faults_2x.shifted_block_count(count, None, 2) == 8
    assert faults_2x.shifted_block_count(count, 8, 2) == 8
    assert seen == [None, 10]


def test_formula_forgets_pad_block_decides_a_count_short_of_a_full_batch(monkeypatch, capsys):
    platform = type("Platform", (FakePlatform,), {})
    monkeypatch.setattr(faults_2x, "plugin_module",
                        lambda name, fault_name: SimpleNamespace(SpyrePlatform=platform))
    FAULTS["formula-forgets-pad-block"]({})
    cfg = vllm_config(None)
    decided = platform.get_total_spyre_blocks(cfg)  # the platform at config time
    assert decided == 8 and cfg.cache_config.num_gpu_blocks_override is None
    assert "the device-decided count is 8 blocks, 2 short" in capsys.readouterr().out
    cfg.cache_config.num_gpu_blocks_override = decided  # as the platform sets it
    assert platform.get_total_spyre_blocks(cfg) == 8  # the runner's count agrees, unrefused
    assert cfg.cache_config.num_gpu_blocks_override == 8
    assert platform.get_total_spyre_blocks(vllm_config(12)) == 12  # an override stays itself
    with pytest.raises(ValueError, match="not enough"):
        platform.get_total_spyre_blocks(vllm_config(6))
