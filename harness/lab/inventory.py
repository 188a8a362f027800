"""Inventory: the devices of a lab host, from discovery or from an inventory file.

An inventory file (TOML or YAML) overrides discovery. Schema, one entry per device:

    [[device]]
    id = "card0"                 # unique name, used for leases and in reports
    kind = "spyre"               # a device kind of harness/targets/: spyre | neuron | cpu
    backend = "sendnn"           # spyre only: sendnn (a card) or eager (a CPU-mode stand-in)
    address = "0000:3b:00.0"     # optional: PCI address (spyre) or /dev node (neuron) to check
    features = ["sb", "cb", "cp"]  # optional: the modes of its kind it may run (default: all)
    health = "ok"                # ok | broken | maintenance (only ok devices are leased)
    env = { AIU_WORLD_RANK_0 = "0000:3b:00.0" }   # set in engines started on it
    cores = "0-1"                # neuron only: its NeuronCores (NEURON_RT_VISIBLE_CORES)
    engine = { tensor_parallel_size = 2, override_neuron_config = { ... } }
                                 # neuron only: engine settings (harness/targets/neuron/config.py)

A device listed with an ``address`` that is not there is kept, marked absent,
so tests that need it skip (or fail under --require-device) saying so.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness import targets
from harness.core.config import ConfigError
from harness.core.devices import InventoryDevice
from harness.in_engine.faults import check_fault_specs
from harness.lab.schemas import SchemaError, check, inventory_schema, read_utf8

HEALTH = ("ok", "broken", "maintenance")


class InventoryError(ValueError):
    """An inventory file that cannot be used; the message names the file and the line."""


@dataclass
class Inventory:
    devices: list[InventoryDevice] = field(default_factory=list)
    source: str = "discovery"

    def serving(self, target: str, backend: str | None, mode: str | None) -> list[InventoryDevice]:
        """The devices an engine of this kind, backend and mode runs on (the kind decides)."""
        k = targets.kind(target)
        return [d for d in self.devices if k.serves(d, backend, mode)]

    def kinds(self) -> list[str]:
        return sorted({d.kind for d in self.devices})


def _present(kind: str, address: str | None, root: Path) -> tuple[bool, str]:
    if not address:
        return True, "no address to check"
    dk = targets.device_kind(kind)
    path = dk.address_path(address, root) if dk is not None else None
    if path is None:
        return True, kind
    return path.exists(), f"looked for {path}"


def _parse(path: Path) -> tuple[dict[str, Any], str]:
    try:
        text = read_utf8(path, "inventory file")
    except SchemaError as e:
        raise InventoryError(str(e)) from None
    if path.suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text)
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark
            where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown line"
            raise InventoryError(f"{path}: invalid YAML at {where}: {e.problem}") from None
        return (data or {}), "yaml"
    try:
        return tomllib.loads(text), "toml"
    except tomllib.TOMLDecodeError as e:
        raise InventoryError(f"{path}: invalid TOML: {e}") from None


def load_inventory(path: Path, root: Path = Path("/"), allow_external_faults: bool = False) -> Inventory:
    """Read and validate an inventory file; absent devices are kept, marked absent."""
    if not path.is_file():
        raise InventoryError(f"inventory file not found: {path}; pass --inventory an existing"
                             " TOML or YAML file")
    data, _ = _parse(path)
    entries = data.get("device") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InventoryError(f"{path}: no devices: expected a list under 'device' ([[device]] in TOML)")
    try:
        check(data, inventory_schema(), str(path), item_names={"device": "id"})
    except SchemaError as e:
        raise InventoryError(str(e)) from None
    devices: list[InventoryDevice] = []
    seen: set[str] = set()
    for n, e in enumerate(entries, 1):
        where = f"{path}: device #{n}"
        if not isinstance(e, dict):
            raise InventoryError(f"{where}: expected a table of fields, got {type(e).__name__}")
        dev_id = e.get("id")
        if not isinstance(dev_id, str) or not dev_id:
            raise InventoryError(f"{where}: missing 'id'")
        where = f"{path}: device #{n} ({dev_id!r})"
        if dev_id in seen:
            raise InventoryError(f"{where}: id listed twice")
        seen.add(dev_id)
        kind = e.get("kind")
        kinds = targets.device_kinds()
        if kind not in kinds:
            raise InventoryError(f"{where}: kind {kind!r} is not one of {', '.join(kinds)}")
        dk = kinds[kind]
        backend = e.get("backend")
        if dk.backends and backend not in (None, *dk.backends):
            raise InventoryError(
                f"{where}: {kind} backend {backend!r} is not {' or '.join(dk.backends)}")
        health = e.get("health", "ok")
        if health not in HEALTH:
            raise InventoryError(f"{where}: health {health!r} is not one of {', '.join(HEALTH)}")
        features = tuple(e.get("features", ()))
        modes = tuple(m for k in targets.kinds_on(kind) for m in k.modes)
        if modes and not set(features) <= set(modes):
            raise InventoryError(f"{where}: features {list(features)} must be among {modes}")
        env = e.get("env", {})
        if not isinstance(env, dict):
            raise InventoryError(f"{where}: env must be a table of NAME = \"value\"")
        try:
            check_fault_specs(str(env.get("HIL_FAULTS", "")), allow_external_faults)
        except ValueError as err:
            raise InventoryError(f"{where}: env HIL_FAULTS: {err}") from None
        if dk.inventory_env is not None:
            try:
                env = {**env, **dk.inventory_env(e, where)}
            except ConfigError as err:
                raise InventoryError(str(err)) from None
        else:
            own = {k: d.name for d in targets.device_kinds().values() for k in d.inventory_keys}
            if stray := [k for k in own if k in e]:
                owner = own[stray[0]]
                keys = " and ".join(k for k in own if own[k] == owner)
                raise InventoryError(f"{where}: {keys} are for kind {owner} only")
        present, detail = _present(kind, e.get("address"), root)
        devices.append(InventoryDevice(
            id=dev_id, kind=kind, backend=backend or dk.default_backend,
            address=e.get("address"), features=features, health=health,
            env=tuple(sorted((str(k), str(v)) for k, v in env.items())),
            present=present, detail=detail,
        ))
    return Inventory(devices=devices, source=str(path))


def discover_inventory(root: Path = Path("/")) -> Inventory:
    """The inventory discovery finds: every device kind's devices, and the CPU."""
    devices: list[InventoryDevice] = []
    for dk in targets.device_kinds().values():
        if dk.discover is not None and dk.to_inventory is not None:
            devices.extend(dk.to_inventory(dk.discover(root)))
    devices.append(InventoryDevice(id="cpu", kind="cpu", detail="this host's CPU"))
    return Inventory(devices=devices, source="discovery")
