"""Discovery of accelerator devices from sysfs and /dev, without starting engines.

Every function takes the filesystem root (default ``/``) so tests can point it
at a fake tree; paths in messages are the paths actually scanned.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# IBM Spyre (vendor, device) as read from sysfs ``vendor``/``device`` files.
SPYRE_PCI_IDS = {("0x1014", "0x06a7")}

CPU_HINT = "use -m cpu to run the CPU-mode targets"

_NEURON_NODE = re.compile(r"neuron(\d+)")


@dataclass
class Device:
    """One accelerator found on the host.

    ``id`` is the PCI address for Spyre (``0000:3b:00.0``) and the node name
    for Neuron (``neuron0``); ``path`` is the sysfs device directory or the
    /dev node. ``detail`` says what was checked, and why when not usable.
    """

    kind: str  # "spyre" or "neuron"
    id: str
    path: Path
    usable: bool
    detail: str
    iommu_group: str | None = None
    vfio_path: Path | None = None


@dataclass
class DeviceScan:
    """The result of looking for one kind of device (``kind`` as in ``Device``)."""

    kind: str
    devices: list[Device] = field(default_factory=list)
    looked_for: str = ""
    root: Path = Path("/")  # the filesystem root the scan looked under (a fake tree in tests)

    @property
    def usable(self) -> list[Device]:
        """The devices an engine could open."""
        return [d for d in self.devices if d.usable]

    def why_none(self) -> str | None:
        """A sentence explaining the absence of usable devices, or None if any."""
        if self.usable:
            return None
        from harness.targets import device_kind

        dk = device_kind(self.kind)
        label = dk.label if dk is not None else self.kind
        if not self.devices:
            return f"no {label} device found: looked for {self.looked_for}; {CPU_HINT}"
        found = "; ".join(f"{d.id}: {d.detail}" for d in self.devices)
        return (
            f"no usable {label} device: found {len(self.devices)} but none "
            f"usable ({found}); looked for {self.looked_for}; {CPU_HINT}"
        )


def device_root() -> Path:
    """The filesystem root discovery reads: HIL_DEVICE_ROOT (a fake card host's tree) or /."""
    return Path(os.environ.get("HIL_DEVICE_ROOT") or "/")


def _read_id(path: Path) -> str | None:
    try:
        return path.read_text().strip().lower()
    except OSError:
        return None


def _rw_problem(path: Path) -> str | None:
    """Why the current user cannot open ``path`` read-write, or None if it can."""
    if not os.access(path, os.R_OK | os.W_OK):
        return f"{path} is not readable and writable by this user"
    return None


def discover_spyre(root: Path = Path("/")) -> DeviceScan:
    """List PCI functions matching ``SPYRE_PCI_IDS`` and whether VFIO exposes them.

    A card is usable iff it has an IOMMU group whose ``/dev/vfio/<group>`` node
    exists and is readable and writable by this user.
    """
    root = Path(root)
    pci_dir = root / "sys/bus/pci/devices"
    vfio_dir = root / "dev/vfio"
    ids = ", ".join(sorted(f"{v[2:]}:{d[2:]}" for v, d in SPYRE_PCI_IDS))
    scan = DeviceScan(
        kind="spyre",
        looked_for=(
            f"PCI vendor:device {ids} under {pci_dir} and VFIO groups under {vfio_dir}"
        ),
    )
    try:
        entries = sorted(pci_dir.iterdir())
    except OSError:
        return scan
    for dev_dir in entries:
        pci_id = (_read_id(dev_dir / "vendor"), _read_id(dev_dir / "device"))
        if pci_id not in SPYRE_PCI_IDS:
            continue
        driver_link = dev_dir / "driver"
        driver = driver_link.resolve().name if driver_link.is_symlink() else None
        driver_note = f"driver {driver}" if driver else "no driver bound"
        group_link = dev_dir / "iommu_group"
        if not group_link.is_symlink():
            scan.devices.append(
                Device(
                    kind="spyre",
                    id=dev_dir.name,
                    path=dev_dir,
                    usable=False,
                    detail=f"no iommu_group link ({driver_note}); IOMMU disabled?",
                )
            )
            continue
        group = Path(os.readlink(group_link)).name
        vfio_node = vfio_dir / group
        if not vfio_node.exists():
            usable = False
            detail = f"IOMMU group {group} but {vfio_node} missing ({driver_note})"
            if driver != "vfio-pci":
                detail += "; the card must be bound to vfio-pci"
        elif problem := _rw_problem(vfio_node):
            usable = False
            detail = f"IOMMU group {group}, {problem} ({driver_note})"
        else:
            usable = True
            detail = f"IOMMU group {group}, {vfio_node} present ({driver_note})"
        scan.devices.append(
            Device(
                kind="spyre",
                id=dev_dir.name,
                path=dev_dir,
                usable=usable,
                detail=detail,
                iommu_group=group,
                vfio_path=vfio_node,
            )
        )
    return scan


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
        problem = _rw_problem(node)
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
