"""Test order by engine configuration, learned from earlier runs.

Which engine configuration a test starts is known only when it runs (the suite builds it from its
scenario). Each run records, per test, the configuration of its first engine call (without the
device, so the record holds on any card) in ``<cache dir>/engine-order.json``; the next run sorts
tests within a target variant and model by that record, so a card starts each configuration once.
A fresh host gets the record from a plan-only pass (``--hil-plan``: each test records its
configuration and skips before any engine starts).

A record that cannot be read (not JSON, not {node id: configuration id}) is named in a warning,
ignored (the tests keep their order) and rewritten by the next save: never an error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from harness.core.config import EngineConfig

RECORD = "engine-order.json"


def config_id(cfg: Any) -> str:
    """A configuration's identity on any device: its key without the device and card env."""
    return str(cfg.with_(device=None, extra_env=()).key)


def read_record(cache_dir: Path) -> tuple[dict[str, str], str | None]:
    """The record, and why it was ignored when it is there but unreadable (None: fine or absent)."""
    path = cache_dir / RECORD
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, None
    except (OSError, UnicodeDecodeError) as e:
        return {}, f"{path}: cannot read it ({e}); ignored"
    try:
        data = json.loads(text)
    except ValueError as e:
        return {}, f"{path}: not valid JSON ({e}); ignored, and rewritten by this run's tests"
    if not isinstance(data, dict):
        return {}, (f"{path}: expected {{node id: configuration id}}, got"
                    f" {type(data).__name__}; ignored, and rewritten by this run's tests")
    if bad := next((k for k, v in data.items() if not isinstance(v, str)), None):
        return {}, (f"{path}: test {bad!r} has configuration {data[bad]!r}, expected a string;"
                    " ignored, and rewritten by this run's tests")
    return data, None


def load_record(cache_dir: Path) -> dict[str, str]:
    """The record ({} when absent or unreadable)."""
    return read_record(cache_dir)[0]


def save_record(cache_dir: Path, tests: dict[str, str]) -> None:
    """Merge ``tests`` (node id -> config id) into the record; concurrent workers take turns."""
    _merge(cache_dir, RECORD, tests, load_record)


def _merge(cache_dir: Path, name: str, entries: dict[str, Any],
           load: Callable[[Path], dict[str, Any]]) -> None:
    """Merge ``entries`` into the JSON object ``cache_dir/name`` (as ``load`` reads it)."""
    if not entries:
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_dir / f"{name}.lock")):
        record = load(cache_dir)
        record.update(entries)
        tmp = cache_dir / f"{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
        try:
            os.replace(tmp, cache_dir / name)
        except OSError:  # a folder in its place: the order is a hint, never an error
            tmp.unlink(missing_ok=True)


# The configurations themselves (config id -> EngineConfig.to_dict(), without the device), so
# that a run knows before its tests which engines they will start (harness.engine.prestart).
CONFIGS = "engine-configs.json"


def load_configs(cache_dir: Path) -> dict[str, Any]:
    """The recorded configurations ({} when absent or unreadable: a hint, never an error)."""
    try:
        data = json.loads((cache_dir / CONFIGS).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_configs(cache_dir: Path, configs: dict[str, dict[str, Any]]) -> None:
    """Merge ``configs`` (config id -> configuration) into the record of configurations."""
    _merge(cache_dir, CONFIGS, configs, load_configs)


def config_entry(cfg: EngineConfig) -> dict[str, Any]:
    """The record's entry of ``cfg`` (under ``config_id``): its configuration without the
    device."""
    return cfg.with_(device=None).to_dict()


def planned_configs(cache_dir: Path, nodeids: list[str], stack: str) -> list[EngineConfig]:
    """The configurations earlier runs recorded for ``nodeids``' first engines, on ``stack``
    (a test has one id on every stack: the record holds the last run's), in their order, each
    once; a test or entry the records do not hold, or that ``stack`` does not accept, is left
    out."""
    record, configs = load_record(cache_dir), load_configs(cache_dir)
    planned: dict[str, EngineConfig] = {}
    for nodeid in nodeids:
        cid = record.get(nodeid)
        if cid is None or not isinstance(configs.get(cid), dict):
            continue
        try:
            cfg = EngineConfig.from_dict(configs[cid]).with_(stack=stack)
        except (KeyError, TypeError, ValueError):  # an older record, a kind that refuses it
            continue
        planned.setdefault(cfg.key, cfg)
    return list(planned.values())


def order_tests_by_engine_config(items: list[Any], cache_dir: Path,
                                 group_key: Callable[[Any], Any]) -> str | None:
    """Sort ``items`` in place: by ``group_key`` (variant, model), then by recorded configuration
    (configurations in sorted order), unknown tests last in their group; otherwise stable.
    Returns why the record was ignored, if it was."""
    record, problem = read_record(cache_dir)
    if not record:
        return problem
    rank = {c: i for i, c in enumerate(sorted(set(record.values())))}
    unknown = len(rank)
    items.sort(key=lambda it: (group_key(it), rank.get(record.get(it.nodeid, ""), unknown)))
    return None
