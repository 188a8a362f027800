"""Named engine geometries, declared once in ``fixtures/geometries.toml``.

A geometry fixes the shape an engine serves in: context (``max_model_len``), batch
(``max_num_seqs``), prefill chunk, KV pool (a full batch, a number of full-length requests, a
block count, or the device's own), batch TKV limit, prefix caching and tensor parallel size.
Every key and value is checked when the file is read: a bad one is a ``GeometryError`` naming
the geometry, the key and what is accepted. How a geometry becomes engine settings is the
target's kind's (``KindHooks.geometry_overrides``); this module knows no kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.config import ConfigError
from harness.core.strict_files import FileFormatError, read_toml
from harness.scenario.prompts import EngineLimits

GEOMETRIES_FILE = Path(__file__).resolve().parents[2] / "fixtures" / "geometries.toml"
DEFAULT_GEOMETRY = "small"

FULL_BATCH_POOL = "full-batch"
DEVICE_POOL = "device"
POOLS = (FULL_BATCH_POOL, DEVICE_POOL)
POOL_KEYS = ("pool", "pool_requests", "num_blocks")

# key -> (type, required, what it is): the one declaration the reader checks against.
KEYS: dict[str, tuple[type, bool, str]] = {
    "description": (str, True, "what the geometry is for"),
    "max_model_len": (int, True, "context length in tokens"),
    "max_num_seqs": (int, True, "requests served at once"),
    "chunk_size": (int, True, "tokens per prefill chunk"),
    "pool": (str, False, f"the KV pool: {' or '.join(map(repr, POOLS))}"),
    "pool_requests": (int, False, "a pool for this many full-length requests plus the pad block"),
    "num_blocks": (int, False, "this many KV blocks, the pad block included"),
    "batch_tkv_limit": (int, False, "batch size x TKV the batch may reach"),
    "prefix_caching": (bool, False, "prefix caching on or off (unset: the variant decides)"),
    "tensor_parallel_size": (int, False, "ranks per engine"),
}
# A lab's own geometry (its inventory's [geometry.NAME]) may say which models it is for, and
# take its shape from a device's registry entry (``from_registry``: the entry's name; its
# values for the keys it sets, the geometry's own keys choosing among the entry's shapes).
LAB_KEYS = ("models", "from_registry")
# The keys a registry entry's shape gives (a geometry table may give them too, to choose).
ENTRY_KEYS = ("max_model_len", "max_num_seqs", "tensor_parallel_size", "batch_tkv_limit", "pool")


class GeometryError(ConfigError):
    """A geometry name, key or value the harness refuses (a usage error: exit 4)."""


@dataclass(frozen=True)
class Geometry:
    """One named engine geometry (see the module docstring and fixtures/geometries.toml)."""

    name: str
    description: str
    max_model_len: int
    max_num_seqs: int
    chunk_size: int
    pool: str | None = FULL_BATCH_POOL
    pool_requests: int | None = None
    num_blocks: int | None = None
    batch_tkv_limit: int | None = None
    prefix_caching: bool | None = None
    tensor_parallel_size: int = 1
    source: str = "fixtures/geometries.toml"
    models: tuple[str, ...] = ()  # a lab's geometry for these models only (() for every model)

    @property
    def full_batch_tokens(self) -> int:
        """Batch size x context: what a full batch of full-length requests reaches."""
        return self.max_model_len * self.max_num_seqs

    @property
    def pool_holds_batch(self) -> bool | None:
        """Whether the pool holds a full batch of full-length requests: True for a full-batch
        pool, False for one of fewer requests, None where the block count decides (a device
        pool, a given block count: judged at run time from what the engine holds)."""
        if self.pool == FULL_BATCH_POOL:
            return True
        if self.pool_requests is not None:
            return self.pool_requests >= self.max_num_seqs
        return None

    @property
    def tkv_binds(self) -> bool:
        """Whether the batch TKV limit is below what a full batch reaches."""
        return self.batch_tkv_limit is not None and self.batch_tkv_limit < self.full_batch_tokens

    def limits(self) -> EngineLimits:
        """The engine limits a scenario in this geometry is written for."""
        return EngineLimits(self.max_model_len, self.max_num_seqs, cp_chunk=self.chunk_size)

    def describe(self) -> str:
        """One line naming every value: the report's and the terminal's."""
        pool = (self.pool if self.pool else f"{self.pool_requests} requests"
                if self.pool_requests is not None else f"{self.num_blocks} blocks")
        parts = [f"context {self.max_model_len}", f"batch {self.max_num_seqs}",
                 f"chunk {self.chunk_size}", f"pool {pool}"]
        if self.batch_tkv_limit is not None:
            parts.append(f"batch TKV limit {self.batch_tkv_limit}")
        if self.prefix_caching is not None:
            parts.append(f"prefix caching {'on' if self.prefix_caching else 'off'}")
        if self.tensor_parallel_size != 1:
            parts.append(f"TP {self.tensor_parallel_size}")
        return f"{self.name}: " + ", ".join(parts)


def _type_name(t: type) -> str:
    return {int: "an integer", str: "text", bool: "true or false"}[t]


def parse_geometry(name: str, table: Mapping[str, Any], source: str,
                   lab: bool = False) -> Geometry:
    """The geometry ``name`` declared by ``table`` (read from ``source``; ``lab``: an
    inventory's, which may name its models); every key and value checked, a bad one refused
    naming the geometry, the key and what is accepted."""
    where = f"{source}: geometry {name!r}"
    extra_keys = LAB_KEYS if lab else ()
    if not isinstance(table, Mapping):
        raise GeometryError(f"{where} is not a table of keys")
    unknown = sorted(set(table) - set(KEYS) - set(extra_keys))
    if unknown:
        raise GeometryError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; known:"
                            f" {', '.join([*KEYS, *extra_keys])}")
    values: dict[str, Any] = {}
    for key, (t, required, what) in KEYS.items():
        if key not in table:
            if required:
                raise GeometryError(f"{where}: {key} ({what}) is required")
            continue
        value = table[key]
        # bool is an int to Python: an integer key refuses true/false, as a person would.
        if not isinstance(value, t) or (t is int and isinstance(value, bool)):
            raise GeometryError(f"{where}: {key} = {value!r} must be {_type_name(t)} ({what})")
        if t is int and value <= 0:
            raise GeometryError(f"{where}: {key} = {value} must be positive ({what})")
        values[key] = value
    pools = [k for k in POOL_KEYS if k in values]
    if len(pools) > 1:
        raise GeometryError(f"{where}: give one of {', '.join(POOL_KEYS)}, not {' and '.join(pools)}")
    if not pools:
        values["pool"] = FULL_BATCH_POOL
    elif pools != ["pool"]:
        values["pool"] = None
    if values["pool"] is not None and values["pool"] not in POOLS:
        raise GeometryError(f"{where}: pool = {values['pool']!r}; known: {', '.join(POOLS)}"
                            " (or give pool_requests or num_blocks)")
    if values.get("pool_requests") is not None and values["pool_requests"] > values["max_num_seqs"]:
        raise GeometryError(f"{where}: pool_requests = {values['pool_requests']} is more than"
                            f" max_num_seqs = {values['max_num_seqs']}: use pool = \"full-batch\"")
    if values["chunk_size"] > values["max_model_len"]:
        raise GeometryError(f"{where}: chunk_size = {values['chunk_size']} is longer than"
                            f" max_model_len = {values['max_model_len']}")
    models = check_lab_models(name, table, source) if lab else ()
    return Geometry(name=name, source=source, models=models, **values)


def model_problem(model: str) -> str | None:
    """Why ``model`` is no model a run can name (``--model``: a tiny model's name, or a local
    folder holding its config.json), or None."""
    from fixtures.models import MODEL_SPECS  # deferred: the geometries are read without it

    if model in MODEL_SPECS:
        return None
    folder = Path(model).expanduser()
    known = f"a tiny model ({', '.join(MODEL_SPECS)}) or a model folder on this host"
    if not folder.is_dir():
        return f"is neither a tiny model nor a folder on this host; name {known}"
    if not (folder / "config.json").is_file():
        return f"is a folder without config.json; name {known}, holding its config.json"
    return None


def check_lab_models(name: str, table: Mapping[str, Any], source: str) -> tuple[str, ...]:
    """The models a lab geometry's table names (``models``; () for every model), each one a
    run can name: a geometry for a model no run has would skip every test, a green run that
    ran nothing. Raises GeometryError naming the geometry and the model."""
    where = f"{source}: geometry {name!r}"
    if not isinstance(table, Mapping) or "models" not in table:
        return ()
    models = table["models"]
    if not isinstance(models, list) or not models or not all(
            isinstance(m, str) and m for m in models):
        raise GeometryError(f"{where}: models = {models!r} must be a list of model names or"
                            " folders (leave it out for every model)")
    for m in models:
        if problem := model_problem(m):
            raise GeometryError(f"{where}: models: {m!r} {problem} (a geometry for a model no"
                                " run can name would skip every test of it)")
    return tuple(models)


def load_geometries(path: Path = GEOMETRIES_FILE) -> dict[str, Geometry]:
    """Every geometry ``path`` declares, by name, in the file's order."""
    source = "fixtures/geometries.toml" if path == GEOMETRIES_FILE else str(path)
    try:  # strictly: a key twice, a byte-order mark, JSON for TOML refused naming the line
        tables = read_toml(path, "geometries file", source)
    except FileFormatError as e:
        raise GeometryError(str(e)) from None
    return {name: parse_geometry(name, table, source) for name, table in tables.items()}


# Resolves ``from_registry``: (entry name, the table's choosing keys) -> the entry's values
# for ENTRY_KEYS; raises ConfigError naming what is missing or ambiguous.
EntryResolver = Callable[[str, Mapping[str, Any]], Mapping[str, Any]]


def _from_registry(name: str, table: Mapping[str, Any], source: str,
                   resolve: EntryResolver | None) -> dict[str, Any]:
    """``table`` with the shape of its registry entry filled in (``from_registry``)."""
    entry = table["from_registry"]
    where = f"{source}: geometry {name!r}"
    if not isinstance(entry, str) or not entry:
        raise GeometryError(f"{where}: from_registry = {entry!r} must be a registry entry's name")
    if resolve is None:
        raise GeometryError(f"{where}: from_registry: no installed kind reads a model registry")
    given = [k for k in (*POOL_KEYS, "batch_tkv_limit") if k in table]
    if given:
        raise GeometryError(f"{where}: {', '.join(given)} with from_registry: the entry gives the"
                            " pool (the device's, sized by the entry) and the batch TKV limit;"
                            f" leave {' and '.join(given)} out")
    try:
        shape = dict(resolve(entry, {k: v for k, v in table.items() if k in ENTRY_KEYS}))
    except ConfigError as e:
        raise GeometryError(f"{where}: from_registry = {entry!r}: {e}") from None
    out = {k: v for k, v in table.items() if k != "from_registry"}
    out.update(shape)
    out.setdefault("description", f"the shape registry entry {entry} is served at")
    return out


def add_lab_geometries(known: Mapping[str, Geometry], tables: Mapping[str, Any],
                       source: str, resolve: EntryResolver | None = None) -> dict[str, Geometry]:
    """``known`` and a lab's own geometries (an inventory's ``geometry`` tables); a lab
    geometry may not take a shipped one's name; one with ``from_registry`` takes its shape
    from that registry entry (``resolve``)."""
    out = dict(known)
    for name, table in tables.items():
        if name in known:
            raise GeometryError(f"{source}: geometry {name!r} is a name the harness ships"
                                f" (fixtures/geometries.toml); give the lab's its own name")
        check_lab_models(name, table, source)  # before its registry entry is looked up
        if isinstance(table, Mapping) and "from_registry" in table:
            table = _from_registry(name, table, source, resolve)
        out[name] = parse_geometry(name, table, source, lab=True)
    return out


def select_geometries(spec: str, known: Mapping[str, Geometry]) -> list[Geometry]:
    """The geometries a ``--geometry`` value names (comma-separated, each once), in its order;
    an empty value is the default one."""
    names = [n.strip() for n in (spec or DEFAULT_GEOMETRY).split(",") if n.strip()]
    if not names:
        names = [DEFAULT_GEOMETRY]
    seen: set[str] = set()
    out: list[Geometry] = []
    for n in names:
        if n not in known:
            raise GeometryError(f"unknown geometry {n!r}; known: {', '.join(known)}")
        if n in seen:
            raise GeometryError(f"geometry {n!r} is named twice; name each once")
        seen.add(n)
        out.append(known[n])
    return out
