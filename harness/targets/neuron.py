"""neuron: vllm-neuron on AWS Inferentia/Trainium devices."""

from __future__ import annotations

import importlib.util
from typing import Any

from harness.targets.base import VllmTarget


class NeuronTarget(VllmTarget):
    name = "neuron"

    @classmethod
    def availability_probe(cls, variant: Any) -> str | None:
        from harness.lab.devices import discover_neuron

        scan = discover_neuron()
        if not scan.usable:
            return scan.why_none()
        if importlib.util.find_spec("vllm_neuron") is None:
            return (
                f"{len(scan.usable)} Neuron device(s) found but vllm-neuron is not installed;"
                " install vllm-neuron with torch-neuronx from AWS's package index"
            )
        return None

    def engine_env(self) -> dict[str, str]:
        env = super().engine_env()
        env["VLLM_PLUGINS"] = "neuron"
        return env

    def llm_kwargs(self) -> dict[str, Any]:
        kw = super().llm_kwargs()
        # The Neuron geometry: one block per sequence; the platform adds the null block.
        kw.setdefault("block_size", self.cfg.max_model_len)
        return kw
