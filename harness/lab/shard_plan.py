"""Balanced shards: engine groups are dealt to N shards by their measured duration.

Every host of one nightly computes the same plan from the same inputs (the collected
tests and one durations file), so the N shards stay disjoint and together complete:

- the unit that stays on one shard is the engine group of ``shard_key`` (each engine
  starts once per host);
- a group weighs the sum of its tests' seconds in the durations file (``durations.json``
  written by ``hil report`` from the previous complete run); a test missing from the file
  weighs the median of the known tests. Without a durations file (or with one that knows
  none of the collected tests) every test weighs 1: the fallback balances test counts;
- groups are dealt heaviest first, each to the lightest shard so far (ties: the lower
  shard number, then the group name), which is deterministic and within the heaviest
  group of the optimum.

The plan's fingerprint (``by time sha256:...`` or ``by count``) is recorded with the
shard in environment.properties, so a merge names shards that planned differently.

A durations file holds finite, non-negative seconds per test; anything else makes it
unreadable: refused when --shard-durations names it, ignored with a warning (the plan is
by count) when it is the default REPORTS_DIR/durations.json.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DURATIONS_FILE = "durations.json"


class DurationsError(ValueError):
    """A durations file that cannot be read."""


def junit_address(nodeid: str) -> tuple[str, str]:
    """(classname, name) that pytest's junit-xml writes for ``nodeid``."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def load_durations(path: Path) -> dict[str, float]:
    """Seconds per test from ``durations.json`` ({nodeid: seconds}) or a junit xml file
    (keyed by ``classname::name``, see ``junit_address``)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DurationsError(f"{path}: cannot read the durations file ({e})") from None
    if path.suffix == ".xml":
        try:
            root = ET.fromstring(text)
        except ET.ParseError as e:
            raise DurationsError(f"{path}: not a junit xml file ({e})") from None
        out: dict[str, float] = {}
        for case in root.iter("testcase"):
            key = f"{case.get('classname', '')}::{case.get('name', '')}"
            out[key] = out.get(key, 0.0) + _seconds(path, key, _number(case.get("time") or "0"))
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DurationsError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); delete it"
                             " or make a new one with `hil report`") from None
    tests = data.get("tests") if isinstance(data, dict) else None
    if not isinstance(tests, dict):
        raise DurationsError(f"{path}: expected {{\"tests\": {{nodeid: seconds}}}}; delete it or"
                             " make a new one with `hil report`")
    return {str(k): _seconds(path, str(k), v) for k, v in tests.items()}


def _number(text: str) -> float | str:
    """A junit ``time`` attribute as a number (the text itself when it is none)."""
    try:
        return float(text)
    except ValueError:
        return text


def _seconds(path: Path, test: str, value: Any) -> float:
    """A test's duration: a finite number of seconds, at least 0 (DurationsError names it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise DurationsError(f"{path}: test {test!r} has duration {value!r}, expected a finite"
                             " number of seconds, at least 0; delete the file or make a new one"
                             " with `hil report`")
    return float(value)


