"""Logprob closeness and teacher-forced comparison on hand-built traces."""

from __future__ import annotations

import math

import pytest

from harness.checks.agreement import AgreementTally, agreement_lines
from harness.checks.forcing import compare_forced
from harness.checks.logprobs import (
    TOL_CARD,
    TOL_FP32,
    LogprobPolicy,
    compare_logprobs,
    logprob_policy,
)
from harness.core.comparison import NearTiePolicy
from harness.core.serialise import trace_from_dict, trace_to_dict
from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.core.verdict import FORCED_LOGPROBS, FORCED_TOKENS, LOGPROB_CLOSENESS
from harness.report.categories import classify

PROMPT = [1, 2, 3]


def step(token: int, dist: dict[int, float], rank: int | None = None) -> TokenStep:
    lps = {t: math.log(p) for t, p in dist.items()}
    return TokenStep(token, lps[token], lps, rank)


def confident(token: int, p: float = 0.9) -> dict[int, float]:
    return {token: p, token + 50: (1 - p) * 0.6, token + 51: (1 - p) * 0.3}


def trace(target: str, tokens: list[int], p: float = 0.9, rid: str = "r0") -> Trace:
    steps = [step(t, confident(t, p)) for t in tokens]
    return Trace(target, {rid: RequestTrace(rid, PROMPT, steps)})


TOKENS = [10, 11, 12, 13, 14, 15]


# -- policies -----------------------------------------------------------------------------


def test_tolerances_per_precision() -> None:
    assert logprob_policy("vllm-cpu", False).tol == TOL_FP32 == 0.01
    assert logprob_policy("sendnn", True).tol == TOL_CARD == 0.5
    assert logprob_policy("eager", False, tol_fp32=0.2, tol_card=0.9).tol == 0.2
    assert logprob_policy("sendnn", True, tol_fp32=0.2, tol_card=0.9).tol == 0.9
    assert logprob_policy("neuron", True).backend == "neuron"
    with pytest.raises(ValueError, match="tolerance"):
        LogprobPolicy(-1.0)


# -- free-run logprob closeness ------------------------------------------------------------


def test_identical_logprobs_pass_and_name_the_largest() -> None:
    v = compare_logprobs(trace("ref", TOKENS), trace("vllm-cpu", TOKENS),
                         LogprobPolicy(0.01)).verdict()
    assert v.ok and v.check == LOGPROB_CLOSENESS
    assert "6 positions of 1 requests" in v.why and "largest deviation 0" in v.why


def test_a_few_percent_drift_with_equal_tokens_fails_with_where() -> None:
    ref = trace("ref", TOKENS, p=0.9)
    dev = trace("vllm-cpu", TOKENS, p=0.9)
    # Position 3's probability moves from 0.90 to 0.85 (0.057 nats): the argmax holds.
    dev.requests["r0"].steps[3] = step(13, confident(13, 0.85))
    v = compare_logprobs(ref, dev, LogprobPolicy(0.01, "vllm-cpu")).verdict()
    assert not v.ok and v.at == 3
    assert "1 positions in 1 requests" in v.why
    assert "largest deviation 0.05716 nats at request r0 position 3" in v.why
    assert "position 3: token 13 reference -0.1054 device -0.1625" in v.details
    assert classify("failed", v.message()) == "logprob drift"


def test_only_positions_before_the_first_divergence_are_compared() -> None:
    ref = trace("ref", TOKENS)
    dev = trace("vllm-cpu", [10, 11, 99, 13, 14, 15], p=0.5)  # far off, but after divergence
    dev.requests["r0"].steps[0] = ref.requests["r0"].steps[0]
    dev.requests["r0"].steps[1] = ref.requests["r0"].steps[1]
    v = compare_logprobs(ref, dev, LogprobPolicy(0.01)).verdict()
    assert v.ok and "2 positions" in v.why


def test_a_token_missing_from_the_device_top_k_is_an_infinite_deviation() -> None:
    ref = trace("ref", TOKENS)
    dev = trace("vllm-cpu", TOKENS)
    dev.requests["r0"].steps[0] = TokenStep(10, float("nan"), {60: -0.1})
    v = compare_logprobs(ref, dev, LogprobPolicy(0.5)).verdict()
    assert not v.ok and "inf (token not in the device's top-k)" in v.why


