"""The bench's timed pytest runs: one child pytest, its wall time, outcome and the harness's own
counters (engines started, references computed, the session's timers), and the figures of
engine start times (median, nearest-rank p90)."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def pytest_run(label: str, args: list[str], cache: Path, reports: Path) -> dict[str, Any]:
    """One pytest process; its wall time, outcome and the harness's own counters."""
    shutil.rmtree(reports, ignore_errors=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           f"--hil-cache-dir={cache}", f"--hil-reports-dir={reports}", *args]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    t1 = time.time()
    tail = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1:] or [""]
    engines, computed, timers, starts = 0, 0, {}, []
    for f in sorted((reports / "stats").glob("*.json")):
        s = json.loads(f.read_text())
        engines += s["engines_started"]
        starts += [float(e["seconds"]) for e in s.get("engines", [])]
        computed += s["reference_misses"]
        for k, v in s.get("timers", {}).items():
            timers[k] = timers.get(k, 0.0) + v
    timing = json.loads((reports / "timing.json").read_text()) if (reports / "timing.json").exists() else {}
    wall = t1 - t0
    split = {}
    if timing:
        # Under xdist the controller collects nothing: its session start is the mark.
        split["startup_and_collection"] = timing.get("collection_done", timing["session_start"]) - t0
        split["reporting_and_exit"] = t1 - timing["session_finish"]
    for k in ("engine_start", "engine_calls", "engine_compute", "reference", "checks", "triage"):
        split[k] = timers.get(k, 0.0)
    row = {"label": label, "args": args, "returncode": proc.returncode, "outcome": tail[0],
           "wall_s": round(wall, 2), "engines_started": engines, "reference_computed": computed,
           "split_s": {k: round(v, 2) for k, v in split.items()},
           "engine_start_s": start_figures(starts)}
    print(f"  {label}: {row['wall_s']} s, {engines} engines, {computed} references computed"
          f" [{tail[0]}]", flush=True)
    return row


def start_figures(seconds: list[float]) -> dict[str, Any]:
    """Median and p90 (nearest rank) of engine start times, with the count."""
    if not seconds:
        return {"n": 0, "median": None, "p90": None}
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, max(0, -(-9 * len(ordered) // 10) - 1))]
    return {"n": len(ordered), "median": round(statistics.median(ordered), 2), "p90": round(p90, 2),
            "all": [round(x, 2) for x in seconds]}
