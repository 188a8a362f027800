"""Quarantine: known failures that run and report as known instead of failing the night.

The list is a checked-in TOML file, one entry per known failure:

    [[known]]
    test = "suites/test_token_equality.py::test_greedy_tokens_equal_reference[*-spyre-sendnn-cp-long-prompt]"
    reason = "sendnn cp diverges on 190-token prompts"
    issue = "https://tracker.example/ISSUE-123"

``test`` is a node id, where ``*`` and ``?`` are wildcards. A quarantined test runs as a
non-strict xfail: a failure shows as known (XFAIL, with reason and issue); a
pass (XPASS) is reported at the end with a warning to lift the quarantine.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.lab.schemas import QUARANTINE_SCHEMA, check, read_utf8


@dataclass(frozen=True)
class KnownFailure:
    test: str
    reason: str
    issue: str

    def matches(self, nodeid: str) -> bool:
        # Node ids hold brackets, so only * and ? are wildcards here (unlike fnmatch).
        pattern = re.escape(self.test).replace(r"\*", ".*").replace(r"\?", ".")
        return re.fullmatch(pattern, nodeid) is not None


def load_quarantine(path: Path, required: bool = False) -> list[KnownFailure]:
    """The entries of a quarantine file; [] when it does not exist and is not ``required``
    (a path the user named must exist). ValueError names the file, entry and fix."""
    if not path.exists():
        if required:
            raise ValueError(f"--quarantine: file not found: {path}; pass an existing TOML file"
                             " of [[known]] entries (or /dev/null for none), or leave the option out")
        return []
    if path.is_dir():
        raise ValueError(f"--quarantine: {path} is a folder; pass a TOML file of [[known]] entries")
    text = read_utf8(path, "quarantine file")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from None
    check(data, QUARANTINE_SCHEMA, str(path), item_names={"known": "test"})
    return [KnownFailure(e["test"], e["reason"], e["issue"]) for e in data.get("known", [])]


def apply_quarantine(items: list[Any], known: list[KnownFailure]) -> None:
    for item in items:
        for k in known:
            if k.matches(item.nodeid):
                item.add_marker(pytest.mark.xfail(
                    reason=f"quarantined: {k.reason} ({k.issue})", strict=False))
                item.user_properties.append(("quarantine", k.issue))
                break


def quarantined_passes(terminalreporter: Any) -> list[str]:
    """Node ids of quarantined tests that passed (XPASS) in this run."""
    return [r.nodeid for r in terminalreporter.stats.get("xpassed", [])
            if "quarantined:" in str(getattr(r, "wasxfail", ""))]
