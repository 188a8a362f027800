"""The device a kind runs on, as the inventory, leases and discovery see it."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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
    # The JSON-schema fragment of each of those keys (merged into the inventory schema,
    # harness/lab/schemas.py); a key without one takes any value, for inventory_env to judge.
    inventory_key_schemas: Mapping[str, Mapping[str, Any]] = field(default_factory=dict,
                                                                   compare=False)
    # Driver or firmware versions the host shows for this kind, for the report's environment.
    host_properties: Callable[[Path, DeviceScan], dict[str, str]] | None = None
    # What an inventory ``address`` of this kind looks like (said in messages) and its pattern,
    # whose first group is the canonical form: two entries with one canonical address are one
    # device. None: the kind takes no address (any text is kept, never checked).
    address_form: str | None = None
    address_pattern: str | None = None
    # The variable of an inventory ``env`` that names the device's address too (two names of
    # one device must agree, and count as its address when ``address`` is not given).
    address_env: str | None = None
    # Variables (prefixes) the harness sets per rank for a group of devices one engine holds
    # (each rank's device, the group's size): a member's own value is left out of the group's.
    group_env_prefixes: tuple[str, ...] = ()
    # (variable, why) the harness sets itself for this kind's engines: an inventory ``env``
    # setting one would silently change what the harness runs or checks, so it is refused.
    owned_env: tuple[tuple[str, str], ...] = ()
    # The kind's meaning checks of a device's final env (its core range against its tensor
    # parallel size, say); raises ConfigError naming ``where``.
    check_env: Callable[[Mapping[str, str], str], None] | None = None
    # Engine variables that name the physical device an engine was given, most precise first
    # (the report's device instance, harness/report/labels.py).
    device_env_vars: tuple[str, ...] = ()

    def address_problem(self, address: str) -> str | None:
        """Why ``address`` is not an address of this kind (None: it is, or any text goes)."""
        if self.address_pattern is None:
            return None
        if re.fullmatch(self.address_pattern, address, re.IGNORECASE) is None:
            return f"is not {self.address_form}"
        return None

    def canonical_address(self, address: str) -> str:
        """One spelling per device (``/dev/neuron0`` and ``neuron0`` are one device)."""
        m = re.fullmatch(self.address_pattern or "(.*)", address, re.IGNORECASE)
        return (m.group(1) if m and m.groups() else address).lower()

    @property
    def default_backend(self) -> str | None:
        return self.backends[0] if self.backends else None

    def address_path(self, address: str, root: Path) -> Path | None:
        """The path whose existence says an inventory device is present (None: not checked)."""
        if self.address_under is None:
            return None
        return root / self.address_under / address.removeprefix(f"/{self.address_under}/")


CPU_DEVICE = DeviceKind(name="cpu", label="CPU", leased=False)
