"""A triaged failure is shown where people look: its Allure result (labels, tag, description,
the table attached) and summary.md, from a real pytest run; the terminal summary, from the
workers' statistics files, older ones without the key included."""

import json

from harness.plugin.summary import write_summary
from tests.bad_input import write
from tests.suite_runner import Reporter, config_for, run_with_allure
from tests.unit.report.test_triage_report import BATCH_VERDICT, batching_result

TRIAGED_SUITE = '''
from harness.core.verdict import Verdict, VerdictFailed
from harness.core.triage import TriageResult


def test_triaged(hil):
    """Greedy tokens equal the reference."""
    result = TriageResult.from_dict(RESULT)
    hil.listeners.on_triage(result)
    raise VerdictFailed(Verdict.failed("token_equality", "token mismatch: request 'r0'"))


def test_passes(hil):
    pass
'''


def test_a_triaged_failure_carries_its_labels_description_and_table(tmp_path):
    from harness.report.results import labels_of, load_results
    from harness.report.summary import write_summary as write_summary_md

    result = batching_result("test_triaged.py::test_triaged")
    suite = write(tmp_path, "test_triaged.py",
                  f"RESULT = {result.to_dict()!r}\n" + TRIAGED_SUITE)
    run, results = run_with_allure(tmp_path, suite)
    assert run.returncode == 1, run.stdout + run.stderr
    tests = {t["name"]: t for t in load_results(results).tests}
    failed, passed = tests["triaged"], tests["passes"]
    labels = labels_of(failed)
    assert labels["triage"] == ["batching"]
    assert "triage: batching" in labels["tag"]
    assert labels["triage_verdict"] == [BATCH_VERDICT]
    assert labels["check"] == ["token_equality"]
    assert failed["description"].startswith("Greedy tokens equal the reference.\n\n**triage of")
    attached = {a["name"]: a for a in failed["attachments"]}
    table = (results / attached["triage"]["source"]).read_text()
    assert table == result.table()
    assert json.loads((results / attached["triage (JSON)"]["source"]).read_text()) == \
        result.to_dict()
    assert "triage" not in labels_of(passed)
    md = write_summary_md(results, tmp_path / "summary.md")
    assert f"| `test_triaged.py::test_triaged` | token_equality | {BATCH_VERDICT} | 3 |" in md


def stats(**extra) -> dict:
    return {"engines_started": 0, "engines": [], "reference_hits": 0, "reference_misses": 0,
            "near_ties": [], **extra}


def test_the_terminal_summary_lists_each_triage_and_the_total(tmp_path):
    (tmp_path / "stats").mkdir()
    other = batching_result("suites/t.py::c", seconds=8.0)
    write(tmp_path / "stats", "gw0.json", json.dumps(stats(triage=[batching_result().to_dict()])))
    write(tmp_path / "stats", "gw1.json", json.dumps(stats(triage=[other.to_dict()])))
    write(tmp_path / "stats", "old.json", json.dumps(stats()))  # a run from before triage
    tr = Reporter()
    write_summary(tr, config_for(tmp_path))
    assert f"triage: suites/t.py::b: {BATCH_VERDICT} (3 runs, 42.0 s)" in tr.lines
    assert f"triage: suites/t.py::c: {BATCH_VERDICT} (3 runs, 8.0 s)" in tr.lines
    assert tr.lines[-1] == "triage: 2 failure(s) triaged in 50.0 s"
    assert not any(line.startswith("WARNING") for line in tr.lines)


def test_a_statistics_file_with_a_bad_triage_is_named_and_the_rest_kept(tmp_path):
    (tmp_path / "stats").mkdir()
    write(tmp_path / "stats", "gw0.json", json.dumps(stats(triage={"not": "a list"})))
    write(tmp_path / "stats", "gw1.json",
          json.dumps(stats(triage=[{"nodeid": "half"}, batching_result().to_dict()])))
    tr = Reporter()
    write_summary(tr, config_for(tmp_path))
    warnings = [line for line in tr.lines if line.startswith("WARNING")]
    assert any("gw0.json: not a statistics file of this harness" in w for w in warnings)
    assert any("a triage entry of the statistics is not one" in w for w in warnings)
    assert tr.lines[-1] == "triage: 1 failure(s) triaged in 42.0 s"


def test_a_run_that_triaged_nothing_prints_no_triage_lines(tmp_path):
    (tmp_path / "stats").mkdir()
    write(tmp_path / "stats", "main.json", json.dumps(stats(triage=[])))
    tr = Reporter()
    write_summary(tr, config_for(tmp_path))
    assert not any(line.startswith("triage") for line in tr.lines)