def write_durations(path: Path, durations: Mapping[str, float], source: str) -> Path:
    """Write ``{"source": ..., "tests": {nodeid: seconds}}`` (sorted, so it diffs well)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"source": source, "tests": {k: round(v, 3) for k, v in sorted(durations.items())}}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def _seconds_of(nodeid: str, durations: Mapping[str, float]) -> float | None:
    if nodeid in durations:
        return durations[nodeid]
    classname, name = junit_address(nodeid)
    return durations.get(f"{classname}::{name}")


@dataclass
class ShardPlan:
    """Which shard each engine group goes to, and what each shard weighs."""

    n: int
    by: str  # "time" or "count"
    assignment: dict[str, int] = field(default_factory=dict)  # group -> shard (1-based)
    loads: list[float] = field(default_factory=list)  # per shard: seconds (or tests)
    tests: list[int] = field(default_factory=list)  # per shard: test count
    unknown: int = 0  # tests weighed by the median (no measured duration)
    fingerprint: str = ""

    def shard_of(self, group: str) -> int:
        return self.assignment[group]

    def describe(self) -> str:
        parts = [f"{i + 1}/{self.n}: {self.tests[i]} tests"
                 + (f", {self.loads[i]:.0f} s" if self.by == "time" else "")
                 for i in range(self.n)]
        extra = f"; {self.unknown} test(s) without a measured duration" if self.unknown else ""
        return f"shards by {self.by}: " + ", ".join(parts) + extra


def plan_shards(groups: Mapping[str, list[str]], n: int,
                durations: Mapping[str, float] | None = None) -> ShardPlan:
    """Deal engine groups ({group: [nodeid, ...]}) to ``n`` shards; see the module doc."""
    durations = durations or {}
    known = {nid: s for ids in groups.values() for nid in ids
             if (s := _seconds_of(nid, durations)) is not None}
    by = "time" if known else "count"
    fallback = statistics.median(known.values()) if known else 1.0
    weights: dict[str, float] = {}
    unknown = 0
    for group, ids in groups.items():
        w = 0.0
        for nid in ids:
            if nid in known:
                w += known[nid]
            else:
                w += fallback
                unknown += by == "time"
        weights[group] = w
    plan = ShardPlan(n=n, by=by, loads=[0.0] * n, tests=[0] * n, unknown=unknown)
    for group in sorted(weights, key=lambda g: (-weights[g], g)):
        i = min(range(n), key=lambda k: (plan.loads[k], k))
        plan.assignment[group] = i + 1
        plan.loads[i] += weights[group]
        plan.tests[i] += len(groups[group])
    if by == "time":
        blob = json.dumps(sorted(plan.assignment.items())).encode()
        plan.fingerprint = f"by time sha256:{hashlib.sha256(blob).hexdigest()[:12]}"
    else:
        plan.fingerprint = "by count"
    return plan


def group_items(items: Iterable[Any], key_of: Any) -> dict[str, list[str]]:
    """{engine group: [nodeid, ...]} of pytest items, in collection order."""
    groups: dict[str, list[str]] = {}
    for item in items:
        groups.setdefault(key_of(item), []).append(item.nodeid)
    return groups


def durations_for(option: str, reports_dir: Path,
                  problems: list[str] | None = None) -> tuple[dict[str, float], str]:
    """The durations to plan with and where they came from: ``option`` (a file) when given
    and present, else REPORTS_DIR/durations.json when it exists, else none (plan by count).
    A given file that exists but cannot be read raises DurationsError; the default one that
    cannot be read is ignored (its problem added to ``problems``): the plan is by count."""
    if option and not Path(option).exists():
        # The first nightly of a lab has none yet; every shard sees the same absence.
        return {}, f"{option} (not there yet)"
    if option:
        return load_durations(Path(option)), option
    default = Path(reports_dir) / DURATIONS_FILE
    if default.is_file():
        try:
            return load_durations(default), str(default)
        except DurationsError as e:
            if problems is not None:
                problems.append(f"{e}; ignored: the shards are planned by test count")
            return {}, f"{default} (unreadable, ignored)"
    return {}, "none"


def update_durations(path: Path, measured: Mapping[str, float], source: str) -> Path:
    """Write ``measured`` into the durations file at ``path``, keeping the tests it already
    holds that this run did not measure (a ``-k`` run must not shrink the next nightly's
    plan to its few tests). An unreadable file is replaced."""
    try:
        known = load_durations(Path(path)) if Path(path).is_file() else {}
    except DurationsError:
        known = {}
    # Whole or not at all: a full disk keeps the previous file.
    tmp = Path(path).with_name(f".{Path(path).name}.{os.getpid()}.tmp")
    try:
        write_durations(tmp, {**known, **measured}, source)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return Path(path)
