"""vLLM's own model runner: the block count of the KV cache it allocated, read beside the
scheduler's pool (harness/in_engine/probes.py), and the fault that allocates it short
(``kv-cache-short``, harness/in_engine/faults/engine.py), on fakes."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace
from typing import Any

import torch

from harness.checks.device_blocks import check_device_blocks
from harness.in_engine.faults import FAULTS
from harness.in_engine.probes import snapshot_engine, vllm_runner_kv_blocks
from tests.unit.vllm_fakes import engine_core, fake_manager, fake_pool, fake_vllm_scheduler

PAGE = 2 * 16 * 2 * 8 * 4  # K and V, 16 tokens, 2 heads of 8, float32


def cache_config(num_blocks: int, layers: int = 2, **tensor: Any) -> SimpleNamespace:
    spec = SimpleNamespace(page_size_bytes=PAGE)
    return SimpleNamespace(
        num_blocks=num_blocks,
        kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec)],
        kv_cache_tensors=[SimpleNamespace(size=num_blocks * PAGE, shared_by=[f"l{i}"], **tensor)
                          for i in range(layers)])


def layer_cache(num_blocks: int) -> torch.Tensor:
    """As vLLM's CPU runner shapes it: an int8 buffer viewed as [blocks, heads, 16, 2 x 8]."""
    raw = torch.zeros(num_blocks * PAGE, dtype=torch.int8)
    return raw.view(torch.float32).view(num_blocks, 2, 16, 16)


class CPUModelRunner:
    """vLLM's runner, as the reader sees it: ``kv_caches`` and ``kv_cache_config``."""

    def __init__(self, num_blocks: int, *caches: int) -> None:
        self.kv_cache_config = cache_config(num_blocks)
        self.kv_caches = [layer_cache(n) for n in (caches or (num_blocks, num_blocks))]


CPUModelRunner.__module__ = "vllm.v1.worker.cpu_model_runner"


def scheduler(num_blocks: int) -> SimpleNamespace:
    pool = fake_pool(num_blocks, {})
    return fake_vllm_scheduler(pool, fake_manager(pool, {}, 16))


def test_the_count_is_the_allocation_over_a_page_whatever_the_view():
    assert vllm_runner_kv_blocks(CPUModelRunner(33)) == 33
    assert vllm_runner_kv_blocks(CPUModelRunner(33, 33, 32)) == 32  # every layer must hold it


def test_snapshot_engine_reads_vllms_runner_beside_its_scheduler():
    (snap,) = snapshot_engine(engine_core(scheduler(33), CPUModelRunner(33)))
    assert snap.device_blocks == 33 and check_device_blocks(snap) == []
    (short,) = snapshot_engine(engine_core(scheduler(33), CPUModelRunner(33, 32, 32)))
    assert short.device_blocks == 32
    assert "the scheduler can hand out blocks [32]" in check_device_blocks(short)[0].message


def test_what_the_reader_does_not_cover_is_unknown():
    plugin = type("PluginRunner", (), {})()  # a plugin's runner: its kind reads it
    plugin.kv_caches, plugin.kv_cache_config = [layer_cache(4)], cache_config(4)
    assert vllm_runner_kv_blocks(plugin) is None
    assert vllm_runner_kv_blocks(None) is None
    before_start = CPUModelRunner(4)
    before_start.kv_caches = []
    assert vllm_runner_kv_blocks(before_start) is None
    packed = CPUModelRunner(4)
    packed.kv_cache_config = cache_config(4, block_stride=2 * PAGE)
    assert vllm_runner_kv_blocks(packed) is None
    mixed = CPUModelRunner(4)
    mixed.kv_cache_config.kv_cache_groups.append(
        SimpleNamespace(kv_cache_spec=SimpleNamespace(page_size_bytes=PAGE * 2)))
    assert vllm_runner_kv_blocks(mixed) is None
    across = CPUModelRunner(4)
    across.cross_layers_kv_cache = layer_cache(4)
    assert vllm_runner_kv_blocks(across) is None


def test_kv_cache_short_allocates_fewer_pages_than_the_pool(monkeypatch, capsys):
    class GPUModelRunner:
        def _allocate_kv_cache_tensors(self, kv_cache_config):
            return {name: torch.zeros(t.size, dtype=torch.int8)
                    for t in kv_cache_config.kv_cache_tensors for name in t.shared_by}

    module = types.ModuleType("vllm.v1.worker.gpu_model_runner")
    module.GPUModelRunner = GPUModelRunner
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", module)
    FAULTS["kv-cache-short"]({}, by="1")
    config = cache_config(33)
    raw = GPUModelRunner()._allocate_kv_cache_tensors(config)
    assert {name: t.numel() // PAGE for name, t in raw.items()} == {"l0": 32, "l1": 32}
    assert [t.size for t in config.kv_cache_tensors] == [33 * PAGE] * 2  # the pool's, untouched
    assert "the KV cache holds 1 block(s) fewer than the 33 of the pool" in capsys.readouterr().out
