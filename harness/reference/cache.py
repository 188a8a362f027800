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
        self.bad: list[str] = []  # entries found damaged or not matching their key, recomputed

    def path_for(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def _read(self, path: Path, fields: dict[str, Any] | None = None,
              check: Callable[[dict[str, Any]], str | None] | None = None) -> dict[str, Any] | None:
        """The entry's value, or None when absent; an entry that is not JSON, was stored
        for other key fields, or whose value ``check`` refuses is recorded in ``bad``."""
        try:
            with open(path, encoding="utf-8") as f:
                entry = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            return self._bad(path, f"unreadable ({e.__class__.__name__})")
        if not isinstance(entry, dict) or not isinstance(entry.get("value"), dict):
            return self._bad(path, "not an object with a 'value' object")
        if fields is not None and entry.get("key_fields") != json.loads(json.dumps(fields)):
            return self._bad(path, "its key fields do not match its name")
        problem = check(entry["value"]) if check is not None else None
        if problem:
            return self._bad(path, problem)
        return entry["value"]

    def _bad(self, path: Path, why: str) -> None:
        note = f"{path}: {why}; recomputed"
        if note not in self.bad:
            self.bad.append(note)
        return None

    def get_or_compute(
        self, fields: dict[str, Any], compute: Callable[[], dict[str, Any]],
        check: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> dict[str, Any]:
        """The cached value for ``fields``, computing and storing it on a miss; an entry
        that fails verification (key fields, ``check`` of its value) is recomputed."""
        if not self.enabled:
            self.misses += 1
            return compute()
        key = cache_key(fields)
        path = self.path_for(key)
        value = self._read(path, fields, check)
        if value is not None:
            self.hits += 1
            return value
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            value = self._read(path, fields, check)  # another worker may have finished first
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
