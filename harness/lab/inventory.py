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

and, optionally, the groups of devices a tensor-parallel engine leases together:

    [[group]]
    id = "quad0"
    devices = ["card0", "card1", "card2", "card3"]   # rank i runs on devices[i]

A group's devices are of one kind and backend, all listed above and all on this host (a group
that cannot be formed is refused when the file is read). Without groups for a size, an engine of
N ranks leases the first N free devices that serve it, in address order.

A device listed with an ``address`` that is not there is kept, marked absent,
so tests that need it skip (or fail under --require-device) saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import targets
from harness.core.config import ConfigError
from harness.core.devices import InventoryDevice
from harness.core.strict_files import FileFormatError, read_toml, read_yaml
from harness.geometry.catalog import GeometryError, check_lab_models
from harness.in_engine.faults import check_fault_specs
from harness.lab.schemas import SchemaError, check, inventory_schema
from harness.targets.device_kind import DeviceKind

HEALTH = ("ok", "broken", "maintenance")


class InventoryError(ValueError):
    """An inventory file that cannot be used; the message names the file and the line."""


@dataclass
class Inventory:
    devices: list[InventoryDevice] = field(default_factory=list)
    source: str = "discovery"
    groups: list[InventoryDevice] = field(default_factory=list)  # declared ([[group]])

    def serving(self, target: str, backend: str | None, mode: str | None) -> list[InventoryDevice]:
        """The devices an engine of this kind, backend and mode runs on (the kind decides)."""
        k = targets.kind(target)
        return [d for d in self.devices if k.serves(d, backend, mode)]

    def serving_groups(self, target: str, backend: str | None, mode: str | None,
                       size: int) -> list[InventoryDevice]:
        """The declared groups of ``size`` devices whose every device serves this kind."""
        k = targets.kind(target)
        return [g for g in self.groups if len(g.members) == size
                and all(k.serves(m, backend, mode) for m in g.members)]

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


def read_inventory_document(path: Path) -> Any:
    """The inventory file's document, read strictly (harness/core/strict_files.py: a key
    twice, a byte-order mark, JSON for TOML are refused naming the line). Every reader of an
    inventory (its devices, its geometries) reads it here, so each says the file's own error
    first, never what it lacks because it could not be read."""
    if not path.is_file():
        raise InventoryError(f"inventory file not found: {path}; pass --inventory an existing"
                             " TOML or YAML file")
    try:
        if path.suffix in (".yaml", ".yml"):
            return read_yaml(path, "inventory file") or {}
        return read_toml(path, "inventory file")
    except FileFormatError as e:
        raise InventoryError(str(e)) from None


def _check_geometry_models(tables: Any, path: Path) -> None:
    """The models of the inventory's own geometries ([geometry.NAME] ``models``), each one a
    run can name (the rest of a geometry is read with --geometry)."""
    for name, table in (tables.items() if isinstance(tables, dict) else ()):
        try:
            check_lab_models(name, table, str(path))
        except GeometryError as e:
            raise InventoryError(str(e)) from None


# Variables the harness sets for every engine, whatever its kind (the kinds declare their own):
# an inventory env setting one is refused, naming it and why.
HARNESS_ENV = (
    ("HIL_DEVICE_ID", "the lease sets it to the leased device's id"),
    ("HIL_DEVICE_CARDS", "a group lease sets it to the group's devices"),
    ("HIL_ENGINE_AUTHKEY", "the engine host sets each engine's connection key"),
    ("HIL_FORKSERVER_AUTHKEY", "the fork server sets its connection key"),
    ("HIL_FAULT_STATE_DIR", "the engine pool gives each pytest process its own folder"),
    ("HIL_ALLOW_EXTERNAL_FAULTS", "only --allow-external-faults allows external faults"),
)


def owned_env(dk: DeviceKind) -> dict[str, str]:
    """{variable: why} an inventory env of kind ``dk`` must not set."""
    return {**dict(HARNESS_ENV), **dict(dk.owned_env)}


