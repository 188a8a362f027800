"""Device records: what discovery found on the host (``Device``, ``DeviceScan``) and what an
inventory lists (``InventoryDevice``), with the two small readers of a device tree that every
kind's discovery uses. Every function takes the filesystem root so tests can point it at a fake
tree; paths in messages are the paths actually scanned.

What a device kind is called in messages and whether its devices are leased are the kinds' own
(``harness.targets``); the registry states them here when it loads (``describe_device_kind``), so
these records stay below the kinds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

CPU_HINT = "use -m cpu to run the CPU-mode targets"

_KIND_LABELS: dict[str, str] = {}
_LEASED_KINDS: set[str] = set()


def describe_device_kind(name: str, label: str, leased: bool) -> None:
    """State a device kind's label and whether its devices are leased (the registry calls it)."""
    _KIND_LABELS[name] = label
    if leased:
        _LEASED_KINDS.add(name)
    else:
        _LEASED_KINDS.discard(name)


@dataclass
class Device:
    """One accelerator found on the host.

    ``id`` is the PCI address for Spyre (``0000:3b:00.0``) and the node name
    for Neuron (``neuron0``); ``path`` is the sysfs device directory or the
    /dev node. ``detail`` says what was checked, and why when not usable.
    """

    kind: str  # a device kind of the registry (harness.targets)
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
        label = _KIND_LABELS.get(self.kind, self.kind)
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


def read_value(path: Path) -> str | None:
    """A sysfs value as written (None when absent or empty)."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def read_id(path: Path) -> str | None:
    try:
        return path.read_text().strip().lower()
    except OSError:
        return None


def rw_problem(path: Path) -> str | None:
    """Why the current user cannot open ``path`` read-write, or None if it can."""
    if not os.access(path, os.R_OK | os.W_OK):
        return f"{path} is not readable and writable by this user"
    return None


CARDS_ENV = "HIL_DEVICE_CARDS"  # set in a group lease's engines: its devices, in rank order


@dataclass(frozen=True)
class InventoryDevice:
    id: str
    kind: str
    backend: str | None = None
    address: str | None = None
    features: tuple[str, ...] = ()
    health: str = "ok"
    env: tuple[tuple[str, str], ...] = ()
    present: bool = True
    detail: str = ""
    # A group of devices one tensor-parallel engine holds at once, in rank order (rank i on
    # members[i]); () for a single device. A group's id, kind, backend and features are its
    # members' in common; its env is theirs without each one's address variable.
    members: tuple[InventoryDevice, ...] = ()

    @property
    def cards(self) -> tuple[str, ...]:
        """The ids of the devices it holds: its members', or its own."""
        return tuple(m.id for m in self.members) or (self.id,)

    @property
    def usable(self) -> bool:
        if self.members:
            return all(m.usable for m in self.members)
        return self.present and self.health == "ok"

    def why_unusable(self) -> str:
        if self.members:
            return "; ".join(m.why_unusable() for m in self.members if not m.usable)
        if not self.present:
            return f"device {self.id} ({self.kind}) is listed but absent: {self.detail}"
        return f"device {self.id} ({self.kind}) has health {self.health!r} in the inventory"

    @property
    def leased(self) -> bool:
        """Whether a pytest process must lease this device (the CPU is shared)."""
        return self.kind in _LEASED_KINDS
