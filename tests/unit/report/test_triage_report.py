"""Triage in the report: a triaged failure's labels and description, summary.md's Triage
section read back from the results (merged shards too), the terminal summary's lines from the
statistics, and failure categories that the appended triage paragraph does not move."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from harness.core.triage import (
    BATCHING,
    ERROR,
    FAILED,
    FLAKY,
    NOT_RUN,
    PASSED,
    TriageResult,
    TriageRun,
)
from harness.lab_merge.merge import merge_results
from harness.report.categories import categories_json, classify
from harness.report.evidence import CallEvidence
from harness.report.results import load_results
from harness.report.summary import summarize, summary_markdown, summary_text
from harness.report.triage_report import (
    description_with_triage,
    labels_for,
    rows_from_results,
    rows_from_stats,
    terminal_lines,
    triage_markdown,
)
from tests.allure_results import allure_result
from tests.unit.report.test_report import _real_messages

NODE = "suites/t.py::b"
BATCH_VERDICT = "depends on batching: fails only when decoded with another request"


def batching_result(nodeid: str = NODE, seconds: float = 42.0) -> TriageResult:
    runs = (
        TriageRun("repeat", "as run #1", "default:vllm-cpu", ("r0", "r1"), FAILED, "mismatch", 5.0),
        TriageRun("repeat", "as run #2", "default:vllm-cpu", ("r0", "r1"), FAILED, "mismatch", 5.0),
        TriageRun("batching", "alone (r0)", "default:vllm-cpu", ("r0",), PASSED, "", 3.0),
        TriageRun("chunked", "chunks of 64", "default:vllm-cpu", ("r0", "r1"), ERROR, "refused"),
        TriageRun("stack", "on spyre-1.10", "-", (), NOT_RUN, "not installed"),
    )
    return TriageResult(nodeid, "token_equality", BATCHING, BATCH_VERDICT, runs, seconds)


def triaged(name: str, result: TriageResult, uuid: str = "u1") -> dict:
    """An Allure result of a failed test carrying ``result``'s labels, as the plugin writes it."""
    t = allure_result(name, "failed", "VerdictFailed: [check token_equality] token mismatch:"
                      f" request 'r0'\n\ntriage: {result.verdict}", uuid=uuid,
                      check="token_equality")
    t["labels"] += [{"name": n, "value": v} for n, v in labels_for(result)]
    return t


def test_labels_name_the_key_as_a_label_and_a_tag_and_carry_the_verdict():
    labels = labels_for(batching_result())
    assert ("triage", "batching") in labels
    assert ("tag", "triage: batching") in labels
    assert ("triage_verdict", BATCH_VERDICT) in labels
    assert ("triage_runs", "3") in labels  # the error and the run not made are not counted
    assert ("triage_seconds", "42.0") in labels


def test_the_description_keeps_the_docstring_and_adds_the_verdict():
    text = description_with_triage("""Tokens equal the reference.

        Greedy only.""", [batching_result()])
    assert text.startswith("Tokens equal the reference.\n\nGreedy only.\n\n")
    assert f"**triage of token_equality: {BATCH_VERDICT}** (3 runs, 42.0 s" in text
    assert description_with_triage(None, [batching_result()]).startswith("**triage of")


def test_call_evidence_keeps_the_triage_of_its_test():
    evidence = CallEvidence()
    assert evidence.empty
    evidence.on_triage(batching_result())
    assert evidence.triage == [batching_result()] and not evidence.empty


def test_summary_lists_each_triaged_failure_with_check_verdict_runs_and_seconds():
    tests = [allure_result("a", "passed"), triaged("b", batching_result()),
             allure_result("c", "failed", "VerdictFailed: [check token_equality] x",
                           uuid="u3", check="token_equality")]
    s = summarize(tests)
    md = summary_markdown(s)
    assert "## Triage" in md
    assert f"| `{NODE}` | token_equality | {BATCH_VERDICT} | 3 | 42.0 |" in md
    assert "1 failure(s) re-run under varied conditions, 42.0 s in all" in md
    # Still filed and listed as a token mismatch, with its first line only.
    assert "| token mismatch | 2 |" in md
    assert "triage:" not in md.split("## Failing tests")[1].split("## Triage")[0]


def test_a_run_without_triage_has_no_triage_section(tmp_path):
    tests = [allure_result("a", "passed"), allure_result("b", "failed", "AssertionError: x")]
    assert "## Triage" not in summary_text(tests, [], tmp_path / "stats")
    assert triage_markdown([]) == [] and terminal_lines([]) == []


def _shard(tmp_path, name: str, shard: str, test: dict) -> str:
    d = tmp_path / name / "allure-results"
    d.mkdir(parents=True)
    (d / f"{test['uuid']}-result.json").write_text(json.dumps(test))
    (d / f"{test['uuid']}-a-attachment.html").write_text("<html></html>")
    (d / "environment.properties").write_text(f"host={name}\nrun.shard={shard}\n")
    return str(tmp_path / name)


