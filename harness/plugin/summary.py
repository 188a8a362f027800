"""The run's terminal summary (section ``vllm-hil``): quarantined tests that pass now, the
warnings about the harness's own files and the quarantine (ordering.py), the stack and what it
lacks (its tests not collected: stack_variants.py), and what the workers' statistics files say:
engines started, cards, engine hygiene, reference cache, near-ties, near-tie exposure,
teacher-forced agreement, the calibrated thresholds reduced-precision targets were judged by,
and each triaged failure's verdict with what its triage cost. A statistics file that cannot be
read is named and left out; one of an older run, written before a key existed, counts as having
none of it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.checks.agreement import agreement_lines
from harness.checks.exposure import exposure_lines
from harness.engine.device_ledger import ledger_summary_lines
from harness.lab.quarantine import quarantined_passes
from harness.plugin.invocation import is_worker
from harness.plugin.options import option_value
from harness.plugin.ordering import file_warnings, quarantine_notes
from harness.plugin.outputs import run_begun
from harness.plugin.stack_variants import lacks_lines
from harness.report.calibration_report import calibration_terminal_lines, unique_calibrations
from harness.report.root_cause import hygiene_lines
from harness.report.triage_report import rows_from_stats, terminal_lines


def warn_quarantined_passes(tr: pytest.TerminalReporter) -> None:
    for nodeid in quarantined_passes(tr):
        tr.write_line(
            f"WARNING: quarantined test passes now; remove it from quarantine: {nodeid}",
            yellow=True, bold=True)


def warn_files(tr: pytest.TerminalReporter, config: pytest.Config,
               recorded: list[str] | None = None) -> None:
    """The files ignored and the quarantine entries that match nothing, this process's and
    those the workers ``recorded`` in their statistics (under xdist the workers collect),
    each once; with -v, the entries this run could not judge."""
    for line in dict.fromkeys([*file_warnings(config), *(recorded or [])]):
        tr.write_line(f"WARNING: {line}", yellow=True, bold=True)
    if getattr(config.option, "verbose", 0) > 0:
        for line in quarantine_notes(config):
            tr.write_line(f"quarantine: {line}")


def read_stats(f: Path) -> tuple[dict | None, str | None]:
    """A worker's statistics file, or why it is left out (a worker killed mid-write)."""
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return None, f"{f}: cannot be read ({e}); left out of this summary"
    if not isinstance(data, dict) or not isinstance(data.get("engines"), list):
        return None, f"{f}: not a statistics file of this harness; left out of this summary"
    return data, None


@dataclass
class RunStats:
    """The workers' statistics files (REPORTS_DIR/stats/*.json), merged."""

    engines: list[dict] = field(default_factory=list)
    hits: int = 0
    misses: int = 0
    near: list[str] = field(default_factory=list)
    leases: list[str] = field(default_factory=list)
    exposure: list[dict] = field(default_factory=list)
    agreement: list[dict] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    cards: list[dict] = field(default_factory=list)
    hygiene: list[dict] = field(default_factory=list)
    triage: list[dict] = field(default_factory=list)  # harness.core.triage.TriageResult dicts
    calibrations: list[dict] = field(default_factory=list)  # SessionStats.calibrations
    warnings: list[str] = field(default_factory=list)  # SessionStats.warnings

    def add(self, s: dict) -> None:
        self.engines += s["engines"]
        self.hits += s["reference_hits"]
        self.misses += s["reference_misses"]
        self.near += s["near_ties"]
        self.leases += s.get("leases", [])
        self.exposure.append(s.get("exposure", {}))
        self.agreement.append(s.get("agreement", {}))
        self.bad += s.get("reference_bad", [])
        self.cards += s.get("cards", [])
        self.hygiene.append(s.get("hygiene", {}))
        triage = s.get("triage") or []
        if not isinstance(triage, list):
            raise TypeError(f"triage is a JSON {type(triage).__name__}, not a list")
        self.triage += triage
        calibrations = s.get("calibrations") or []
        if not isinstance(calibrations, list):
            raise TypeError(f"calibrations is a JSON {type(calibrations).__name__}, not a list")
        self.calibrations += calibrations
        warnings = s.get("warnings") or []
        if not isinstance(warnings, list):
            raise TypeError(f"warnings is a JSON {type(warnings).__name__}, not a list")
        self.warnings += [str(w) for w in warnings]


def write_summary(tr: pytest.TerminalReporter, config: pytest.Config) -> None:
    if is_worker(config) or not run_begun(config):
        return  # a collect-only or refused run must not report the statistics of another run
    warn_quarantined_passes(tr)
    stats_dir = Path(option_value(config, "--hil-reports-dir")) / "stats"
    files = sorted(stats_dir.glob("*.json")) if stats_dir.is_dir() else []
    s = RunStats()
    unread: list[str] = []
    for f in files:
        data, problem = read_stats(f)
        try:
            if data is not None:
                RunStats().add(data)  # whole or not at all
                s.add(data)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            problem = f"{f}: not a statistics file of this harness ({e!r}); left out"
        if problem:
            unread.append(problem)
    warn_files(tr, config, s.warnings)
    if not files:
        return
    tr.section("vllm-hil")
    for line in unread:
        tr.write_line(f"WARNING: {line}", yellow=True)
    tr.write_line(f"stack: {option_value(config, '--stack')}")
    for line in lacks_lines(config):
        tr.write_line(line)
    for line in s.leases:
        tr.write_line(f"lease: {line}")
    starts = ", ".join(f"{e['config']} {e['seconds']}s" for e in s.engines) or "none"
    tr.write_line(f"engines started: {len(s.engines)} ({starts})")
    for line in ledger_summary_lines(s.cards):
        tr.write_line(line)
    for line in hygiene_lines(s.hygiene):
        tr.write_line(line, yellow=line.startswith("  "))
    tr.write_line(f"reference cache: {s.hits} hits, {s.misses} computed")
    if s.bad:
        tr.write_line(f"reference cache: {len(s.bad)} bad entr{'y' if len(s.bad) == 1 else 'ies'}"
                      " recomputed", yellow=True)
        for b in s.bad:
            tr.write_line(f"  bad entry: {b}")
    tr.write_line(f"near-ties accepted: {len(s.near)}")
    for n in s.near:
        tr.write_line(f"  near-tie: {n}")
    for line in exposure_lines(s.exposure):
        tr.write_line(line, yellow=line.startswith("WARNING"))
    for line in agreement_lines(s.agreement, s.exposure):
        tr.write_line(line)
    for line in calibration_terminal_lines(unique_calibrations(s.calibrations)):
        tr.write_line(line)
    rows, bad = rows_from_stats(s.triage)
    for line in bad:
        tr.write_line(f"WARNING: {line}", yellow=True)
    for line in terminal_lines(rows):
        tr.write_line(line)
