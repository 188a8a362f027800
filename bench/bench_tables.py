"""The bench's figures as a reader sees them: the ratios across parts (the figures to compare
across machines) and the printed tables."""

from __future__ import annotations

import json
from typing import Any


def fmt_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


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
    for label, row in (result.get("mission") or {}).items():
        if label.startswith("warm") and row["split_s"].get("engine_compute"):
            name = "mission_" + label.replace(" -n ", "_n").replace(" ", "_")
            out[f"{name}_wall_s"] = row["wall_s"]
            out[f"{name}_wall_over_forward"] = round(
                row["wall_s"] / row["split_s"]["engine_compute"], 2)
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
    if result.get("ci"):
        out["ci_wall_min"] = result["ci"]["wall_min"]
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
    ci = result.get("ci") or {}
    if ci:
        crow = [["CI step (commit " + str(ci.get("commit")) + ")", "wall s", "exit", "summary"]]
        crow += [[c["command"][:70], str(c["wall_s"]), str(c["returncode"]), c["summary"][:60]]
                 for c in ci["steps"]]
        crow.append(["all", str(ci["wall_s"]), "", f"{ci['wall_min']} min"])
        print("\n" + fmt_table(crow))
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
