"""The faults a run installs, as its reports name them: each ``--inject-fault`` spec, and each
inventory device's ``env.HIL_FAULTS`` spec with the device it simulates a broken card on. A
fault a report does not name would make its failures read as the stack's own bugs, so the
terminal header, summary.md, the Allure environment and every failed verdict's text name
these (``harness.session.verdicts`` adds them to a failure's text).

A fault asked for that no engine of the run installed (its ``variant=`` or ``stack=`` matched
none of the engines that ran) proves nothing: the engines print ``[hil] fault installed:
SPEC`` to their logs, and at the end of a run in which engines ran, an ``--inject-fault`` spec
no log names fails the run (``fail_uninstalled_faults``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.core.devices import InventoryDevice
from harness.in_engine.faults import env_fault_specs
from harness.lab.inventory import Inventory
from harness.plugin.options import option_value
from harness.session.stats import SessionStats

FAULTS_ENV = "HIL_FAULTS"
INSTALLED = "[hil] fault installed: "  # the engine's line (harness.in_engine.faults.apply_faults)
STATS_FILE = "faults.json"  # beside the workers' stats files, in their shape
_DEVICE_FAULTS = pytest.StashKey[tuple[str, ...]]()
_STARTED = pytest.StashKey[float]()


def device_fault_specs(device: InventoryDevice) -> list[str]:
    """The fault specs of ``device``'s inventory ``env.HIL_FAULTS``."""
    return env_fault_specs(dict(device.env).get(FAULTS_ENV, ""))


def remember_device_faults(config: pytest.Config, inventory: Inventory) -> None:
    """Keep the inventory's device faults for the reports, each as ``SPEC (device ID)``."""
    config.stash[_DEVICE_FAULTS] = tuple(
        f"{spec} (device {d.id})" for d in inventory.devices for spec in device_fault_specs(d))


def device_faults(config: pytest.Config) -> list[str]:
    """The inventory's device faults, each as ``SPEC (device ID)`` (none without --inventory)."""
    return list(config.stash.get(_DEVICE_FAULTS, ()))


def run_faults(config: pytest.Config) -> list[str]:
    """Every fault this run installs: the ``--inject-fault`` specs, then the inventory's."""
    asked = [str(s) for s in option_value(config, "--inject-fault", []) or []]
    return asked + device_faults(config)


def faults_header(config: pytest.Config) -> str | None:
    """The terminal header's line naming the run's faults; None when it installs none."""
    faults = run_faults(config)
    return f"vllm-hil: faults injected: {', '.join(faults)}" if faults else None


def note_run_start(config: pytest.Config) -> None:
    """Remember when the run started: engine logs written since are this run's."""
    config.stash[_STARTED] = time.time()


def installed_specs(log_dir: Path, since: float) -> set[str] | None:
    """The fault specs the engine logs in ``log_dir`` written since ``since`` say were
    installed; None when no engine wrote a log since (no engine ran)."""
    logs = [p for p in sorted(log_dir.glob("*.log")) if p.stat().st_mtime >= since]
    if not logs:
        return None
    installed: set[str] = set()
    for log in logs:
        with open(log, encoding="utf-8", errors="replace") as f:
            installed.update(line.split(INSTALLED, 1)[1].strip() for line in f if INSTALLED in line)
    return installed


def uninstalled_message(specs: list[str]) -> str:
    """The run's failure for ``specs`` that no engine installed."""
    return (f"fault(s) asked for and installed in no engine of this run: {', '.join(specs)};"
            " a fault proof proves nothing unless its variant= and stack= match an engine the"
            " run starts (see the engine logs' \"[hil] fault not installed\" lines)")


def fail_uninstalled_faults(session: pytest.Session, reports_dir: Path) -> None:
    """On the controller, at the end of a run in which engines ran: every ``--inject-fault``
    spec must have been installed by some engine, else the run fails (exit 1), its reason a
    warning of summary.md and the terminal summary (``stats/faults.json``)."""
    config = session.config
    asked = [str(s) for s in option_value(config, "--inject-fault", []) or []]
    if not asked or _STARTED not in config.stash:
        return
    installed = installed_specs(reports_dir / "engine-logs", config.stash[_STARTED])
    if installed is None:
        return
    missing = [spec for spec in asked if spec not in installed]
    if not missing:
        return
    stats = reports_dir / "stats"
    stats.mkdir(parents=True, exist_ok=True)
    # A record of the workers' shape holding only the warning: summary.md and the terminal
    # summary list the workers' warnings.
    record = SessionStats(warnings=[uninstalled_message(missing)]).to_dict()
    (stats / STATS_FILE).write_text(json.dumps(record, indent=1))
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
