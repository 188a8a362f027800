"""The device a kind runs on, as the inventory, leases and discovery see it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.devices import DeviceScan, InventoryDevice


@dataclass(frozen=True)
class DeviceKind:
    """A kind of device as the inventory, leases and discovery see it."""

    name: str  # the inventory's ``kind``
    label: str  # in messages: "no Spyre device found"
    leased: bool  # one pytest process at a time per device (the CPU is shared)
    backends: tuple[str, ...] = ()  # inventory ``backend`` values; the first is the default
    address_under: str | None = None  # where an inventory ``address`` is checked, below root
    discover: Callable[[Path], DeviceScan] | None = None  # sysfs / /dev scan
    # The inventory entries discovery makes of a scan (ids, env per device).
    to_inventory: Callable[[DeviceScan], list[InventoryDevice]] | None = None
    # The environment an inventory entry's kind-specific keys give its lease (``where`` names
    # the entry in errors, raised as ConfigError); None: the kind has no keys of its own.
    inventory_env: Callable[[dict[str, Any], str], dict[str, str]] | None = None
    inventory_keys: tuple[str, ...] = ()  # those keys, refused on every other kind
    # Driver or firmware versions the host shows for this kind, for the report's environment.
    host_properties: Callable[[Path, DeviceScan], dict[str, str]] | None = None

    @property
    def default_backend(self) -> str | None:
        return self.backends[0] if self.backends else None

    def address_path(self, address: str, root: Path) -> Path | None:
        """The path whose existence says an inventory device is present (None: not checked)."""
        if self.address_under is None:
            return None
        return root / self.address_under / address.removeprefix(f"/{self.address_under}/")


CPU_DEVICE = DeviceKind(name="cpu", label="CPU", leased=False)