# -- teacher-forced runs --------------------------------------------------------------------


def forced_run(ref: Trace, dists: dict[int, dict[int, float]] | None = None,
               fed: list[int] | None = None, p: float = 0.9) -> Trace:
    """A device trace whose forced run was fed ``fed`` (default: the reference's tokens);
    ``dists`` replaces the device's distribution at some positions."""
    r = ref.requests["r0"]
    tokens = fed if fed is not None else r.token_ids
    steps = []
    for pos, t in enumerate(tokens):
        dist = (dists or {}).get(pos, confident(t, p))
        if t not in dist:
            dist = {**dist, t: 1e-6}
        steps.append(step(t, dist, rank=sorted(dist, key=lambda k: -dist[k]).index(t) + 1))
    dev = Trace("spyre-eager-cb", {"r0": RequestTrace("r0", PROMPT, list(r.steps))})
    dev.forced = {"r0": RequestTrace("r0", PROMPT, steps)}
    return dev


def verdicts(ref: Trace, dev: Trace, tol: float = 0.01) -> dict[str, object]:
    cmp_ = compare_forced(ref, dev, NearTiePolicy(), LogprobPolicy(tol))
    return {v.check: v for v in cmp_.verdicts()} | {"cmp": cmp_}


def test_forced_run_equal_to_reference_passes() -> None:
    ref = trace("ref", TOKENS)
    out = verdicts(ref, forced_run(ref))
    assert out[FORCED_TOKENS].ok and out[FORCED_LOGPROBS].ok
    assert "agreement 100.0 %" in out[FORCED_TOKENS].why


def test_wrong_token_after_an_accepted_near_tie_is_caught() -> None:
    """The free run diverged at an honest near-tie at position 1; position 4 is wrong later."""
    ref = trace("ref", TOKENS)
    ref.requests["r0"].steps[1] = step(11, {11: 0.46, 61: 0.44, 62: 0.1})
    dists = {1: {61: 0.46, 11: 0.44, 62: 0.1},  # device prefers 61: a near-tie, accepted
             4: {99: 0.95, 14: 0.01, 64: 0.04}}  # given the reference's history: wrong
    out = verdicts(ref, forced_run(ref, dists), tol=10.0)
    v = out[FORCED_TOKENS]
    assert not v.ok and v.at == 4
    assert "1 positions in 1 requests are neither equal nor a near-tie" in v.why
    assert "first divergence 1, agreement 66.7 % of 6" in v.details
    assert "position 4: reference token 14, device argmax 99" in v.details
    assert "rank 3" in v.details
    assert classify("failed", v.message()) == "token mismatch"
    assert out["cmp"].requests[0].positions[1].accepted


def test_forced_logprob_drift_is_caught_at_every_position() -> None:
    ref = trace("ref", TOKENS)
    dev = forced_run(ref, {5: confident(15, 0.8)})  # last position, argmax unchanged
    out = verdicts(ref, dev)
    assert out[FORCED_TOKENS].ok
    v = out[FORCED_LOGPROBS]
    assert not v.ok and v.at == 5 and "teacher-forced" in v.why
    assert "request r0 position 5" in v.why
    assert classify("failed", v.message()) == "logprob drift"


def test_forcing_not_applied_is_a_harness_error_not_a_pass() -> None:
    ref = trace("ref", TOKENS)
    dev = forced_run(ref, fed=[10, 11, 77, 13, 14, 15])
    v = verdicts(ref, dev)[FORCED_TOKENS]
    assert not v.ok and "forcing was not applied" in v.why and "position 2" in v.why


def test_missing_forced_output_fails() -> None:
    ref = trace("ref", TOKENS)
    dev = forced_run(ref)
    dev.forced = {}
    v = verdicts(ref, dev)[FORCED_TOKENS]
    assert not v.ok and "no teacher-forced output" in v.why


