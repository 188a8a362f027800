"""neuron: vllm-neuron on AWS Inferentia/Trainium devices (/dev/neuron<N>)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.targets.base import DeviceKind, PoolGeometry, TargetVariant, VllmTarget

if TYPE_CHECKING:
    from harness.lab.devices import DeviceScan
    from harness.lab.inventory import InventoryDevice


def _discover(root: Path) -> DeviceScan:
    from harness.lab.devices import discover_neuron

    return discover_neuron(root)


def _to_inventory(scan: DeviceScan) -> list[InventoryDevice]:
    from harness.lab.inventory import InventoryDevice

    return [
        InventoryDevice(id=d.id, kind="neuron", address=d.id,
                        health="ok" if d.usable else "broken", present=True, detail=d.detail)
        for d in scan.devices
    ]


NEURON_DEVICE = DeviceKind(
    name="neuron", label="Neuron", leased=True, address_under="dev",
    discover=_discover, to_inventory=_to_inventory,
)


class NeuronTarget(VllmTarget):
    name = "neuron"
    order = 30
    device = NEURON_DEVICE
    variants = (TargetVariant("neuron", "neuron", None, None, ("neuron",)),)
    markers = {"neuron": "needs an AWS Neuron device (vllm-neuron)"}
    # One block per sequence; the platform adds the null block.
    geometries = {"default": PoolGeometry(None)}

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
        kw.setdefault("block_size", self.geometry().block_tokens(self.cfg.max_model_len))
        return kw


KIND = NeuronTarget
