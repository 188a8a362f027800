"""What one session did, for the end-of-run summary: timers and the session's record."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class Timers:
    """Wall time per named phase (the benchmark's split), summed over the session."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def get(self, name: str, default: float = 0.0) -> float:
        return self.seconds.get(name, default)

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Add the wall time of the block to ``name``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.seconds.items()}


@dataclass
class SessionStats:
    """One worker's record, written to reports/stats/<worker>.json for the summary."""

    engines: list[dict[str, Any]] = field(default_factory=list)
    reference_hits: int = 0
    reference_misses: int = 0
    reference_bad: list[str] = field(default_factory=list)  # bad cache entries recomputed
    near_ties: list[str] = field(default_factory=list)
    timers: dict[str, float] = field(default_factory=dict)
    exposure: dict[str, Any] = field(default_factory=dict)  # harness.checks.exposure tally
    agreement: dict[str, Any] = field(default_factory=dict)  # harness.checks.agreement tally
    leases: list[str] = field(default_factory=list)
    cards: list[dict[str, Any]] = field(default_factory=list)  # harness.engine.device_ledger events
    # Engines handed between tests: restarts of dirty ones, probes, what was found
    # (harness.engine.hygiene.HygieneStats).
    hygiene: dict[str, Any] = field(default_factory=dict)
    # Failed verdicts re-run under varied conditions (harness.core.triage.TriageResult dicts).
    triage: list[dict[str, Any]] = field(default_factory=list)
    # The calibrations reduced-precision traces were judged by: the model, then
    # harness.calibration.thresholds.Thresholds.to_dict().
    calibrations: list[dict[str, Any]] = field(default_factory=list)
    # What the run warned of its own files and its quarantine (an ignored engine-order
    # record, an entry that matches no test: harness.plugin.ordering), for summary.md.
    warnings: list[str] = field(default_factory=list)

    @property
    def engines_started(self) -> int:
        return len(self.engines)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape the terminal summary reads."""
        return {"engines_started": self.engines_started, **asdict(self)}


def stats_values(stats_dir: Path, key: str) -> list[Any]:
    """The value of ``key`` in each pytest worker's stats file (none if there are none)."""
    values = []
    for f in sorted(stats_dir.glob("*.json")) if stats_dir.is_dir() else []:
        try:
            values.append(json.loads(f.read_text()).get(key) or {})
        except (OSError, ValueError, AttributeError):
            continue
    return values
