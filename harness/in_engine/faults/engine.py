"""Faults in the engine as a whole: its process dies or hangs, or it gets fewer KV blocks.

They model a card that cannot come up, falls over under load, stops answering, or
provides less memory than configured.
"""

from __future__ import annotations

import copy
import os
import time
from typing import Any

from harness.in_engine.fault_registry import armed, fault


@fault("crash-engine")
def crash_engine(config: dict[str, Any], when: str = "start") -> None:
    """The engine process dies: at start (a card that cannot come up) or at its first
    generate/step call (a card that falls over under load)."""
    if when == "start":
        print("[hil] fault crash_engine: exiting at start", flush=True)
        os._exit(3)
    from vllm.v1.engine.llm_engine import LLMEngine  # defers a heavy import

    original = LLMEngine.step

    def step(self: Any, *a: Any, **kw: Any) -> Any:
        if armed():
            print("[hil] fault crash_engine: exiting during a step", flush=True)
            os._exit(3)
        return original(self, *a, **kw)

    LLMEngine.step = step  # type: ignore[method-assign]


@fault("hang-engine")
def hang_engine(config: dict[str, Any]) -> None:
    """The engine stops answering at its first step after start (a hung device)."""
    from vllm.v1.engine.llm_engine import LLMEngine  # defers a heavy import

    original = LLMEngine.step

    def step(self: Any, *a: Any, **kw: Any) -> Any:
        if armed():
            print("[hil] fault hang_engine: hanging", flush=True)
            while True:
                time.sleep(60)
        return original(self, *a, **kw)

    LLMEngine.step = step  # type: ignore[method-assign]


@fault("kv-blocks-short")
def kv_blocks_short(config: dict[str, Any], by: str = "1") -> None:
    """The device provides ``by`` fewer KV blocks than configured (num_gpu_blocks_override)."""
    from vllm.engine.arg_utils import EngineArgs  # defers a heavy import

    original = EngineArgs.create_engine_config

    def create_engine_config(self: Any, *a: Any, **kw: Any) -> Any:
        if self.num_gpu_blocks_override:
            self.num_gpu_blocks_override -= int(by)
            print(f"[hil] fault kv_blocks_short: override now {self.num_gpu_blocks_override}",
                  flush=True)
        return original(self, *a, **kw)

    EngineArgs.create_engine_config = create_engine_config  # type: ignore[method-assign]


@fault("kv-cache-short")
def kv_cache_short(config: dict[str, Any], by: str = "1") -> None:
    """vLLM's model runner allocates each KV cache tensor ``by`` blocks (pages) short of the
    pool its scheduler hands blocks out of, as a device that provides less memory than it
    reported to the scheduler would: the pool can hand out block ids with no memory behind
    them (breaks device_blocks from the first snapshot). Acts at start-up, armed or not; a
    plugin's own runner (sendnn-inference: ``runner-kv-short``) is not touched."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # defers a heavy import

    original = GPUModelRunner._allocate_kv_cache_tensors

    def _allocate_kv_cache_tensors(self: Any, kv_cache_config: Any) -> Any:
        short = copy.deepcopy(kv_cache_config)
        page = int(short.kv_cache_groups[0].kv_cache_spec.page_size_bytes)
        for tensor in short.kv_cache_tensors:
            tensor.size -= int(by) * page
        print(f"[hil] fault kv_cache_short fired: the KV cache holds {int(by)} block(s) fewer"
              f" than the {kv_cache_config.num_blocks} of the pool", flush=True)
        return original(self, short)

    GPUModelRunner._allocate_kv_cache_tensors = _allocate_kv_cache_tensors  # type: ignore[method-assign]
