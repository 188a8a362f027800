"""`hil report` and the merge never destroy what they read or what they do not own: an
--output that is a results, reports or source folder, or holds files of the user's, is
refused; a merge checks every source before it replaces merged-results; copies of one shard
are refused; the shard durations are merged, never shrunk; a write error or a result file of
the wrong shape is named, never a traceback."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from harness import cli
from harness.report import generate
from harness.report.report_output import MARKER
from harness.report.results import load_results
from tests.bad_input import assert_nothing_lost, earlier_run

FAKE_ALLURE = '#!/bin/sh\nmkdir -p "$4" && echo "<html>report</html>" > "$4/index.html"\n'


@pytest.fixture
def tool(tmp_path_factory, monkeypatch):
    """A stand-in for the Allure command line: writes index.html in no time."""
    script = tmp_path_factory.mktemp("tool") / "allure"
    script.write_text(FAKE_ALLURE)
    script.chmod(0o755)
    monkeypatch.setattr(generate, "find_tool", lambda env=None: (str(script), "/bin/sh"))
    return script


def result(folder: Path, name: str, uid: str, start: int = 1000, **extra: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    body: dict[str, object] = {
            "uuid": uid, "name": name, "status": "passed", "start": start, "stop": start + 2000,
            "historyId": f"h-{name}", "labels": [{"name": "nodeid", "value": f"t.py::{name}"}]}
    body.update(extra)
    (folder / f"{uid}-result.json").write_text(json.dumps(body))


def shard(root: Path, label: str | None, names: list[str], start: int = 1000) -> Path:
    results = root / "allure-results"
    for i, name in enumerate(names):
        result(results, name, f"{root.name}-{i}", start=start + i)
    props = "host=lab\n" + (f"run.shard={label} by count (durations: none)\n" if label else "")
    (results / "environment.properties").write_text(props)
    return root


def snapshot(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("output, what", [
    ("{r}", "is or contains the reports folder"),
    ("{r}/allure-results", "is or contains the results folder"),
    ("{r}/allure-results/html", "is inside the results folder"),
    ("{t}", "is or contains the reports folder"),
    ("{t}/mine", "holds files that are not a report of `hil report` (no .hil-report marker)"),
    ("{t}/mine/notes.txt", "is a file, not a folder"),
])
def test_an_output_that_would_replace_what_it_does_not_own_is_refused(tmp_path, capsys, tool,
                                                                      output, what):
    reports = tmp_path / "reports"
    files = earlier_run(reports)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    files[tmp_path / "mine" / "notes.txt"] = b"mine"
    out = output.format(r=reports, t=tmp_path)
    assert cli.main(["report", "--reports-dir", str(reports), "--output", out]) == 2
    err = capsys.readouterr().err
    assert f"hil report: --output {out} {what}" in err and "Nothing was changed" in err
    assert_nothing_lost(files)


def test_a_report_it_wrote_is_replaced_and_marked(tmp_path, capsys, tool):
    reports = tmp_path / "reports"
    earlier_run(reports)
    result(reports / "allure-results", "a", "u1")
    out = tmp_path / "elsewhere" / "report"
    for _ in range(2):  # new, then its own marked report
        assert cli.main(["report", "--reports-dir", str(reports), "--output", str(out)]) == 0
        assert (out / MARKER).is_file() and (out / "index.html").is_file()
    # The default place: a report from before the marker existed is replaced too.
    assert cli.main(["report", "--reports-dir", str(reports)]) == 0
    assert (reports / "allure-report" / MARKER).is_file()
    assert not list(out.parent.glob(".report-*")) and not list(reports.glob(".allure-report-*"))


def test_a_failed_generation_keeps_the_previous_report(tmp_path, capsys, tool):
    reports = tmp_path / "reports"
    files = earlier_run(reports)
    tool.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    assert cli.main(["report", "--reports-dir", str(reports)]) == 1
    assert "allure generate failed (exit 3); the previous report is kept" in capsys.readouterr().err
    files.pop(reports / "summary.md")  # remade from the same results
    assert_nothing_lost(files)
    assert not list(reports.glob(".allure-report-*"))


def test_a_refused_merge_keeps_the_merged_results(tmp_path, capsys, tool):
    reports = tmp_path / "reports"
    a, b = shard(tmp_path / "a", "1/2", ["t1"]), shard(tmp_path / "b", "2/2", ["t2"])
    assert cli.main(["report", "--reports-dir", str(reports), str(a), str(b)]) == 0
    kept = snapshot(reports)
    assert cli.main(["report", "--reports-dir", str(reports), str(a), str(tmp_path / "typo")]) == 2
    assert f"hil report: {tmp_path / 'typo'}: no such folder or archive" in capsys.readouterr().err
    assert snapshot(reports) == kept
    # A source that is the merged results themselves would be replaced: refused.
    assert cli.main(["report", "--reports-dir", str(reports),
                     str(reports / "merged-results"), str(b)]) == 2
    assert "which the merge replaces; copy it elsewhere first" in capsys.readouterr().err
    assert snapshot(reports) == kept


@pytest.mark.parametrize("relabel", ["2/2", "1/2"])
def test_a_shard_merged_with_a_copy_of_itself_is_refused(tmp_path, capsys, tool, relabel):
    reports = tmp_path / "reports"
    a = shard(tmp_path / "a", "1/2", ["t1", "t2"])
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    (copy / "allure-results" / "environment.properties").write_text(
        f"host=lab\nrun.shard={relabel} by count (durations: none)\n")
    assert cli.main(["report", "--reports-dir", str(reports), str(a), str(copy)]) == 2
    err = capsys.readouterr().err
    assert f"hil report: {a} and {copy} hold 2 identical test result(s) (the same result uuids)" in err
    assert "one is a copy of the other" in err
    assert not (reports / "merged-results").exists()


def test_a_copy_with_new_file_names_is_refused_by_its_start_times(tmp_path, capsys, tool):
    reports = tmp_path / "reports"
    a = shard(tmp_path / "a", "1/2", ["t1"])
    b = shard(tmp_path / "b", "2/2", ["t1"])  # same test, same start: not another run
    assert cli.main(["report", "--reports-dir", str(reports), str(a), str(b)]) == 2
    assert "(the same tests with the same start times) (labelled shard 1/2 (lab) and shard 2/2" \
           " (lab))" in capsys.readouterr().err


def test_durations_are_merged_never_shrunk(tmp_path, capsys, tool):
    reports = tmp_path / "reports"
    known = {f"t.py::t{i}": 1.0 for i in range(34)}
    reports.mkdir()
    (reports / "durations.json").write_text(json.dumps({"source": "nightly", "tests": known}))
    for name in ("t0", "new"):  # a -k run: two tests
        result(reports / "allure-results", name, f"u-{name}")
    (reports / "allure-results" / "environment.properties").write_text("host=lab\n")
    assert cli.main(["report", "--reports-dir", str(reports)]) == 0
    tests = json.loads((reports / "durations.json").read_text())["tests"]
    assert len(tests) == 35 and tests["t.py::t0"] == 2.0 and tests["t.py::t1"] == 1.0
    # The merge of complete shards updates the same way.
    a, b = shard(tmp_path / "a", "1/2", ["t2"]), shard(tmp_path / "b", "2/2", ["t3"], start=9)
    assert cli.main(["report", "--reports-dir", str(reports), str(a), str(b)]) == 0
    tests = json.loads((reports / "durations.json").read_text())["tests"]
    assert len(tests) == 35 and tests["t.py::t2"] == 2.0 and tests["t.py::t4"] == 1.0


def test_an_interrupted_run_gives_no_durations(tmp_path, tool):
    reports = tmp_path / "reports"
    result(reports / "allure-results", "a", "u1")
    (reports / "allure-results" / "environment.properties").write_text(
        "host=lab\nrun.interrupted=stopped by SIGTERM after 1 test result(s)\n")
    assert cli.main(["report", "--reports-dir", str(reports)]) == 0
    assert not (reports / "durations.json").exists()
    assert (reports / "summary.md").read_text().startswith("**INTERRUPTED**: stopped by SIGTERM")


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS])
def test_a_write_error_keeps_the_previous_summary_and_report(tmp_path, capsys, tool,
                                                             monkeypatch, err):
    reports = tmp_path / "reports"
    files = earlier_run(reports)

    def full(src, dst):
        raise OSError(err, os.strerror(err), str(dst))

    monkeypatch.setattr(os, "replace", full)
    assert cli.main(["report", "--reports-dir", str(reports)]) == 2
    text = capsys.readouterr().err
    assert f"hil report: cannot write the report: {reports / 'summary.md'}: {os.strerror(err)}" \
           in text and "the previous report is kept" in text
    assert_nothing_lost(files)
    assert sorted(p.name for p in reports.iterdir()) == sorted(
        ["allure-results", "allure-report", "stats", "devices", "summary.md", ".hil-lock"])


@pytest.mark.parametrize("field, value, problem", [
    ("status", 5, "status 5 (expected one of passed, failed, broken, skipped, unknown)"),
    ("labels", "x", "labels is a JSON str, not a list"),
    ("start", "a", "start 'a' is not a number of milliseconds"),
    ("attachments", 1, "attachments is a JSON int, not a list"),
    ("steps", [{"attachments": [3]}], "steps[0].attachments holds an item that is not an object"),
    ("statusDetails", [], "statusDetails is a JSON list, not an object"),
    ("parameters", [["device", "card0"]], "parameters holds an item that is not an object"),
    ("historyId", 7, "historyId 7 is not a string"),
])
def test_a_result_of_the_wrong_shape_is_named_and_skipped(tmp_path, capsys, tool, field, value,
                                                          problem):
    reports = tmp_path / "reports"
    result(reports / "allure-results", "good", "u1")
    result(reports / "allure-results", "bad", "u2")
    bad = reports / "allure-results" / "u2-result.json"
    bad.write_text(json.dumps({**json.loads(bad.read_text()), field: value}))
    folder = load_results(reports / "allure-results")
    assert [t["name"] for t in folder.tests] == ["good"]
    assert f"{bad}: skipped: not an Allure test result ({problem})" in folder.problems
    assert cli.main(["report", "--reports-dir", str(reports)]) == 0
    assert f"hil report: warning: {bad}: skipped" in capsys.readouterr().err
