"""What a verdict costs: a benchmark of the harness itself.

    .venv/bin/hil bench [--quick]

Prints a table and writes reports/bench/latest.json (and a timestamped copy).
Measured in one go, on the tiny models:

- the token-equality suite on every CPU target, cold (empty reference cache)
  and warm, split into start-up, engine starts, engine calls, forward passes
  (the compute floor), reference, checks and reporting;
- the same with engine reuse and the reference cache off (the naive baseline);
- warm without the teacher-forced run (``--no-teacher-forcing``): what forcing costs;
- one step-driven scenario with and without the per-step KV probes;
- token equality over 10, 100 and 1000 prompts on one target (batched into one
  engine call each), with time per prompt and peak memory;
- -n 1 against -n 2 workers.

Absolute seconds depend on the machine and its load; the ratios are the figures
to compare across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SELECTION = ["suites/test_token_equality.py", "-m", "cpu", "--model", "tiny-llama"]


def pytest_run(label: str, args: list[str], cache: Path, reports: Path) -> dict[str, Any]:
    """One pytest process; its wall time, outcome and the harness's own counters."""
    shutil.rmtree(reports, ignore_errors=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           f"--hil-cache-dir={cache}", f"--hil-reports-dir={reports}", *args]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    t1 = time.time()
    tail = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1:] or [""]
    engines, computed, timers = 0, 0, {}
    for f in sorted((reports / "stats").glob("*.json")):
        s = json.loads(f.read_text())
        engines += s["engines_started"]
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
    for k in ("engine_start", "engine_calls", "engine_compute", "reference", "checks"):
        split[k] = timers.get(k, 0.0)
    row = {"label": label, "args": args, "returncode": proc.returncode, "outcome": tail[0],
           "wall_s": round(wall, 2), "engines_started": engines, "reference_computed": computed,
           "split_s": {k: round(v, 2) for k, v in split.items()}}
    print(f"  {label}: {row['wall_s']} s, {engines} engines, {computed} references computed"
          f" [{tail[0]}]", flush=True)
    return row


def session(cache: Path, reports: Path, **kw: Any) -> Any:
    from harness.session import HilSession, SessionOptions

    return HilSession(SessionOptions(cache_dir=cache, reports_dir=reports, **kw))


def probe_overhead(cache: Path, reports: Path, repeats: int) -> list[dict[str, Any]]:
    """One step-driven scenario, same engine, with and without the KV probes."""
    from harness.checks.ledger import STEP_CHECKS
    from harness.scenario import EngineLimits, shaped_scenario
    from harness.variants import VARIANTS

    hil = session(cache, reports)
    model = hil.model("tiny-llama")
    limits = EngineLimits(256, 4, cp_chunk=128)
    shapes = [(20 + 15 * i, 24, 0) for i in range(6)]
    rows = []
    try:
        for vid in ("vllm-cpu", "spyre-eager-cb"):
            sc = shaped_scenario("probe-overhead", model.tokenizer, shapes, limits)
            kw = {"block_size": 16, "num_blocks_override": 65} if vid == "vllm-cpu" else {}
            cfg = VARIANTS[vid].engine_config(str(model.path), limits, **kw)
            hil.run_steps(cfg, sc, probe=True)  # engine start and first-call costs
            on, off, evaluations = [], [], 0
            for _ in range(repeats):
                t0 = time.perf_counter()
                trace = hil.run_steps(cfg, sc, probe=True)
                t1 = time.perf_counter()
                hil.check_ledger(trace)
                on.append(time.perf_counter() - t0)
                t2 = time.perf_counter()
                hil.run_steps(cfg, sc, probe=False)
                off.append(time.perf_counter() - t2)
                snaps = sum(len(s.kv) for s in trace.ledger_steps())
                idle = sum(len(trace.step(n).kv) for n in trace.idle_steps())
                evaluations = snaps * len(STEP_CHECKS) + idle + len(trace.steps)
                run_only = t1 - t0
            row = {"target": vid, "steps": len(trace.steps),
                   "with_probe_s": round(statistics.median(on), 3),
                   "run_with_probe_s": round(run_only, 3),
                   "without_probe_s": round(statistics.median(off), 3),
                   "invariant_checks": evaluations}
            row["overhead"] = round(row["with_probe_s"] / row["without_probe_s"] - 1, 3)
            rows.append(row)
            print(f"  probes on {vid}: {row}", flush=True)
    finally:
        hil.close()
    return rows


