"""Opening the card the way the runtime does: from the environment, checked in the device tree."""

from __future__ import annotations

import os
from pathlib import Path

from torch_sendnn.log import dtlog

SPYRE_PCI_ID = ("0x1014", "0x06a7")


class DeviceOpenError(RuntimeError):
    """The runtime could not open the card it was told to use."""


def _root() -> Path:
    return Path(os.environ.get("SENDNN_EMULATION_ROOT", "/"))


def _rank() -> str:
    return os.environ.get("RANK", "0")


def card_address() -> str | None:
    """The PCI address this rank must open: AIU_WORLD_RANK_<rank>."""
    return os.environ.get(f"AIU_WORLD_RANK_{_rank()}")


def open_device() -> str:
    """Open the card (or the simulator) and return what was opened, e.g. ``SEN:VFIO:0000:3b:00.0``."""
    compute = os.environ.get("FLEX_COMPUTE", "")
    if compute != "SENTIENT":
        dtlog("INFO", f"Opened: SENULATOR (FLEX_COMPUTE={compute or 'unset'})")
        return "SENULATOR"
    flex_device = os.environ.get("FLEX_DEVICE", "")
    if flex_device != "VFIO":
        raise DeviceOpenError(f"FLEX_DEVICE={flex_device or 'unset'}: only VFIO is supported")
    address = card_address()
    if not address:
        raise DeviceOpenError(f"AIU_WORLD_RANK_{_rank()} is not set: no card for rank {_rank()}")
    dev = _root() / "sys/bus/pci/devices" / address
    try:
        ids = ((dev / "vendor").read_text().strip(), (dev / "device").read_text().strip())
    except OSError:
        raise DeviceOpenError(f"no PCI device {address} ({dev} missing)") from None
    if ids != SPYRE_PCI_ID:
        raise DeviceOpenError(f"{address} is PCI {ids[0]}:{ids[1]}, not a Spyre card")
    group = Path(os.readlink(dev / "iommu_group")).name if (dev / "iommu_group").is_symlink() else None
    node = _root() / "dev/vfio" / str(group)
    if group is None or not os.access(node, os.R_OK | os.W_OK):
        raise DeviceOpenError(f"{address}: VFIO group node {node} missing or not read-writable")
    opened = f"SEN:VFIO:{address}"
    dtlog("INFO", f"Opened: {opened} (iommu group {group})")
    return opened