def _address(e: dict[str, Any], env: dict[str, str], dk: DeviceKind,
             where: str) -> tuple[str, str] | None:
    """The device's address (``address``, else its kind's address variable in ``env``) and
    how the entry names it, checked against its kind's format; the two must name one device."""
    named = [(f"address {v!r}", v) for v in [e.get("address")] if v is not None]
    if dk.address_env and dk.address_env in env:
        named.append((f"env {dk.address_env} {env[dk.address_env]!r}", env[dk.address_env]))
    for what, value in named:
        if problem := dk.address_problem(value):
            raise InventoryError(
                f"{where}: {what} {problem}; write the {dk.label} device's address as"
                " discovery lists it (`hil devices`)")
    if len(named) == 2 and len({dk.canonical_address(v) for _, v in named}) == 2:
        raise InventoryError(f"{where}: {named[0][0]} and {named[1][0]} name different devices;"
                             " give the device's address once")
    return named[0] if named else None


def _kind_env(e: dict[str, Any], env: dict[str, str], dk: DeviceKind, where: str,
              allow_external_faults: bool) -> dict[str, str]:
    """The env a device's lease carries: its ``env`` (without variables the harness owns) and
    its kind's keys (``cores``, ``engine``), which must agree with it; checked by its kind."""
    try:
        check_fault_specs(env.get("HIL_FAULTS", ""), allow_external_faults)
    except ValueError as err:
        raise InventoryError(f"{where}: env HIL_FAULTS: {err}") from None
    owned = owned_env(dk)
    if stray := [k for k in env if k in owned]:
        raise InventoryError(f"{where}: env {stray[0]}={env[stray[0]]!r}: {owned[stray[0]]};"
                             f" remove {stray[0]} from the device's env")
    try:
        if dk.inventory_env is not None:
            own = dk.inventory_env(e, where)
            for k, v in own.items():
                if k in env and env[k] != v:
                    raise InventoryError(
                        f"{where}: env {k}={env[k]!r} disagrees with what the entry's"
                        f" {', '.join(dk.inventory_keys)} give ({v!r}); set it once")
            env = {**env, **own}
        if dk.check_env is not None:
            dk.check_env(env, where)
    except ConfigError as err:
        raise InventoryError(str(err)) from None
    return env


def device_group(group_id: str, members: list[InventoryDevice]) -> InventoryDevice:
    """The group of ``members`` (rank i on members[i]) as one leasable device: their kind,
    backend and common features, their env without each one's address variable (rank 0's;
    the kind sets every rank's from the members). Raises ValueError saying why they cannot
    form one group."""
    kinds = {(m.kind, m.backend) for m in members}
    if len(kinds) != 1:
        named = ", ".join(f"{m.id}: {m.kind} {m.backend or '-'}" for m in members)
        raise ValueError(f"group {group_id!r}: its devices are of different kinds or backends"
                         f" ({named})")
    kind, backend = kinds.pop()
    dk = targets.device_kinds()[kind]
    env: dict[str, str] = {}
    for m in members:
        for k, v in m.env:
            if k == dk.address_env or k.startswith(dk.group_env_prefixes):
                continue
            if k in env and env[k] != v:
                raise ValueError(f"group {group_id!r}: env {k} is {env[k]!r} on one device and"
                                 f" {v!r} on {m.id}; one engine runs on all of them: set it once")
            env[k] = v
    feature_sets = [set(m.features) for m in members if m.features]
    features = tuple(sorted(set.intersection(*feature_sets))) if feature_sets else ()
    if feature_sets and not features:
        raise ValueError(f"group {group_id!r}: its devices have no mode (features) in common")
    return InventoryDevice(
        id=group_id, kind=kind, backend=backend, features=features,
        env=tuple(sorted(env.items())), members=tuple(members),
        detail=f"group of {len(members)}: {', '.join(m.id for m in members)}")