def test_forced_run_survives_serialisation_with_ranks() -> None:
    ref = trace("ref", TOKENS)
    dev = forced_run(ref)
    back = trace_from_dict(trace_to_dict(dev))
    assert back.forced["r0"].steps[0].rank == 1
    assert back.forced == dev.forced
    assert trace_from_dict(trace_to_dict(ref)).requests["r0"].steps[0].rank is None


def test_agreement_table_merges_workers_and_lists_unforced_stacks() -> None:
    ref = trace("ref", TOKENS)
    bad = forced_run(ref, {2: {99: 0.95, 12: 0.01, 62: 0.04}})
    a, b = AgreementTally(), AgreementTally()
    a.add("vllm-cpu", "tiny-llama", compare_forced(ref, forced_run(ref), NearTiePolicy(),
                                                   LogprobPolicy()))
    b.add("vllm-cpu", "tiny-llama", compare_forced(ref, bad, NearTiePolicy(), LogprobPolicy()))
    b.unsupported("spyre-eager-cb @ legacy", "tiny-llama", "teacher forcing not run: vLLM 0.9")
    lines = agreement_lines([a.to_dict(), b.to_dict()])
    assert lines[2].startswith("| vllm-cpu | tiny-llama | 12 | 91.7 % | 1 |")
    assert lines[-1] == "not forced: teacher forcing not run: vLLM 0.9"
    assert agreement_lines([{}]) == []


# -- the deviation plot -----------------------------------------------------------------------


def test_deviation_plot_marks_disagreements_and_near_ties() -> None:
    import xml.etree.ElementTree as ET

    from harness.report.deviation_plot import deviation_svg, series_of_forced

    ref = trace("ref", TOKENS)
    ref.requests["r0"].steps[1] = step(11, {11: 0.46, 61: 0.44, 62: 0.1})
    dev = forced_run(ref, {1: {61: 0.46, 11: 0.44, 62: 0.1}, 4: {99: 0.95, 14: 0.01, 64: 0.04}})
    cmp_ = compare_forced(ref, dev, NearTiePolicy(), LogprobPolicy(0.01))
    svg = deviation_svg(series_of_forced(cmp_, {"r0": 1}), "single on spyre-eager-cb", 0.01)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    squares = [r for r in root.iter(ns + "rect") if r.get("fill") == "#c00"]
    rings = [c for c in root.iter(ns + "circle") if c.get("stroke") == "#e08000"]
    red_points = [c for c in root.iter(ns + "circle") if c.get("fill") == "#c00"]
    assert len(squares) == 2  # positions 1 and 4 disagree
    assert len(rings) == 1  # the reference hesitates at position 1
    assert len(red_points) == 2  # both deviations are beyond tolerance
    assert "request r0 (2 disagreements)" in svg


def test_evidence_keeps_the_forced_comparison_for_the_plot() -> None:
    from harness.report.evidence import CallEvidence

    ref = trace("ref", TOKENS)
    dev = forced_run(ref)
    cmp_ = compare_forced(ref, dev, NearTiePolicy(), LogprobPolicy())
    ev = CallEvidence()
    ev.on_scenario(None, "scenario")
    ev.on_trace(None, "scenario", dev)
    ev.on_forced("scenario", ref, dev, cmp_)
    assert ev.runs[0].forced is cmp_ and ev.runs[0].reference is ref


def test_summary_md_has_the_agreement_table(tmp_path) -> None:
    import json

    from harness.report.summary import agreement_from_stats

    ref = trace("ref", TOKENS)
    tally = AgreementTally()
    tally.add("vllm-cpu", "tiny-llama", compare_forced(ref, forced_run(ref), NearTiePolicy(),
                                                       LogprobPolicy()))
    (tmp_path / "main.json").write_text(json.dumps({"agreement": tally.to_dict()}))
    (tmp_path / "broken.json").write_text("{")
    lines = agreement_from_stats(tmp_path)
    assert lines[2].startswith("| vllm-cpu | tiny-llama | 6 | 100.0 % | 0 |")
    assert agreement_from_stats(tmp_path / "absent") == []


