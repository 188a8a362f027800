"""The merged summary of `hil run --stacks A,B`: each stack's summary part under its heading
with its tables intact, the stack x suite x target matrix and the skipped tests grouped by
reason, from made-up junit files and statistics."""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.report.stack_matrix import (
    DEVICE_GROUP,
    NOTHING,
    OTHER_GROUP,
    STACK_GROUP,
    group_skips,
    matrix_rows,
    parse_junit,
    target_of,
)
from harness.report.stack_summary import (
    save_stack_part,
    write_report_summary,
    write_run_summary,
)

LEGACY = "legacy-spyre-0.4"
TARGETS = ["vllm-cpu", "spyre-eager-sb", "spyre-eager-cb", "spyre-sendnn-cb", "neuron"]
SUITES = ["block_freeing", "capacity", "no_recompute", "token_equality"]
NO_CARD = "no Spyre device found: looked for PCI vendor:device 1014:06a7, 1014:06a8 under /sys/bus/pci"
NO_KERNELS = "vLLM 0.9.0.1 is an empty build (VLLM_TARGET_DEVICE=empty): no CPU kernels"
NO_CAPACITY = "the plugin overwrites num_gpu_blocks_override"
NOT_FORCED = ("not forced: teacher forcing not run on legacy-spyre-0.4:spyre-eager-cb: teacher"
              " forcing needs vLLM V1 custom logits processors")
DECLARED = {LEGACY: [NO_KERNELS, NO_CAPACITY + " and its runner sizes the pool itself"]}


def case(suite: str, test: str, skipped: str | None = None, failed: str | None = None) -> str:
    inner = ""
    if skipped is not None:
        inner = f'<skipped type="pytest.skip" message="{skipped}">{skipped}</skipped>'
    if failed is not None:
        inner = f'<failure message="{failed}">trace</failure>'
    return f'<testcase classname="suites.test_{suite}" name="{test}" time="1.0">{inner}</testcase>'


def junit(*cases: str) -> str:
    return ('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
            f'<testsuite name="pytest" tests="{len(cases)}">{"".join(cases)}</testsuite>'
            "</testsuites>")


DEFAULT_JUNIT = junit(
    case("token_equality", "test_greedy[tiny-llama-vllm-cpu-single]"),
    case("token_equality", "test_greedy[tiny-llama-vllm-cpu-pair]"),
    case("token_equality", "test_greedy[tiny-llama-spyre-eager-cb-single]",
         failed="[check token_equality] position 3"),
    case("capacity", "test_refused[tiny-llama-spyre-sendnn-cb]", skipped=NO_CARD),
    case("token_equality", "test_greedy[tiny-llama-spyre-sendnn-cb-single]", skipped=NO_CARD),
)
LEGACY_JUNIT = junit(
    case("token_equality", "test_greedy[tiny-llama-spyre-eager-cb-single]"),
    case("token_equality", "test_greedy[tiny-llama-vllm-cpu-single]",
         skipped=f"vllm-cpu does not run on stack {LEGACY}: {NO_KERNELS}"),
    case("capacity", "test_refused[tiny-llama-spyre-eager-cb]",
         skipped=f"suite capacity does not run on stack {LEGACY}: {NO_CAPACITY} and its"
                 " runner sizes the pool itself"),
    case("block_freeing", "test_dummy[tiny-llama-spyre-eager-cb]",
         skipped=f"spyre-eager-cb on stack {LEGACY} pads no decode batch"),
    case("block_freeing", "test_free[tiny-llama-spyre-eager-cb]"),
)


def agreement_stats(rows: dict[str, tuple[int, int]], reasons: dict[str, str]) -> dict:
    """A worker's statistics file with an agreement tally (AgreementTally.to_dict)."""
    return {"agreement": {
        "rows": {t: {"target": t, "model": "tiny-llama", "positions": n, "agree": a,
                     "max_dev": 1e-5} for t, (n, a) in rows.items()},
        "reasons": reasons}}


def run_stack(reports: Path, stack: str, stats: dict, junit_text: str, code: int = 0) -> None:
    """What one stack's pytest run leaves (its stats replace the previous stack's), then the
    part `hil run` keeps of it."""
    (reports / "stats").mkdir(parents=True, exist_ok=True)
    for f in (reports / "stats").glob("*.json"):
        f.unlink()
    (reports / "stats" / "main.json").write_text(json.dumps(stats))
    name = "junit.xml" if stack == "default" else f"junit-{stack}.xml"
    (reports / name).write_text(junit_text)
    (reports / "allure-results").mkdir(exist_ok=True)
    save_stack_part(reports, reports / "allure-results", stack, code)


def two_stack_run(reports: Path) -> str:
    run_stack(reports, "default", agreement_stats(
        {"vllm-cpu": (16, 16), "spyre-eager-cb": (16, 15)}, {}), DEFAULT_JUNIT, code=1)
    run_stack(reports, LEGACY, agreement_stats({}, {f"{LEGACY}:spyre-eager-cb | tiny-llama":
                                                    NOT_FORCED.removeprefix("not forced: ")}),
              LEGACY_JUNIT)
    return write_run_summary(reports, reports / "allure-results", ["default", LEGACY])


def section(text: str, heading: str) -> list[str]:
    """The lines under ``heading`` up to the next heading of the same level."""
    lines = text.splitlines()
    start = lines.index(heading)
    level = heading.split(" ")[0]
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].startswith(level + " ")), len(lines))
    return lines[start + 1:end]


