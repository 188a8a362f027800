"""Faults in the engine as a whole: its process dies or hangs, or it gets fewer KV blocks.

They model a card that cannot come up, falls over under load, stops answering, or
provides less memory than configured.
"""

from __future__ import annotations

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
