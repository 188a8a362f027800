"""ReferenceCache: reference outputs on disk as JSON, keyed by content hash.

The key covers everything an output depends on (model content hash, prompt
token ids, sampling parameters, reference stack versions), so a change to any
of them is a miss and the output is recomputed. Entries are written to a
temporary file and renamed into place, and computed under a per-key file lock,
so concurrent xdist workers neither read a partial file nor compute twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock


def cache_key(fields: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``fields``."""
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


class ReferenceCache:
    """A folder of ``<key[:2]>/<key>.json`` entries with hit and miss counters."""

    def __init__(self, root: Path, enabled: bool = True) -> None:
        self.root = root
        self.enabled = enabled
        self.hits = 0
        self.misses = 0

    def path_for(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            with open(path, encoding="utf-8") as f:
                entry = json.load(f)
            return entry["value"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError):
            # A damaged entry is a miss, and is overwritten below.
            return None

    def get_or_compute(
        self, fields: dict[str, Any], compute: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        """The cached value for ``fields``, computing and storing it on a miss."""
        if not self.enabled:
            self.misses += 1
            return compute()
        key = cache_key(fields)
        path = self.path_for(key)
        value = self._read(path)
        if value is not None:
            self.hits += 1
            return value
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            value = self._read(path)  # another worker may have finished first
            if value is not None:
                self.hits += 1
                return value
            self.misses += 1
            value = compute()
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"key_fields": fields, "value": value}, f)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        return value
