"""Spyre cards on the host: PCI functions with IBM's Spyre ids, usable where VFIO exposes them."""

from __future__ import annotations

import os
from pathlib import Path

from harness.core.devices import Device, DeviceScan, read_id, read_value, rw_problem

# IBM Spyre (vendor, device) as read from sysfs ``vendor``/``device`` files: the card's physical
# function, and the virtual functions SR-IOV makes of it (what a VM or a container is given).
SPYRE_PF = ("0x1014", "0x06a7")
SPYRE_VF = ("0x1014", "0x06a8")
SPYRE_PCI_IDS = {SPYRE_PF, SPYRE_VF}


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
        pci_id = (read_id(dev_dir / "vendor"), read_id(dev_dir / "device"))
        if pci_id not in SPYRE_PCI_IDS:
            continue
        driver_link = dev_dir / "driver"
        driver = driver_link.resolve().name if driver_link.is_symlink() else None
        driver_note = f"driver {driver}" if driver else "no driver bound"
        if pci_id == SPYRE_VF:
            driver_note = f"virtual function, {driver_note}"
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
        elif problem := rw_problem(vfio_node):
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


def host_properties(root: Path, scan: DeviceScan) -> dict[str, str]:
    """The kernel driver each card is bound to (vfio-pci when usable) and vfio-pci's version."""
    props: dict[str, str] = {}
    drivers = sorted({(d.path / "driver").resolve().name for d in scan.devices
                      if (d.path / "driver").is_symlink()})
    if drivers:
        props["spyre.driver"] = ", ".join(drivers)
    if value := read_value(root / "sys/module/vfio_pci/version"):
        props["spyre.vfio_pci"] = value
    return props
