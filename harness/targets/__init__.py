"""Targets: one module per device kind, all returning the same Trace type."""

from __future__ import annotations

from harness.engine.config import EngineConfig
from harness.targets.base import VllmTarget
from harness.targets.neuron import NeuronTarget
from harness.targets.spyre import SpyreTarget
from harness.targets.vllm_cpu import VllmCpuTarget

VLLM_TARGETS: dict[str, type[VllmTarget]] = {
    "vllm-cpu": VllmCpuTarget,
    "spyre": SpyreTarget,
    "neuron": NeuronTarget,
}


def target_for(cfg: EngineConfig) -> VllmTarget:
    """The target module that builds and runs engines of this configuration."""
    return VLLM_TARGETS[cfg.target](cfg)