def test_merged_shards_keep_each_failure_s_triage(tmp_path):
    flaky = TriageResult("suites/t.py::c", "kv_ledger.conservation", FLAKY,
                         "nondeterministic: failed 1 of 3 (flaky)", (), 12.0)
    sources = [_shard(tmp_path, "h1", "1/2", triaged("b", batching_result(), uuid="u1")),
               _shard(tmp_path, "h2", "2/2", triaged("c", flaky, uuid="u2"))]
    merged = merge_results(sources, tmp_path / "merged")
    assert merged.complete, merged.problems
    rows = rows_from_results(load_results(tmp_path / "merged").tests)
    assert sorted((r.test, r.key, r.check) for r in rows) == [
        (NODE, "batching", "token_equality"),
        ("suites/t.py::c", "flaky", "kv_ledger.conservation")]
    assert "nondeterministic: failed 1 of 3 (flaky) | 0 | 12.0 |" in summary_markdown(
        summarize(load_results(tmp_path / "merged").tests))


def test_terminal_lines_name_each_test_and_the_total_and_skip_what_is_not_a_triage():
    rows, bad = rows_from_stats([batching_result().to_dict(), {"nodeid": "x"}, "junk"])
    assert len(rows) == 1 and len(bad) == 2
    assert terminal_lines(rows) == [
        f"triage: {NODE}: {BATCH_VERDICT} (3 runs, 42.0 s)",
        "triage: 1 failure(s) triaged in 42.0 s"]


RECORDED = "2026-12-07 03:12:45 UTC"


def reused_result(nodeid: str = NODE) -> TriageResult:
    """``batching_result`` reused from the record of a known failure made at RECORDED."""
    return replace(batching_result(nodeid, seconds=0.01), reused_from=RECORDED)


def test_a_reused_triage_is_labelled_with_the_date_it_was_made_and_a_fresh_one_is_not():
    assert ("triage_reused", RECORDED) in labels_for(reused_result())
    assert ("triage_reused", "no") in labels_for(batching_result())
    text = description_with_triage(None, [reused_result()])
    assert f"(3 runs, reused: triaged {RECORDED}, 0.0 s now;" in text
    assert reused_result().table().endswith(f"3 runs, reused: triaged {RECORDED}, 0.0 s now")


def test_summary_and_terminal_say_which_triages_were_reused():
    tests = [triaged("b", batching_result("suites/t.py::b"), uuid="u1"),
             triaged("c", reused_result("suites/t.py::c"), uuid="u2")]
    rows = rows_from_results(tests)
    assert [r.reused_from for r in rows] == ["", RECORDED]
    md = "\n".join(triage_markdown(rows))
    assert f"| {BATCH_VERDICT} (reused: triaged {RECORDED}) | 3 | 0.0 |" in md
    assert f"| {BATCH_VERDICT} | 3 | 42.0 |" in md
    assert "42.0 s in all; 1 of them known failure(s) whose recorded triage was reused" in md
    rows, bad = rows_from_stats([reused_result().to_dict()])
    assert not bad and terminal_lines(rows) == [
        f"triage: {NODE}: {BATCH_VERDICT} (reused: triaged {RECORDED}) (3 runs, 0.0 s)",
        "triage: 1 failure(s) triaged in 0.0 s; 1 of them known failure(s) whose recorded"
        " triage was reused, not re-run"]


# ------------------------------------------------------------------ categories


def _with_paragraph(message: str, where: str) -> str:
    """``message`` with the session's triage paragraph: after its first line, or at its end;
    the paragraph names other categories' words, as an inconclusive triage's errors may."""
    para = ("triage: inconclusive: 2 of 6 runs errored (engine vllm-cpu died with exit code -9;"
            " [check kv_ledger.conservation] device required but missing: gave no answer"
            " within 9 s)")
    if where == "end":
        return f"{message}\n\n{para}"
    first, _, rest = message.partition("\n")
    return f"{first}\n\n{para}\n" + rest


@pytest.mark.parametrize("where", ["after the first line", "end"])
@pytest.mark.parametrize("case", list(_real_messages()))
def test_the_triage_paragraph_moves_no_failure_to_another_category(case, where):
    status, message, check = _real_messages()[case]
    triaged_message = _with_paragraph(message, where)
    assert classify(status, triaged_message, check) == classify(status, message, check)
    assert classify(status, triaged_message) == classify(status, message)

    def allure_files(text: str) -> set[str]:  # as Allure applies categories.json
        return {e["name"] for e in categories_json()
                if status in e["matchedStatuses"] and re.fullmatch(e["messageRegex"], text)}

    assert allure_files(triaged_message) == allure_files(message)
