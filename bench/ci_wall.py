"""The CI wall time: the README's test command, step by step, on a fresh clone of this checkout.

``hil bench --parts ci`` (opt-in: it takes as long as CI, 30-60 minutes on a 2-core machine,
and a fresh set-up of every stack). The command is read from ``.ci/run`` (the line CI runs,
which must be the README's), split at ``&&`` into its steps, and run in a clone of HEAD with
the ``HIL_*`` variables unset, as ``.ci/run`` does; each step's wall time and exit code are
recorded, and the total. A step that fails ends the run (as ``&&`` does) and fails the bench.
A step that runs pytest also writes a JUnit file (``--junitxml``, appended to that step alone:
the pytest runs the tests start are untouched), from which the step's test time is summed by
test module (``by_file``: where the step's time goes).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from harness.lab.shard_plan import DurationsError, load_durations

CI_SCRIPT = ".ci/run"


def ci_command(root: Path) -> str:
    """The test command ``.ci/run`` runs (its line that starts with ``./setup.sh``)."""
    for line in (root / CI_SCRIPT).read_text().splitlines():
        if line.strip().startswith("./setup.sh"):
            return line.strip()
    raise ValueError(f"{CI_SCRIPT} runs no ./setup.sh line: no test command to time")


def ci_steps(command: str) -> list[str]:
    """The command's steps, in order (``a && b`` -> [a, b])."""
    return [s.strip() for s in command.split("&&") if s.strip()]


def ci_wall(root: Path, work: Path) -> dict[str, Any]:
    """Clone HEAD of ``root`` into ``work`` and run the test command's steps there, timed."""
    clone = work / "ci-clone"
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, check=True,
                          capture_output=True, text=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIL_")}
    steps: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for step in ci_steps(ci_command(clone)):
        s = time.monotonic()
        log = work / f"ci-step-{len(steps)}.log"
        junit = work / f"ci-step-{len(steps)}.xml"
        junit.unlink(missing_ok=True)
        with log.open("w") as out:
            rc = subprocess.run(["bash", "-c", with_junit(step, junit)], cwd=clone, env=env,
                                stdout=out, stderr=subprocess.STDOUT).returncode
        steps.append({"command": step, "wall_s": round(time.monotonic() - s, 1), "returncode": rc,
                      "summary": _last_summary(log), "by_file": by_file(junit)})
        print(f"  ci step {len(steps)}: {steps[-1]['wall_s']} s, exit {rc}: {step}", flush=True)
        for name, seconds, tests in steps[-1]["by_file"][:10]:
            print(f"    {seconds:8.1f} s  {tests:4d} tests  {name}", flush=True)
        if rc != 0:
            break
    failed = [s for s in steps if s["returncode"] != 0]
    shutil.rmtree(clone, ignore_errors=True)
    return {"commit": head, "wall_s": round(time.monotonic() - t0, 1),
            "wall_min": round((time.monotonic() - t0) / 60, 1), "steps": steps,
            "problem": (f"step failed (exit {failed[0]['returncode']}): {failed[0]['command']}"
                        if failed else None)}


def _last_summary(log: Path) -> str:
    """pytest's last summary line in a step's log ('N passed, ... in S s'), or ''."""
    lines = [ln.strip("= ") for ln in log.read_text(errors="replace").splitlines()
             if " in " in ln and ("passed" in ln or "failed" in ln) and ln.startswith("=")]
    return lines[-1] if lines else ""


_PYTEST = re.compile(r"(^|\s)(-m\s+pytest|pytest)(\s|$)")


def with_junit(step: str, junit: Path) -> str:
    """``step`` writing its JUnit file to ``junit`` where it runs pytest, else unchanged."""
    return f"{step} --junitxml={junit}" if _PYTEST.search(step) else step


def by_file(junit: Path) -> list[tuple[str, float, int]]:
    """A JUnit file's test time summed by test module: (module, seconds, tests), largest first;
    empty where there is no readable file. The file is read as ``hil nightly --shard`` reads
    one (``load_durations``: seconds per ``classname::name``)."""
    try:
        durations = load_durations(junit)
    except DurationsError:
        return []
    sums: dict[str, list[float]] = {}
    for test, seconds in durations.items():
        parts = test.partition("::")[0].split(".")
        while len(parts) > 1 and parts[-1][:1].isupper():  # a test class: its module
            parts.pop()
        acc = sums.setdefault(".".join(parts), [0.0, 0])
        acc[0] += seconds
        acc[1] += 1
    return sorted(((m, round(t, 1), int(n)) for m, (t, n) in sums.items()), key=lambda r: -r[1])
