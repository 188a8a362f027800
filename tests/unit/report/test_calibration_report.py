"""The calibrated thresholds in the report: the figure of each metric's measured noise with its
band and limit, the summary.md section and terminal lines from the workers' stats files, and
per test the rules its traces were judged by (the listener, the deviation plot's tolerance, the
``thresholds`` and ``calibration`` attachments of a real pytest run)."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.calibration.metrics import METRICS, UNITS
from harness.calibration.thresholds import MetricThreshold, Thresholds
from harness.checks.distribution import KL_FP32, DistributionPolicy
from harness.checks.logprobs import LogprobPolicy
from harness.core.comparison import NearTiePolicy
from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.report.calibration_report import (
    calibration_markdown,
    calibration_svg,
    calibration_terminal_lines,
    calibrations_from_stats,
    figure_names,
    record_of,
    rules_text,
    unique_calibrations,
    write_calibration_svgs,
)
from harness.report.evidence import CallEvidence, ScenarioRun
from harness.report.summary import summary_text, write_summary
from harness.session.precision import Rules, calibrated_near_tie
from tests.allure_results import allure_result
from tests.bad_input import write
from tests.suite_runner import Reporter, config_for, run_with_allure

SVG = "{http://www.w3.org/2000/svg}"


def sample(scale: float) -> list[float]:
    return [scale * 0.001 * i for i in range(1, 201)]


def thresholds(precision: str = "bf16", model_hash: str = "abc123",
               scale: float = 1.0) -> Thresholds:
    metrics = {m: MetricThreshold.from_sample(m, sample(scale)) for m in METRICS}
    return Thresholds(model_hash, precision, {"torch": "2.5"}, 200, 0.005, metrics)


def record(precision: str = "bf16", model: str = "tiny-llama", model_hash: str = "abc123",
           scale: float = 1.0) -> dict:
    """A calibration as the session records it (PrecisionDesk.used, SessionStats)."""
    th = thresholds(precision, model_hash, scale)
    return {"model": model, "model_hash": model_hash, **th.to_dict(),
            "distributions": {m: sample(scale) for m in METRICS}, "units": dict(UNITS),
            "near_tie_tol": calibrated_near_tie(NearTiePolicy(), th).prob_tol}


def calibrated_rules(th: Thresholds | None = None) -> Rules:
    th = th or thresholds()
    return Rules(calibrated_near_tie(NearTiePolicy(), th),
                 LogprobPolicy.from_thresholds(th, "bf16"),
                 DistributionPolicy.from_thresholds(th), th.precision, th)


def fp32_rules() -> Rules:
    return Rules(NearTiePolicy(), LogprobPolicy(0.01, "vllm-cpu"),
                 DistributionPolicy(KL_FP32, source="fp32"))


def worker_stats(path: Path, calibrations: list[dict] | None) -> None:
    data: dict = {"engines": [], "reference_hits": 0, "reference_misses": 0, "near_ties": []}
    if calibrations is not None:
        data["calibrations"] = calibrations
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


# ------------------------------------------------------------------ the figure


def test_the_figure_is_svg_with_a_panel_per_metric_and_its_band_and_limit():
    r = record()
    svg = calibration_svg(r)
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert texts[0].startswith("tiny-llama bf16: measured noise, n=200")
    for metric in METRICS:
        t = r["metrics"][metric]
        assert any(x.startswith(f"{metric} ({UNITS[metric]}): n=200") for x in texts)
        assert f"band {t['band']:.4g} {UNITS[metric]}" in texts
        assert f"limit {t['limit']:.4g} {UNITS[metric]}" in texts
    # one bar per occupied bin, every position counted once per panel
    bars = [int(b.find(f"{SVG}title").text.split()[0]) for b in root.iter(f"{SVG}rect")
            if b.find(f"{SVG}title") is not None]
    assert sum(bars) == 200 * len(METRICS)


def test_values_at_or_below_zero_are_drawn_at_the_floor_and_a_run_is_ticked():
    r = record()
    r["distributions"]["kl_topk"] = [0.0, 0.0, -1e-12, *sample(1.0)[3:]]
    svg = calibration_svg(r, {"chosen_logprob": [0.01, 5.0, math.inf], "kl_topk": [0.0]})
    root = ET.fromstring(svg)
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert any("3 values <= 0 drawn at" in t for t in texts)
    ticks = [line for line in root.iter(f"{SVG}line") if line.get("stroke") in ("#000", "#c00")
             and line.get("y2") != line.get("y1") and "stroke-width" not in line.attrib]
    assert len(ticks) == 4
    assert sum(t.get("stroke") == "#c00" for t in ticks) == 2  # 5.0 and inf over the limit


def test_a_record_without_distributions_still_draws_its_thresholds():
    r = record()
    r["distributions"] = {}
    r["model"] = 'a<b>&"c'
    root = ET.fromstring(calibration_svg(r))
    assert (next(root.iter(f"{SVG}text")).text or "").startswith('a<b>&"c bf16')


def test_figures_are_written_one_per_record_with_distinct_names(tmp_path):
    a, b = record("bf16"), record("bf16", model_hash="other")
    names = figure_names([a, b, record("fp16")])
    assert names[("abc123", "fp16")] == "tiny-llama-fp16.svg"
    assert names[("abc123", "bf16")] != names[("other", "bf16")]
    folder = tmp_path / "calibration"
    folder.mkdir()
    (folder / "stale-bf16.svg").write_text("<svg/>")
    written = write_calibration_svgs([record("fp16"), record(model="org/model")], folder)
    assert sorted(p.name for p in folder.iterdir()) == ["org_model-bf16.svg",
                                                        "tiny-llama-fp16.svg"]
    assert all(ET.parse(p).getroot().tag == f"{SVG}svg" for p in written.values())


# ------------------------------------------------------------------ the stats


def test_calibrations_from_stats_deduplicate_the_workers_records(tmp_path):
    stats = tmp_path / "stats"
    worker_stats(stats / "gw0.json", [record("fp16"), record("bf16")])
    worker_stats(stats / "gw1.json", [record("bf16"), record("bf16", model="a-model",
                                                               model_hash="zzz")])
    worker_stats(stats / "gw2.json", None)  # a worker that judged no reduced precision
    (stats / "gw3.json").write_text("{")  # killed mid-write
    records = calibrations_from_stats(stats)
    assert [(r["model"], r["precision"]) for r in records] == [
        ("a-model", "bf16"), ("tiny-llama", "bf16"), ("tiny-llama", "fp16")]
    assert calibrations_from_stats(tmp_path / "absent") == []
    assert unique_calibrations([{"precision": "bf16"}, "x", None]) == []


def test_the_markdown_section_has_a_row_per_metric():
    r = record()
    lines = calibration_markdown([r], {("abc123", "bf16"): "calibration/tiny-llama-bf16.svg"})
    assert lines[0] == "## Calibrated thresholds"
    assert "### tiny-llama bf16" in lines
    head = next(line for line in lines if line.startswith("200 positions measured"))
    assert f"greedy flips 0.5 %, near-tie tolerance {r['near_tie_tol']:.4g}" in head
    assert "[distributions](calibration/tiny-llama-bf16.svg)" in head
    assert "| metric | unit | n | p50 | p99 | max | band | limit |" in lines
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(METRICS)
    t = r["metrics"]["chosen_logprob"]
    assert rows[0] == (f"| chosen_logprob | nats | 200 | {t['p50']:.4g} | {t['p99']:.4g}"
                       f" | {t['max']:.4g} | {t['band']:.4g} | {t['limit']:.4g} |")
    assert calibration_markdown([]) == []


def test_terminal_lines_name_logprob_and_kl_thresholds_and_the_near_tie_tolerance():
    r = record()
    lp, kl = r["metrics"]["chosen_logprob"], r["metrics"]["kl_topk"]
    assert calibration_terminal_lines([r]) == [
        f"calibrated tiny-llama bf16 (200 positions): logprob limit {lp['limit']:.4g} band"
        f" {lp['band']:.4g}, KL limit {kl['limit']:.4g} band {kl['band']:.4g}, near-tie tol"
        f" {r['near_tie_tol']:.4g}"]


def test_summary_text_has_the_section_only_when_the_stats_have_calibrations(tmp_path):
    tests = [allure_result("test_ok", "passed")]
    stats = tmp_path / "stats"
    worker_stats(stats / "gw0.json", [])
    assert "## Calibrated thresholds" not in summary_text(tests, [], stats)
    worker_stats(stats / "gw1.json", [record()])
    text = summary_text(tests, [], stats)
    assert "## Calibrated thresholds" in text and "### tiny-llama bf16" in text
    assert "[distributions]" not in text  # no figures written: none linked


def test_write_summary_writes_and_links_the_figures(tmp_path):
    results = tmp_path / "allure-results"
    results.mkdir()
    (results / "u1-result.json").write_text(json.dumps(allure_result("test_ok", "passed")))
    worker_stats(tmp_path / "stats" / "gw0.json", [record()])
    text = write_summary(results, tmp_path / "summary.md")
    assert "[distributions](calibration/tiny-llama-bf16.svg)" in text
    svg = tmp_path / "calibration" / "tiny-llama-bf16.svg"
    assert ET.parse(svg).getroot().tag == f"{SVG}svg"


def test_the_terminal_summary_prints_each_calibration_once(tmp_path):
    from harness.plugin.summary import write_summary as terminal_summary

    worker_stats(tmp_path / "stats" / "gw0.json", [record()])
    worker_stats(tmp_path / "stats" / "gw1.json", [record()])
    worker_stats(tmp_path / "stats" / "gw2.json", None)

    tr = Reporter()
    terminal_summary(tr, config_for(tmp_path))
    assert [line for line in tr.lines if line.startswith("calibrated ")] == \
        calibration_terminal_lines([record()])


# ------------------------------------------------------------------ per test


def one_request_trace(target: str, lps: list[float]) -> Trace:
    steps = [TokenStep(10 + i, lp, {10 + i: lp, 99: -5.0}) for i, lp in enumerate(lps)]
    return Trace(target, {"r0": RequestTrace("r0", [1, 2, 3], steps)})


def test_on_rules_stores_the_rules_on_the_run_of_the_trace():
    ev = CallEvidence()
    a, b = one_request_trace("vllm-cpu", [-0.1]), one_request_trace("vllm-cpu-bf16", [-0.1])
    ev.on_scenario("cfg-a", "scenario")
    ev.on_trace("cfg-a", "scenario", a)
    ev.on_scenario("cfg-b", "scenario")
    ev.on_trace("cfg-b", "scenario", b)
    rules = calibrated_rules()
    ev.on_rules(b, rules)
    ev.on_rules(b, rules)  # looked up again by another check: the same run
    assert [r.rules for r in ev.runs] == [None, rules]
    orphan = one_request_trace("neuron", [-0.1])
    ev.on_rules(orphan, fp32_rules())  # a trace no scenario announced gets a run of its own
    assert ev.runs[-1].trace is orphan and ev.runs[-1].rules == fp32_rules()


def test_the_deviation_plot_uses_the_rules_the_trace_was_judged_by():
    from harness.plugin.allure_report import deviation_plot_of

    ref = one_request_trace("ref", [-0.1, -0.2, -0.3])
    dev = one_request_trace("vllm-cpu-bf16", [-0.1, -0.25, -0.3])
    run = ScenarioRun(config=None, scenario=None, trace=dev, reference=ref)
    rules = calibrated_rules()
    run.rules = rules
    assert f"tolerance {rules.logprob.tol:g};" in deviation_plot_of(run, "t")
    run.rules = None  # no rules looked up: the target's flat tolerance
    assert f"tolerance {rules.logprob.tol:g};" not in deviation_plot_of(run, "t")


def test_the_thresholds_text_names_the_precision_source_and_policies():
    rules = calibrated_rules()
    r = record()
    assert record_of(rules.calibration, [record("fp16"), r]) == r
    assert record_of(rules.calibration, [record("fp16")]) is None
    text = rules_text("vllm-cpu-bf16", rules, r)
    assert text.splitlines()[0].startswith(
        "vllm-cpu-bf16 (bf16): calibrated on tiny-llama (model hash abc123), 200 positions")
    assert rules.near_tie.describe() in text and rules.logprob.describe() in text
    assert rules.distribution.describe() in text
    flat = rules_text("vllm-cpu", fp32_rules())
    assert flat.splitlines()[0] == "vllm-cpu (fp32): flat fp32 tolerances, no calibration"
    assert "KL limit 0.0001" in flat


RULES_SUITE = '''
import json
from pathlib import Path

from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.core.verdict import Verdict, VerdictFailed
from harness.scenario.catalog import Model

MODEL = Model("tiny-llama", Path("/models/tiny-llama"), "abc123", None)


def trace(target, lps):
    steps = [TokenStep(10 + i, lp, {10 + i: lp, 99: -5.0}) for i, lp in enumerate(lps)]
    return Trace(target, {"r0": RequestTrace("r0", [1, 2, 3], steps)})


def test_calibrated(hil):
    hil.precision._calibration_of = lambda model, precision: json.loads(CALIBRATION)
    hil.listeners.on_scenario(None, None)
    dev = trace("vllm-cpu-bf16", [-0.1, -0.2])
    hil.listeners.on_comparison(None, trace("ref", [-0.1, -0.21]), dev, None, None)
    hil.rules(dev, MODEL)
    hil.rules(dev, MODEL)
    raise VerdictFailed(Verdict.failed("logprob_closeness", "logprob drift"))


def test_fp32(hil):
    hil.rules(trace("vllm-cpu", [-0.1]), MODEL)
'''


def test_every_judged_test_carries_its_thresholds_and_a_failure_the_calibration(tmp_path):
    from harness.report.results import load_results

    r = record()
    calibration = {"thresholds": thresholds().to_dict(), "distributions": r["distributions"],
                   "units": r["units"]}
    suite = write(tmp_path, "test_rules.py",
                  f"CALIBRATION = {json.dumps(calibration)!r}\n" + RULES_SUITE)
    run, results = run_with_allure(tmp_path, suite)
    assert run.returncode == 1, run.stdout + run.stderr
    tests = {t["name"]: t for t in load_results(results).tests}
    calibrated = {a["name"]: a for a in tests["calibrated"]["attachments"]}
    text = (results / calibrated["thresholds"]["source"]).read_text()
    assert text.startswith("vllm-cpu-bf16 (bf16): calibrated on tiny-llama (model hash abc123)")
    assert text.count("logprob: logprob tol=") == 1  # once per test, however often looked up
    svg = ET.parse(results / calibrated["calibration"]["source"]).getroot()
    assert "tiny-llama bf16: measured noise" in (next(svg.iter(f"{SVG}text")).text or "")
    passed = {a["name"]: a for a in tests["fp32"]["attachments"]}
    assert "calibration" not in passed  # a pass carries its thresholds, not the evidence
    assert (results / passed["thresholds"]["source"]).read_text().startswith(
        "vllm-cpu (fp32): flat fp32 tolerances, no calibration")
    md = (tmp_path / "reports" / "stats")
    assert calibrations_from_stats(md)[0]["model"] == "tiny-llama"
    assert "calibrated tiny-llama bf16 (200 positions)" in run.stdout
