"""The CI wall time: the README's test command, step by step, on a fresh clone of this checkout.

``hil bench --parts ci`` (opt-in: it takes as long as CI, 30-60 minutes on a 2-core machine,
and a fresh set-up of every stack). The command is read from ``.ci/run`` (the line CI runs,
which must be the README's), split at ``&&`` into its steps, and run in a clone of HEAD with
the ``HIL_*`` variables unset, as ``.ci/run`` does; each step's wall time and exit code are
recorded, and the total. A step that fails ends the run (as ``&&`` does) and fails the bench.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

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
        with log.open("w") as out:
            rc = subprocess.run(["bash", "-c", step], cwd=clone, env=env, stdout=out,
                                stderr=subprocess.STDOUT).returncode
        steps.append({"command": step, "wall_s": round(time.monotonic() - s, 1), "returncode": rc,
                      "summary": _last_summary(log)})
        print(f"  ci step {len(steps)}: {steps[-1]['wall_s']} s, exit {rc}: {step}", flush=True)
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
