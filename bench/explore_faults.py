"""What ``hil explore`` needs to find each fault of the scheduler checks: one search per fault,
from an empty example database, with ``--seed 0`` on the default stack and tiny-llama.

    .venv/bin/python bench/explore_faults.py [--budget S] [--shrink-budget S] [FAULT ...]

Each search runs ``hil explore --target T --inject-fault F`` in a folder of its own (the tiny
models linked in, so the database starts empty) and its findings.md is read: the check it
failed, the examples and seconds until found, and the shrunk workload. Writes
``reports/bench/explore-faults.md`` and prints it. A fault not found within the budget is a row
saying so, never dropped. Each search's findings are kept under
``reports/bench/explore-faults/<time>/<fault>/``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The faults of the exact scheduler checks and the device block count, each on the target
# variant its selftest case uses (harness/targets/*/selftest_cases.py).
FAULTS: dict[str, str] = {
    "promise-one-short": "spyre-eager-np",
    "promise-one-extra": "spyre-eager-pc",
    "hold-back-once": "spyre-eager-cp",
    "free-blocks-overcounted": "spyre-eager-cp",
    "pause-one-step-late": "spyre-eager-cp",
    "pause-with-room": "spyre-eager-pc",
    "hold-back-at-admission": "spyre-eager-cp",
    "runner-tkv-one-block-high": "spyre-eager-cp",
    "tkv-prediction-without-padding": "spyre-eager-pc",
    "prefix-hit-underreported": "spyre-eager-pc",
    "prefix-cache-drops-a-block": "spyre-eager-pc",
    "runner-kv-short": "spyre-eager-cp",
    "kv-cache-short": "vllm-cpu",
    "formula-forgets-pad-block": "spyre-eager-cp",
}
FOUND = re.compile(r"Found after ([\d.]+) s of search \((\d+) examples? run\); shrunk in"
                   r" ([\d.]+) s \((\d+) runs?\)")


def cache_dir() -> Path:
    return Path(os.environ.get("HIL_CACHE_DIR", "").strip() or ROOT / ".hil-cache")


def search(fault: str, target: str, budget: float, shrink: float, folder: Path) -> dict:
    """One search; its figures (``check`` None: nothing found)."""
    cache = folder / "cache"
    cache.mkdir(parents=True)
    (cache / "models").symlink_to(cache_dir() / "models", target_is_directory=True)
    cmd = [sys.executable, "-m", "harness.cli", "explore", "--target", target, "--model",
           "tiny-llama", "--seed", "0", "--budget", str(budget), "--shrink-budget", str(shrink),
           "--inject-fault", fault, "--reports-dir", str(folder / "reports"),
           "--cache-dir", str(cache)]
    t0 = time.monotonic()
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    findings = folder / "reports" / "explore" / "findings.md"
    text = findings.read_text() if findings.exists() else ""
    row = {"fault": fault, "target": target, "exit": run.returncode, "wall_s": round(wall),
           "check": None, "why": ""}
    check = re.search(r"^## Finding \w+: \[check ([\w.]+)\]", text, re.M)
    found = FOUND.search(text)
    if run.returncode == 1 and check and found:
        requests = re.findall(r"^\| r\d+ \|", text, re.M)
        why = re.search(r"The failed check:\n\n```text\n(.*)\n", text)
        row.update(check=check.group(1), found_after=float(found.group(1)),
                   examples=int(found.group(2)), shrunk_s=float(found.group(3)),
                   requests=len(requests), why=why.group(1)[:300] if why else "")
    else:
        tail = (run.stdout + run.stderr).strip().splitlines()[-3:]
        row["why"] = "; ".join(tail) if run.returncode != 0 else "not found within the budget"
    return row


def table(rows: list[dict], budget: float, shrink: float) -> str:
    lines = [f"# hil explore on the faults of the scheduler checks (budget {budget:g} s,"
             f" shrink {shrink:g} s, seed 0, tiny-llama, default stack)", "",
             "| fault | target | found as | examples until found | found after (s) |"
             " requests after shrinking | wall (s) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["check"]:
            lines.append(f"| `{r['fault']}` | {r['target']} | `{r['check']}`: {r['why']} |"
                         f" {r['examples']} | {r['found_after']:g} | {r['requests']} |"
                         f" {r['wall_s']} |")
        else:
            lines.append(f"| `{r['fault']}` | {r['target']} | not found (exit {r['exit']}:"
                         f" {r['why']}) | - | - | - | {r['wall_s']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=180.0)
    p.add_argument("--shrink-budget", type=float, default=60.0)
    p.add_argument("faults", nargs="*", help=f"default: all of {', '.join(FAULTS)}")
    args = p.parse_args(argv)
    unknown = [f for f in args.faults if f not in FAULTS]
    if unknown:
        p.error(f"unknown fault(s) {', '.join(unknown)}: one of {', '.join(FAULTS)}")
    rows = []
    # each search's reports (findings.md, the regression test) are kept for reading
    runs = ROOT / "reports" / "bench" / "explore-faults"
    runs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="run-", dir=runs) as tmp:
        kept = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=runs))
        for fault in args.faults or FAULTS:
            rows.append(search(fault, FAULTS[fault], args.budget, args.shrink_budget,
                               Path(tmp) / fault))
            findings = Path(tmp) / fault / "reports" / "explore"
            if findings.is_dir():
                shutil.copytree(findings, kept / fault)
            print(table(rows[-1:], args.budget, args.shrink_budget).splitlines()[-1], flush=True)
    out = ROOT / "reports" / "bench" / "explore-faults.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table(rows, args.budget, args.shrink_budget))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
