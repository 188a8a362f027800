"""Neuron devices on the host: ``/dev/neuron<N>`` nodes, and the NeuronCores each one has."""

from __future__ import annotations

import re
from pathlib import Path

from harness.core.devices import Device, DeviceScan, read_value, rw_problem

_NEURON_NODE = re.compile(r"neuron(\d+)")


def discover_neuron(root: Path = Path("/")) -> DeviceScan:
    """List ``/dev/neuron<N>`` nodes in numeric order; usable iff read-writable."""
    dev_dir = Path(root) / "dev"
    scan = DeviceScan(kind="neuron", looked_for=f"{dev_dir / 'neuron'}*")
    found = []
    for node in dev_dir.glob("neuron[0-9]*"):
        m = _NEURON_NODE.fullmatch(node.name)
        if m:
            found.append((int(m.group(1)), node))
    for _, node in sorted(found):
        problem = rw_problem(node)
        scan.devices.append(
            Device(
                kind="neuron",
                id=node.name,
                path=node,
                usable=problem is None,
                detail=problem or f"{node} present",
            )
        )
    return scan


def neuron_core_range(node: str, root: Path = Path("/")) -> str | None:
    """The NeuronCores of device ``neuronN`` (``"2-3"``), from the driver's per-device
    ``core_count`` in sysfs; None when the driver does not say (then an inventory must).
    The count is physical cores: with logical cores (trn2, LNC=2) list ``cores`` in an inventory."""
    try:
        index = int(node.removeprefix("neuron"))
        count_file = root / "sys/devices/virtual/neuron_device" / node / "core_count"
        count = int(count_file.read_text().strip())
    except (OSError, ValueError):
        return None
    first = index * count
    return f"{first}-{first + count - 1}" if count > 1 else str(first)


def host_properties(root: Path, scan: DeviceScan) -> dict[str, str]:
    """The Neuron driver's version."""
    value = read_value(root / "sys/module/neuron/version")
    return {"neuron.driver": value} if value else {}