def growth(cache: Path, reports: Path, sizes: list[int]) -> list[dict[str, Any]]:
    """Token equality over N prompts on vllm-cpu: one engine call per N, time per prompt."""
    from harness.scenario import EngineLimits, shaped_scenario
    from harness.variants import VARIANTS

    hil = session(cache, reports)
    model = hil.model("tiny-llama")
    limits = EngineLimits(256, 4)
    cfg = VARIANTS["vllm-cpu"].engine_config(str(model.path), limits)
    rows = []
    try:
        warm = shaped_scenario("warm", model.tokenizer, [(8, 4, 0)], limits)
        engine_pid = hil.generate(cfg, warm).info["pid"]
        for n in sizes:
            shapes = [(8 + (i * 7) % 56, 16, 0) for i in range(n)]
            sc = shaped_scenario(f"growth-{n}", model.tokenizer, shapes, limits)
            tracemalloc.start()
            t0 = time.perf_counter()
            ref = hil.reference(model, sc)
            t1 = time.perf_counter()
            calls0 = hil.timers.get("engine_calls", 0.0)
            dev = hil.generate(cfg, sc)
            t2 = time.perf_counter()
            verdict = hil.check_tokens(model, sc, dev, ref)
            t3 = time.perf_counter()
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            hwm = 0
            for line in Path(f"/proc/{engine_pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) // 1024
            row = {"prompts": n, "engine_calls": 1, "ok": verdict.ok,
                   "reference_ms_per_prompt": round((t1 - t0) / n * 1000, 2),
                   "device_ms_per_prompt": round((t2 - t1) / n * 1000, 2),
                   "compare_ms_per_prompt": round((t3 - t2) / n * 1000, 3),
                   "engine_call_s": round(hil.timers.get("engine_calls") - calls0, 2),
                   "harness_peak_mib": round(peak / 2**20, 1), "engine_peak_rss_mib": hwm}
            rows.append(row)
            print(f"  growth {n}: {row}", flush=True)
    finally:
        hil.close()
    return rows


def fmt_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one repeat (a smoke run)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    selection = [*SELECTION, "-k", "single or pair"] if args.quick else SELECTION
    work = Path(tempfile.mkdtemp(prefix="hil-bench-"))
    cache = work / "cache"
    from fixtures.models import build_model

    build_model("tiny-llama", cache)  # model builds are not what is measured
    result: dict[str, Any] = {
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "selection": " ".join(selection),
    }
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
    print("step-driven probes:", flush=True)
    sys.path.insert(0, str(ROOT))
    result["probes"] = probe_overhead(cache, work / "r-probe", repeats=1 if args.quick else 5)
    print("growth:", flush=True)
    result["growth"] = growth(cache, work / "r-growth", [10, 100] if args.quick else [10, 100, 1000])
    by = {r["label"]: r for r in runs}
    naive, warm = by["naive (no engine reuse, no reference cache)"], by["warm"]
    result["ratios"] = {
        "naive_over_warm": round(naive["wall_s"] / warm["wall_s"], 2),
        "cold_over_warm": round(by["cold"]["wall_s"] / warm["wall_s"], 2),
        "warm_over_no_teacher_forcing": round(
            warm["wall_s"] / by["warm, no teacher forcing"]["wall_s"], 2),
        "n1_over_n2": round(by["warm -n 1"]["wall_s"] / by["warm -n 2"]["wall_s"], 2),
        "probe_overhead": {p["target"]: p["overhead"] for p in result["probes"]},
    }
    for r in runs:
        session_s = sum(v for k, v in r["split_s"].items() if k in ("engine_start", "engine_calls", "reference", "checks"))
        r["harness_overhead_fraction"] = round(1 - r["split_s"]["engine_compute"] / r["wall_s"], 3)
        r["measured_parts_s"] = round(session_s, 2)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in (f"bench-{stamp}.json", "latest.json"):
        (out / name).write_text(json.dumps(result, indent=1))

    rows = [["run", "wall s", "engines", "refs computed", "startup", "engine start", "engine calls",
             "forward", "reference", "checks", "report+exit", "overhead"]]
    for r in runs:
        s = r["split_s"]
        rows.append([r["label"], f"{r['wall_s']}", str(r["engines_started"]), str(r["reference_computed"]),
                     f"{s.get('startup_and_collection', 0):.1f}", f"{s['engine_start']:.1f}",
                     f"{s['engine_calls']:.1f}", f"{s['engine_compute']:.1f}", f"{s['reference']:.1f}",
                     f"{s['checks']:.2f}", f"{s.get('reporting_and_exit', 0):.1f}",
                     f"{r['harness_overhead_fraction']:.0%}"])
    print("\n" + fmt_table(rows))
    prow = [["probe target", "steps", "invariant checks", "with probes s", "without s", "overhead"]]
    for p in result["probes"]:
        prow.append([p["target"], str(p["steps"]), str(p["invariant_checks"]), str(p["with_probe_s"]),
                     str(p["without_probe_s"]), f"{p['overhead']:.0%}"])
    print("\n" + fmt_table(prow))
    grow = [["prompts", "engine calls", "reference ms/prompt", "device ms/prompt", "compare ms/prompt",
             "harness peak MiB", "engine peak RSS MiB"]]
    for g in result["growth"]:
        grow.append([str(g["prompts"]), str(g["engine_calls"]), str(g["reference_ms_per_prompt"]),
                     str(g["device_ms_per_prompt"]), str(g["compare_ms_per_prompt"]),
                     str(g["harness_peak_mib"]), str(g["engine_peak_rss_mib"])])
    print("\n" + fmt_table(grow))
    print(f"\nratios: {json.dumps(result['ratios'])}")
    print(f"written: {out / 'latest.json'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