def tables(lines: list[str]) -> list[list[str]]:
    """The markdown tables in ``lines``: runs of consecutive lines starting with a pipe."""
    out: list[list[str]] = []
    for prev, line in zip(["", *lines], lines, strict=False):
        if line.startswith("|"):
            if not prev.startswith("|"):
                out.append([])
            out[-1].append(line)
    return out


def test_every_stacks_agreement_table_is_kept_intact(tmp_path):
    text = two_stack_run(tmp_path)
    default = section(text, "## Stack `default` (pytest exit code 1)")
    agreement = section("\n".join(default), "### Teacher-forced agreement")
    (table,) = tables(agreement)
    assert table[0].startswith("| target | model | forced positions | agreement |")
    assert table[1] == "|---|---|---|---|---|---|---|"
    assert table[2].startswith("| spyre-eager-cb | tiny-llama | 16 | 93.8 % | 1 |")
    assert table[3].startswith("| vllm-cpu | tiny-llama | 16 | 100.0 % | 0 |")
    # Every table of the merged summary is header, separator, rows of as many cells.
    for t in tables(text.splitlines()):
        assert re.fullmatch(r"\|(---\|)+", t[1]), t
        assert {row.count(" | ") for row in t[2:]} <= {t[0].count(" | ")}, t


def test_not_forced_lines_are_outside_the_table_under_their_stacks_heading(tmp_path):
    text = two_stack_run(tmp_path)
    legacy = section(text, f"## Stack `{LEGACY}` (pytest exit code 0)")
    agreement = section("\n".join(legacy), "### Teacher-forced agreement")
    assert agreement == ["", f"- {NOT_FORCED}", ""]  # no table of a header alone
    assert NOT_FORCED not in "\n".join(section(text, "## Stack `default` (pytest exit code 1)"))
    assert not any(NOT_FORCED in row for t in tables(text.splitlines()) for row in t)


def test_matrix_cells_count_outcomes_per_stack_suite_and_target():
    cases = parse_junit(DEFAULT_JUNIT, "default") + parse_junit(LEGACY_JUNIT, LEGACY)
    rows = matrix_rows(cases, ["default", LEGACY], SUITES, TARGETS, DECLARED)
    assert rows == [
        ["default", "vllm-cpu", NOTHING, NOTHING, NOTHING, "2 passed"],
        ["default", "spyre-eager-cb", NOTHING, NOTHING, NOTHING, "1 failed"],
        ["default", "spyre-sendnn-cb", NOTHING, f"skipped: {DEVICE_GROUP}", NOTHING,
         f"skipped: {DEVICE_GROUP}"],
        [LEGACY, "vllm-cpu", NOTHING, NOTHING, NOTHING, f"skipped: {STACK_GROUP}"],
        [LEGACY, "spyre-eager-cb", f"1 passed, 1 skipped: {OTHER_GROUP}",
         f"skipped: {STACK_GROUP}", NOTHING, "1 passed"],
    ]
    # The longest target label that is a whole run of the parameter id wins.
    assert target_of("t[m-spyre-eager-cb-63-2]", ["spyre-eager", "spyre-eager-cb"]) \
        == "spyre-eager-cb"
    assert target_of("test_plain", TARGETS) == "(no target)"


def test_skips_are_grouped_device_missing_stack_without_the_feature_and_other():
    cases = (parse_junit(DEFAULT_JUNIT, "default") + parse_junit(LEGACY_JUNIT, LEGACY)
             + parse_junit(junit(case("capacity", "test_refused[tiny-llama-neuron]",
                                      skipped=NO_CARD)), LEGACY))
    groups = group_skips(cases, DECLARED)
    assert [(r.reason, r.count, r.stacks) for r in groups[DEVICE_GROUP]] == [
        (NO_CARD, 3, ("default", LEGACY))]
    assert sorted((r.count, r.stacks) for r in groups[STACK_GROUP]) == [(1, (LEGACY,))] * 2
    assert {r.reason.split(":")[0] for r in groups[STACK_GROUP]} == {
        f"vllm-cpu does not run on stack {LEGACY}", f"suite capacity does not run on stack {LEGACY}"}
    assert [(r.count, r.stacks) for r in groups[OTHER_GROUP]] == [(1, (LEGACY,))]


def test_hil_report_remakes_the_merged_summary_only_for_the_same_results(tmp_path):
    text = two_stack_run(tmp_path)
    assert text.startswith(f"# vllm-hil run: 2 stacks (default, {LEGACY})")
    again = write_report_summary(tmp_path / "allure-results", tmp_path / "summary.md")
    assert again == text
    # Results that are not the run's any more (another run into the folder): the plain summary.
    (tmp_path / "allure-results" / "0-result.json").write_text(json.dumps(
        {"uuid": "0", "name": "t", "status": "passed"}))
    assert write_report_summary(tmp_path / "allure-results", tmp_path / "summary.md") \
        .startswith("# vllm-hil run\n")


def test_what_each_stack_lacks_is_said_once_in_the_merged_summary(tmp_path):
    text = two_stack_run(tmp_path)
    heading = "## What each stack does not have (not collected)"
    assert text.count(heading) == 1
    (table,) = tables(section(text, heading))
    assert table[0] == "| stack | not collected | why |"
    assert "| default | spyre-eager-cb | sendnn-inference 2.x removed plain continuous batching:" \
        " decoders always run chunked prefill (spyre-eager-cp) |" in table
    assert f"| {LEGACY} | suite capacity | {NO_CAPACITY}" in table[-1]
    # Not again in the stacks' own parts.
    for stack in ("default", LEGACY):
        assert heading.removeprefix("## ") not in (tmp_path / "stacks" / stack / "summary.md") \
            .read_text()
