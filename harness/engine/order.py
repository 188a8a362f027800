"""Test order by engine configuration, learned from earlier runs.

Which engine configuration a test starts is known only when it runs (the suite builds it from its
scenario). Each run records, per test, the configuration of its first engine call (without the
device, so the record holds on any card) in ``<cache dir>/engine-order.json``; the next run sorts
tests within a target variant and model by that record, so a card starts each configuration once.
A fresh host gets the record from a plan-only pass (``--hil-plan``: each test records its
configuration and skips before any engine starts).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

RECORD = "engine-order.json"


def config_id(cfg: Any) -> str:
    """A configuration's identity on any device: its key without the device and card env."""
    return str(cfg.with_(device=None, extra_env=()).key)


def load_record(cache_dir: Path) -> dict[str, str]:
    try:
        data = json.loads((cache_dir / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_record(cache_dir: Path, tests: dict[str, str]) -> None:
    """Merge ``tests`` (node id -> config id) into the record; concurrent workers take turns."""
    if not tests:
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_dir / f"{RECORD}.lock")):
        record = load_record(cache_dir)
        record.update(tests)
        tmp = cache_dir / f"{RECORD}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
        os.replace(tmp, cache_dir / RECORD)


def order_tests_by_engine_config(items: list[Any], cache_dir: Path,
                                 group_key: Callable[[Any], Any]) -> None:
    """Sort ``items`` in place: by ``group_key`` (variant, model), then by recorded configuration
    (configurations in sorted order), unknown tests last in their group; otherwise stable."""
    record = load_record(cache_dir)
    if not record:
        return
    rank = {c: i for i, c in enumerate(sorted(set(record.values())))}
    unknown = len(rank)
    items.sort(key=lambda it: (group_key(it), rank.get(record.get(it.nodeid, ""), unknown)))
