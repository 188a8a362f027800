"""One engine per whole device: the ledger of engine starts and stops per leased device, what
breaks the rule in it, and its lines in the run summary.

An engine that holds its leased device whole (``VllmTarget.holds_device``: a Spyre card on
sendnn, a Neuron device) cannot share it with a second model, so the pool stops the device's
live engine before it starts another there and records every start and stop here. The workers
write their ledgers into their statistics (key ``cards``); the run summary merges them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.devices import CARDS_ENV


@dataclass
class DeviceLedger:
    """Engine starts and stops per device, with times: the run's record that a device held at
    most one live engine at any moment and started each configuration once for its tests (a
    dirty engine's replacement and a triage's fresh engines are recorded as such)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    _live: dict[str, str] = field(default_factory=dict)  # engine key -> device

    def started(self, cfg: Any, ok: bool = True, purpose: str | None = None) -> None:
        """A start of ``cfg`` on its device; ``purpose`` names a start that is not a test's
        (``triage``: a fresh engine of a failed test's configuration, harness.triage)."""
        event = {"event": "start" if ok else "refused", "device": cfg.device,
                 "config": cfg.label, "key": cfg.key, "time": time.time()}
        cards = dict(getattr(cfg, "extra_env", ())).get(CARDS_ENV)  # none: one device
        if cards:  # a group: the engine holds each of its devices
            event["cards"] = cards.split(",")
        if purpose:
            event["purpose"] = purpose
        self.events.append(event)
        if ok:
            self._live[cfg.key] = cfg.device

    def closed(self, key: str) -> None:
        device = self._live.pop(key, None)
        if device is not None:
            self.events.append({"event": "close", "device": device, "key": key, "time": time.time()})

    def mark_replacement(self, key: str) -> None:
        """The last start of ``key`` replaced a dirty engine of it (not a second configuration
        start: harness.engine.hygiene)."""
        for e in reversed(self.events):
            if e["key"] == key and e["event"] == "start":
                e["replacement"] = True
                return

    def live_on(self, device: str) -> list[str]:
        return [k for k, d in self._live.items() if d == device]

    def to_list(self) -> list[dict[str, Any]]:
        return list(self.events)


def ledger_problems(events: list[dict[str, Any]]) -> list[str]:
    """What breaks one-engine-per-device in a ledger's events (merged from every worker): two
    live engines on one device at a moment, or a configuration started twice on one device."""
    problems: list[str] = []
    live: dict[str, set[str]] = {}  # card -> live engine keys
    cards_of: dict[str, list[str]] = {}  # engine key -> the cards it holds
    starts: dict[tuple[str, str], int] = {}
    for e in sorted(events, key=lambda e: e["time"]):
        dev = e["device"]
        if e["event"] in ("start", "refused") and not (e.get("replacement") or e.get("purpose")):
            starts[(dev, e["key"])] = starts.get((dev, e["key"]), 0) + 1
        if e["event"] == "start":
            cards = cards_of[e["key"]] = list(e.get("cards") or [dev])
            for card in cards:
                held = live.setdefault(card, set())
                if held:
                    where = dev if card == dev else f"{dev} (card {card})"
                    problems.append(f"{where}: {e['config']} started while {sorted(held)} still live")
                held.add(e["key"])
        elif e["event"] == "close":
            for card in cards_of.get(e["key"], [dev]):
                live.get(card, set()).discard(e["key"])
    problems += [f"{dev}: configuration {key} started {n} times" for (dev, key), n in starts.items()
                 if n > 1]
    return problems


def ledger_summary_lines(events: list[dict[str, Any]]) -> list[str]:
    """Per device, the configurations it ran and their start times (for the run summary)."""
    lines = []
    for dev in sorted({e["device"] for e in events}):
        starts = [e for e in events if e["device"] == dev and e["event"] in ("start", "refused")]
        runs = ", ".join(
            f"{e['config']} [{e['key'].rsplit(':', 1)[-1]}] at"
            f" {time.strftime('%H:%M:%S', time.localtime(e['time']))}"
            + (" (refused)" if e["event"] == "refused" else "")
            + (" (replacing a dirty engine)" if e.get("replacement") else "")
            + (f" ({e['purpose']})" if e.get("purpose") else "")
            for e in sorted(starts, key=lambda e: e["time"]))
        lines.append(f"card {dev}: {len(starts)} configuration(s): {runs}")
    problems = ledger_problems(events)
    lines += [f"ONE-ENGINE-PER-CARD VIOLATION: {p}" for p in problems]
    return lines


def append_device_summary(stats_dir: Path, summary: Path) -> str:
    """Add a "Cards" section (per device, its configurations and start times) to the run's
    summary.md from the workers' statistics; returns the section ('' when no device ran)."""
    events: list[dict[str, Any]] = []
    for f in sorted(stats_dir.glob("*.json")) if stats_dir.is_dir() else []:
        try:
            cards = json.loads(f.read_text()).get("cards", [])
        except (OSError, ValueError, AttributeError):
            continue  # a worker's damaged statistics: the terminal summary names the file
        events += [e for e in cards if isinstance(e, dict)] if isinstance(cards, list) else []
    if not events:
        return ""
    section = "\n".join(["## Cards", "", *[f"- {line}" for line in ledger_summary_lines(events)], ""])
    with open(summary, "a", encoding="utf-8") as f:
        f.write("\n" + section)
    return section
