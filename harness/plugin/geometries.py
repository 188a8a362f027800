"""The geometry dimension of a run: ``--geometry`` checked at start, tests that take a
``geometry`` parametrized over the selected ones, the others kept where ``small`` is selected.

A test asks for the dimension by taking the ``geometry`` fixture; its id then ends with the
geometry's name, and every test records the geometry it ran in (a ``geometry`` property: the
report's matrix). A test that does not take one runs in its own small shapes, which the
``small`` geometry stands for: it is deselected when ``small`` is not selected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.models import MODEL_SPECS
from harness.geometry.catalog import (
    DEFAULT_GEOMETRY,
    Geometry,
    GeometryError,
    add_lab_geometries,
    load_geometries,
    select_geometries,
)
from harness.geometry.fit import fit_problem
from harness.lab.inventory import InventoryError, read_inventory_document
from harness.plugin.options import option_value
from harness.targets import registry_geometry

_SELECTED = pytest.StashKey[list[Geometry]]()
FIXTURE = "geometry"


def model_config(model: str) -> dict[str, Any] | None:
    """The HF config of ``model`` (a tiny model's spec, or a local folder's config.json)."""
    if model in MODEL_SPECS:
        return MODEL_SPECS[model].config_kwargs()
    path = Path(model) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the model check refuses such a folder, naming it


def known_geometries(config: pytest.Config) -> dict[str, Geometry]:
    """The shipped geometries and the inventory's own (``[geometry.NAME]``)."""
    known = load_geometries()
    inventory = option_value(config, "--inventory")
    if not inventory:
        return known
    # A file that cannot be read is refused here as the inventory check would (its TOML or
    # YAML error, its line), never as "unknown geometry" for the geometry it could not give.
    path = Path(str(inventory))
    data = read_inventory_document(path)
    tables = data.get("geometry") if isinstance(data, dict) else None
    if not isinstance(tables, dict):
        return known
    return add_lab_geometries(known, tables, str(path), resolve=registry_geometry)


def check_geometries(config: pytest.Config, models: list[str]) -> None:
    """Read the geometries, refuse an unknown name (exit 4, naming the known ones) and a
    geometry this machine cannot hold for one of ``models`` (saying what it would need)."""
    try:
        selected = select_geometries(str(option_value(config, "--geometry") or ""),
                                     known_geometries(config))
    except InventoryError as e:  # as the inventory check says it: the file, the line
        raise pytest.UsageError(str(e)) from None
    except GeometryError as e:
        raise pytest.UsageError(f"--geometry: {e}") from None
    for g in selected:
        for m in models:
            if g.models and m not in g.models:
                continue
            cfg = model_config(m)
            problem = fit_problem(g, m, cfg) if cfg is not None else None
            if problem:
                raise pytest.UsageError(f"--geometry: {problem}")
    config.stash[_SELECTED] = selected


def selected(config: pytest.Config) -> list[Geometry]:
    """The run's geometries (``check_geometries`` has read them)."""
    if _SELECTED not in config.stash:
        config.stash[_SELECTED] = select_geometries(
            str(option_value(config, "--geometry") or ""), known_geometries(config))
    return config.stash[_SELECTED]


def small_selected(config: pytest.Config) -> bool:
    return any(g.name == DEFAULT_GEOMETRY for g in selected(config))


def parametrize(metafunc: pytest.Metafunc) -> None:
    """A test taking ``geometry`` runs once per selected geometry, its id naming it."""
    if FIXTURE in metafunc.fixturenames:
        geometries = selected(metafunc.config)
        metafunc.parametrize(FIXTURE, geometries, ids=[g.name for g in geometries],
                             indirect=True)


def keep_selected(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without ``small`` selected, the tests that keep their own small shapes are deselected:
    a run of ``--geometry tight`` runs the tests that take a geometry, in ``tight``."""
    if small_selected(config):
        return
    dropped = [i for i in items if FIXTURE not in getattr(i, "fixturenames", ())]
    if dropped:
        kept = [i for i in items if FIXTURE in getattr(i, "fixturenames", ())]
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def record(item: pytest.Item) -> None:
    """The geometry a test ran in, as its ``geometry`` property (small for those that keep
    their own small shapes)."""
    callspec = getattr(item, "callspec", None)
    g = callspec.params.get(FIXTURE) if callspec is not None else None
    item.user_properties.append((FIXTURE, g.name if isinstance(g, Geometry) else DEFAULT_GEOMETRY))