def _groups(entries: Any, devices: list[InventoryDevice], path: Path) -> list[InventoryDevice]:
    """The declared groups, each checked: a new id, known leased devices, all present."""
    by_id = {d.id: d for d in devices}
    groups: list[InventoryDevice] = []
    taken: set[str] = set(by_id)
    for n, e in enumerate(entries or [], 1):
        where = f"{path}: group #{n} ({e['id']!r})"
        if e["id"] in taken:
            raise InventoryError(f"{where}: id already names a device or a group; give the group"
                                 " an id of its own")
        taken.add(e["id"])
        unknown = [i for i in e["devices"] if i not in by_id]
        if unknown:
            raise InventoryError(f"{where}: device {unknown[0]!r} is not listed under [[device]]"
                                 f" (listed: {', '.join(by_id)})")
        members = [by_id[i] for i in e["devices"]]
        if unleased := [m.id for m in members if not m.leased]:
            raise InventoryError(f"{where}: {unleased[0]} is not a leased device ({by_id[unleased[0]].kind}):"
                                 " a group holds devices a lease gives one engine")
        if absent := [m for m in members if not m.present]:
            raise InventoryError(
                f"{where}: {absent[0].id} is not on this host ({absent[0].detail}): a"
                " tensor-parallel group's devices must all be on the host that runs its engine")
        try:
            groups.append(device_group(e["id"], members))
        except ValueError as err:
            raise InventoryError(f"{path}: {err}") from None
    return groups


def load_inventory(path: Path, root: Path = Path("/"), allow_external_faults: bool = False) -> Inventory:
    """Read and validate an inventory file; absent devices are kept, marked absent. Beyond its
    shape, what it means: one entry per id and per address, addresses in their kind's format,
    no variable the harness sets itself, core ranges its kind accepts, its geometries' models
    ones a run can name."""
    data = read_inventory_document(path)
    entries = data.get("device") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InventoryError(f"{path}: no devices: expected a list under 'device' ([[device]] in TOML)")
    try:
        check(data, inventory_schema(), str(path), item_names={"device": "id", "group": "id"})
    except SchemaError as e:
        raise InventoryError(str(e)) from None
    _check_geometry_models(data.get("geometry"), path)
    devices: list[InventoryDevice] = []
    seen: dict[str, int] = {}
    addresses: dict[tuple[str, str], tuple[int, str, str]] = {}
    for n, e in enumerate(entries, 1):
        where = f"{path}: device #{n}"
        if not isinstance(e, dict):
            raise InventoryError(f"{where}: expected a table of fields, got {type(e).__name__}")
        dev_id = e.get("id")
        if not isinstance(dev_id, str) or not dev_id:
            raise InventoryError(f"{where}: missing 'id'")
        where = f"{path}: device #{n} ({dev_id!r})"
        if dev_id in seen:
            raise InventoryError(f"{where}: id listed twice (also device #{seen[dev_id]});"
                                 " give each device its own id")
        seen[dev_id] = n
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
        raw_env = e.get("env", {})
        if not isinstance(raw_env, dict):
            raise InventoryError(f"{where}: env must be a table of NAME = \"value\"")
        env = {str(k): str(v) for k, v in raw_env.items()}
        if dk.inventory_env is None:
            own = {k: d.name for d in targets.device_kinds().values() for k in d.inventory_keys}
            if stray := [k for k in own if k in e]:
                owner = own[stray[0]]
                keys = " and ".join(k for k in own if own[k] == owner)
                raise InventoryError(f"{where}: {keys} are for kind {owner} only")
        env = _kind_env(e, env, dk, where, allow_external_faults)
        if (named := _address(e, env, dk, where)) is not None:
            key = (kind, dk.canonical_address(named[1]))
            if key in addresses:
                m, other, first = addresses[key]
                raise InventoryError(
                    f"{where}: {named[0]} is also the address of device #{m} ({other!r},"
                    f" {first!r}): two workers could lease one {dk.label} device at once; list"
                    " each device once")
            addresses[key] = (n, dev_id, named[1])
        present, detail = _present(kind, e.get("address"), root)
        devices.append(InventoryDevice(
            id=dev_id, kind=kind, backend=backend or dk.default_backend,
            address=e.get("address"), features=features, health=health,
            env=tuple(sorted(env.items())),
            present=present, detail=detail,
        ))
    return Inventory(devices=devices, source=str(path),
                     groups=_groups(data.get("group"), devices, path))


def discover_inventory(root: Path = Path("/")) -> Inventory:
    """The inventory discovery finds: every device kind's devices, and the CPU."""
    devices: list[InventoryDevice] = []
    for dk in targets.device_kinds().values():
        if dk.discover is not None and dk.to_inventory is not None:
            devices.extend(dk.to_inventory(dk.discover(root)))
    devices.append(InventoryDevice(id="cpu", kind="cpu", detail="this host's CPU"))
    return Inventory(devices=devices, source="discovery")
