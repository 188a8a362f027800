"""Near-tie exposure (harness.checks.exposure) on synthetic reference traces."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.checks.exposure import (
    Exposure,
    ExposureTally,
    FlatnessLimits,
    exposure_lines,
    exposure_of,
    top_two,
)
from harness.core.trace import RequestTrace, TokenStep
from harness.report.summary import RunSummary, exposure_from_stats, summary_markdown


def step(*probs: float) -> TokenStep:
    """A position whose recorded alternatives have these probabilities (token ids 10, 11, ...)."""
    top = {10 + i: math.log(p) for i, p in enumerate(probs)}
    return TokenStep(token_id=10, logprob=top[10], top_logprobs=top)


def request(rid: str, steps: list[TokenStep], prompt: tuple[int, ...] = (1, 2)) -> RequestTrace:
    return RequestTrace(request_id=rid, prompt_token_ids=list(prompt), steps=steps)


def confident(n: int) -> list[TokenStep]:
    return [step(0.9, 0.05, 0.01) for _ in range(n)]


def test_top_two_reads_the_two_largest_regardless_of_order() -> None:
    s = TokenStep(token_id=5, logprob=math.log(0.2),
                  top_logprobs={5: math.log(0.2), 6: math.log(0.7), 7: math.log(0.1)})
    p1, p2 = top_two(s)  # type: ignore[misc]
    assert (round(p1, 9), round(p2, 9)) == (0.7, 0.2)
    assert top_two(TokenStep(token_id=5, logprob=0.0, top_logprobs={5: 0.0})) is None


def test_confident_model_is_not_warned() -> None:
    # 2 exposed positions out of 100: 2 %, under the 5 % limit; median 0.9.
    steps = confident(98) + [step(0.40, 0.38), step(0.30, 0.26)]
    e = exposure_of("good", [request("a", steps)])
    assert (e.positions, e.exposed) == (100, 2)
    assert e.share == pytest.approx(0.02)
    assert e.median_top1 == pytest.approx(0.9)
    assert e.warning() is None
    assert e.line().startswith("good: near-tie exposure 2.0% (2/100 positions, tol 0.05)")


def test_too_many_near_ties_warns_with_the_figures() -> None:
    # 6 exposed out of 100 (6 % > 5 %), though the median stays high.
    steps = confident(94) + [step(0.45, 0.44)] * 6
    e = exposure_of("flat-ish", [request("a", steps)])
    assert e.exposed == 6
    warning = e.warning()
    assert warning is not None
    assert "model flat-ish is too flat" in warning
    assert "6.0% of positions have top-1 and top-2 within 0.05 (limit 5%)" in warning
    assert "median" not in warning


def test_low_median_warns_even_without_near_ties() -> None:
    # Top-1 0.3 against 0.1: a wide gap, but the model is unsure everywhere.
    e = exposure_of("unsure", [request("a", [step(0.3, 0.1)] * 10)])
    assert e.exposed == 0
    warning = e.warning()
    assert warning is not None and "median top-1 probability 0.300 (limit 0.5)" in warning


def test_gap_exactly_at_tolerance_counts_as_exposed() -> None:
    # The near-tie rule accepts a gap equal to the tolerance, so exposure must count it.
    e = exposure_of("edge", [request("a", [step(0.5, 0.45)])], tol=0.05)
    assert e.exposed == 1
    assert exposure_of("edge", [request("a", [step(0.5, 0.449)])], tol=0.05).exposed == 0


def test_limits_and_tolerance_are_options() -> None:
    steps = confident(90) + [step(0.45, 0.44)] * 10
    strict = exposure_of("m", [request("a", steps)], limits=FlatnessLimits(max_exposure=0.2))
    assert strict.warning() is None
    assert exposure_of("m", [request("a", steps)], tol=0.001).exposed == 0


def test_same_request_is_counted_once_and_workers_merge() -> None:
    first, second = ExposureTally(), ExposureTally()
    shared = request("x", confident(4))
    first.add("m", shared)
    first.add("m", request("renamed", confident(4)))  # same prompt and tokens: same request
    second.add("m", shared)
    second.add("m", request("y", [step(0.5, 0.48)], prompt=(9,)))
    second.add("other", shared)
    merged = ExposureTally()
    for t in (first, second):
        merged.merge(json.loads(json.dumps(t.to_dict())))
    figures = merged.exposures()
    assert (figures["m"].positions, figures["m"].exposed) == (5, 1)
    assert figures["other"].positions == 4


def test_lines_and_run_summary_section(tmp_path: Path) -> None:
    stats = tmp_path / "stats"
    stats.mkdir()
    flat, good = ExposureTally(), ExposureTally()
    flat.add("lab-ckpt", request("a", [step(0.2, 0.19)] * 10))
    good.add("tiny-llama", request("b", confident(10)))
    (stats / "gw0.json").write_text(json.dumps({"exposure": flat.to_dict()}))
    (stats / "gw1.json").write_text(json.dumps({"exposure": good.to_dict()}))
    (stats / "broken.json").write_text("{not json")

    lines = exposure_from_stats(stats)
    assert lines == exposure_lines([flat.to_dict(), good.to_dict()])
    assert lines[0].startswith("lab-ckpt: near-tie exposure 100.0%")
    assert lines[1].startswith("tiny-llama: near-tie exposure 0.0%")
    assert lines[2].startswith("WARNING: model lab-ckpt is too flat")
    assert len(lines) == 3

    text = summary_markdown(RunSummary(exposure=lines))
    assert "## Near-tie exposure" in text
    assert "- WARNING: model lab-ckpt is too flat" in text
    assert "Near-tie exposure" not in summary_markdown(RunSummary())
    assert exposure_from_stats(tmp_path / "absent") == []


def test_empty_exposure_has_no_warning() -> None:
    assert Exposure("m", 0, 0, 0.0, 0.0, 0.0).warning() is None
    assert exposure_of("m", []).positions == 0