def test_the_report_plots_forced_runs_and_falls_back_to_the_free_run() -> None:
    from harness.checks.tokens import compare_traces
    from harness.plugin.allure_report import deviation_plot_of
    from harness.report.evidence import ScenarioRun

    ref = trace("ref", TOKENS)
    dev = forced_run(ref, {4: {99: 0.95, 14: 0.01, 64: 0.04}})
    run = ScenarioRun(config=None, scenario=None, trace=dev, reference=ref,
                      comparison=compare_traces(ref, dev),
                      forced=compare_forced(ref, dev, NearTiePolicy(), LogprobPolicy()))
    assert "(1 disagreements)" in deviation_plot_of(run, "t")
    run.forced = None  # a stack that cannot force: the free run's compared positions
    svg = deviation_plot_of(run, "t")
    assert svg.startswith("<svg") and "(0 disagreements)" in svg


# -- calibrated (reduced-precision) policies -------------------------------------------------


def calibrated(limit: float = 0.5, band: float = 0.05) -> LogprobPolicy:
    return LogprobPolicy(limit, "bf16", band=band, source="calibrated bf16, 348 positions")


def drifted(positions: list[int], p: float = 0.8, rid: str = "r0",
            tokens: list[int] = TOKENS) -> tuple[Trace, Trace]:
    """Reference at p=0.9, the device at ``p`` at ``positions``: 0.118 nats each (p=0.8)."""
    ref = trace("ref", tokens, rid=rid)
    dev = trace("vllm-cpu-bf16", tokens, rid=rid)
    for i in positions:
        dev.requests[rid].steps[i] = step(tokens[i], confident(tokens[i], p))
    return ref, dev


def test_calibrated_policy_allows_a_few_positions_over_the_band() -> None:
    # 6 positions: two may be over the band (1 % per position, alpha 1e-3).
    assert calibrated().allowed(6) == 2
    ref, dev = drifted([2, 4])
    v = compare_logprobs(ref, dev, calibrated()).verdict()
    assert v.ok and "band=0.05" in v.why and "calibrated bf16" in v.why


def test_calibrated_policy_fails_a_request_with_too_many_positions_over_the_band() -> None:
    ref, dev = drifted([1, 3, 5])
    v = compare_logprobs(ref, dev, calibrated()).verdict()
    assert not v.ok and v.at == 1
    assert "over the band 0.05 nats at more positions than noise allows" in v.why
    assert "request r0: 3 of 6 positions over the band 0.05, 2 allowed" in v.details
    assert classify("failed", v.message()) == "logprob drift"


def test_calibrated_policy_fails_any_position_over_the_limit() -> None:
    ref, dev = drifted([4], p=0.3)  # 1.1 nats at one position
    v = compare_logprobs(ref, dev, calibrated()).verdict()
    assert not v.ok and v.at == 4 and "beyond 0.5 nats" in v.why


def test_calibrated_policy_fails_a_run_whose_requests_each_stay_within_their_allowance() -> None:
    # 40 requests of 6 positions, one position over the band in each: every request is within
    # its allowance (2), the run of 240 positions allows 8.
    ref, dev = Trace("ref"), Trace("vllm-cpu-bf16")
    for i in range(40):
        r, d = drifted([i % 6], rid=f"r{i}")
        ref.requests.update(r.requests)
        dev.requests.update(d.requests)
    policy = calibrated()
    assert policy.allowed(240) < 40
    v = compare_logprobs(ref, dev, policy).verdict()
    assert not v.ok and v.at is None
    assert f"40 of 240 positions, {policy.allowed(240)} allowed" in v.why


def test_calibrated_policy_comes_from_the_thresholds() -> None:
    from harness.calibration.thresholds import MetricThreshold, Thresholds

    metric = MetricThreshold.from_sample("chosen_logprob", [0.001 * i for i in range(1, 101)])
    th = Thresholds("h", "bf16", {}, 100, 0.0, {"chosen_logprob": metric})
    p = LogprobPolicy.from_thresholds(th, "bf16")
    assert (p.tol, p.band) == (pytest.approx(0.3), pytest.approx(0.099))
    assert "calibrated bf16, 100 positions" in p.describe()
    with pytest.raises(ValueError, match="band"):
        LogprobPolicy(0.5, band=-1.0)
