"""Merging shard results: the union of the shards, and every problem a lab must see named
(missing or doubled shards, tests run twice, other stacks or harness versions, other
plans), from folders and archives, without changing the sources."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
import zipfile
from pathlib import Path

import pytest

from harness.lab.shard_plan import load_durations
from harness.lab_merge import lab_report
from harness.lab_merge.merge import MergeError, merge_results, where_markdown
from harness.report.generate import ReportOutcome
from harness.report.results import load_results
from harness.report.run_config import format_properties, read_properties

PROPS = {"host": "lab-a", "vllm-hil commit": "abc123", "vLLM": "0.17.1", "vllm-spyre": "1.4.0",
         "stack.default": "vllm 0.17.1", "run.shard": "1/2 by count (durations: none)"}


def make_source(root: Path, shard: str | None, tests: list[str], host: str = "lab-a",
                status: str = "passed", start: int = 0, **props: str) -> Path:
    """A shard's reports folder: allure-results with one result per test, and its config."""
    results = root / "allure-results"
    results.mkdir(parents=True)
    env = {**PROPS, "host": host, **props}
    if shard is None:
        env.pop("run.shard")
    else:
        env["run.shard"] = f"{shard} by count (durations: none)"
    (results / "environment.properties").write_text(format_properties(env))
    for i, nodeid in enumerate(tests):
        uid = str(uuid.uuid4())
        (results / f"{uid}-result.json").write_text(json.dumps({
            "uuid": uid, "name": nodeid, "historyId": f"h-{nodeid}", "status": status,
            "start": start + 1000 * i, "stop": start + 1000 * i + 2500,
            "labels": [{"name": "nodeid", "value": nodeid}, {"name": "host", "value": host}],
            "parameters": [{"name": "device", "value": f"card{i % 2}"}],
        }))
    return root


def names(folder: Path) -> list[str]:
    return sorted(t["name"] for t in load_results(folder).tests)


def test_complete_shards_merge_into_their_union_with_no_problem(tmp_path):
    a = make_source(tmp_path / "a", "1/2", ["t1", "t2"], host="lab-a")
    b = make_source(tmp_path / "b", "2/2", ["t3"], host="lab-b")
    before = sorted(p.name for p in (a / "allure-results").iterdir())
    merged = merge_results([str(a), str(b / "allure-results")], tmp_path / "out")
    assert merged.complete and merged.problems == []
    assert names(merged.folder) == ["t1", "t2", "t3"]
    props = read_properties(merged.folder / "environment.properties")
    assert props["vLLM"] == "0.17.1"
    assert props["host"] == "lab-a [shard 1/2 (lab-a)]; lab-b [shard 2/2 (lab-b)]"
    assert props["merge.sources"] == "shard 1/2 (lab-a): 2 tests; shard 2/2 (lab-b): 1 tests"
    assert (merged.folder / "categories.json").is_file()
    assert sorted(p.name for p in (a / "allure-results").iterdir()) == before


def test_a_missing_shard_is_named(tmp_path):
    a = make_source(tmp_path / "a", "1/3", ["t1"])
    c = make_source(tmp_path / "c", "3/3", ["t3"])
    merged = merge_results([str(a), str(c)], tmp_path / "out")
    assert not merged.complete
    assert any("missing shard(s) of 3: 2/3" in p for p in merged.problems), merged.problems


def test_a_shard_merged_twice_is_named(tmp_path):
    """Shard 1/2 run twice (another night): named; a copy of one folder is refused
    (tests/unit/report/test_results_kept.py)."""
    a = make_source(tmp_path / "a", "1/2", ["t1"])
    again = make_source(tmp_path / "again", "1/2", ["t1"], start=86_400_000)
    b = make_source(tmp_path / "b", "2/2", ["t2"])
    merged = merge_results([str(a), str(again), str(b)], tmp_path / "out")
    assert not merged.complete
    assert any(p.startswith("shard 1/2 merged 2 times") for p in merged.problems)


def test_shards_of_another_stack_or_harness_version_are_named(tmp_path):
    a = make_source(tmp_path / "a", "1/3", ["t1"], host="lab-a")
    b = make_source(tmp_path / "b", "2/3", ["t2"], host="lab-b", **{"vllm-spyre": "1.3.0"})
    c = make_source(tmp_path / "c", "3/3", ["t3"], host="lab-c", **{"vllm-hil commit": "def456"})
    merged = merge_results([str(a), str(b), str(c)], tmp_path / "out")
    assert merged.complete  # all shards are there; the versions are a warning
    text = "\n".join(merged.problems)
    assert "vllm-spyre differs between shards: most ran 1.4.0; shard 2/3 (lab-b): 1.3.0" in text
    assert "vllm-hil commit differs between shards: most ran abc123; shard 3/3 (lab-c): def456" in text


def test_shards_planned_from_different_durations_are_named(tmp_path):
    a = make_source(tmp_path / "a", "1/2", ["t1"])
    b = make_source(tmp_path / "b", "2/2", ["t2"])
    env = b / "allure-results" / "environment.properties"
    props = read_properties(env)
    props["run.shard"] = "2/2 by time sha256:0123456789ab (durations: d.json)"
    env.write_text(format_properties(props))
    merged = merge_results([str(a), str(b)], tmp_path / "out")
    assert not merged.complete
    assert any("planned the split differently" in p for p in merged.problems)


def test_tests_run_twice_are_named_in_the_summary(tmp_path, monkeypatch):
    a = make_source(tmp_path / "a", "1/2", ["t1", "t2"])
    b = make_source(tmp_path / "b", "2/2", ["t2"], host="lab-b")
    monkeypatch.setattr(lab_report, "generate_report",
                        lambda *a, **k: ReportOutcome(report_dir=tmp_path, generated=True))
    reports = tmp_path / "reports"
    rc = lab_report.merge_command([str(a), str(b)], reports, reports / "allure-report",
                                  reports / "summary.md")
    summary = (reports / "summary.md").read_text()
    assert "1 test(s) ran more than once in these results" in summary and ": t2" in summary
    assert rc == 0  # shards complete; the duplicate is reported, as for one host


def _tar(src: Path, dest: Path) -> Path:
    with tarfile.open(dest, "w:gz") as t:
        t.add(src, arcname="reports")
    return dest


def _zip(src: Path, dest: Path) -> Path:
    with zipfile.ZipFile(dest, "w") as z:
        for p in src.rglob("*"):
            z.write(p, p.relative_to(src.parent))
    return dest


def test_archives_are_sources_too(tmp_path):
    a = make_source(tmp_path / "a", "1/2", ["t1"])
    b = make_source(tmp_path / "b", "2/2", ["t2"])
    merged = merge_results([str(_tar(a, tmp_path / "a.tar.gz")), str(_zip(b, tmp_path / "b.zip"))],
                           tmp_path / "out")
    assert merged.complete and names(merged.folder) == ["t1", "t2"]


def test_an_archive_that_writes_outside_is_refused(tmp_path):
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("../escape-result.json", "{}")
    with pytest.raises(MergeError, match="outside the extraction folder"):
        merge_results([str(bad)], tmp_path / "out")
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as t:
        info = tarfile.TarInfo("../../escape-result.json")
        info.size = 2
        t.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(MergeError, match="cannot extract"):
        merge_results([str(evil)], tmp_path / "out")
    assert not (tmp_path / "escape-result.json").exists()


@pytest.mark.parametrize("given, why", [("nowhere", "no such folder or archive"),
                                        ("file.txt", "not a folder and not a"),
                                        ("empty", "no allure-results folder")])
def test_a_source_that_is_not_results_is_a_clear_error(tmp_path, given, why):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MergeError, match=why):
        merge_results([str(tmp_path / given)], tmp_path / "out")


def test_the_summary_says_which_host_and_card_ran_each_test_and_durations_are_kept(
        tmp_path, monkeypatch):
    a = make_source(tmp_path / "a", "1/2", ["t1", "t2"], host="lab-a")
    b = make_source(tmp_path / "b", "2/2", ["t3"], host="lab-b")
    monkeypatch.setattr(lab_report, "generate_report",
                        lambda *a, **k: ReportOutcome(report_dir=tmp_path, generated=True))
    reports = tmp_path / "reports"
    assert lab_report.merge_command([str(a), str(b)], reports, reports / "allure-report",
                                    reports / "summary.md") == 0
    summary = (reports / "summary.md").read_text()
    assert "# vllm-hil run, 2 shard(s) merged" in summary
    assert "| lab-a | card0 | 1 |" in summary and "| lab-b | card0 | 1 |" in summary
    assert "| `t2` | lab-a | card1 | passed |" in summary
    assert load_durations(reports / "durations.json") == {"t1": 2.5, "t2": 2.5, "t3": 2.5}


def test_an_incomplete_merge_fails_and_keeps_no_durations(tmp_path, monkeypatch):
    a = make_source(tmp_path / "a", "1/2", ["t1"])
    monkeypatch.setattr(lab_report, "generate_report",
                        lambda *a, **k: ReportOutcome(report_dir=tmp_path, generated=True))
    reports = tmp_path / "reports"
    assert lab_report.merge_command([str(a)], reports, reports / "allure-report",
                                    reports / "summary.md") == 1
    assert "missing shard(s) of 2: 2/2" in (reports / "summary.md").read_text()
    assert not (reports / "durations.json").exists()


def test_where_markdown_of_no_tests_is_empty():
    assert where_markdown([]) == ""


def test_an_unsharded_run_keeps_its_durations_and_a_single_shard_does_not(tmp_path):
    whole = make_source(tmp_path / "whole", None, ["t1", "t2"])
    assert lab_report.keep_durations(whole / "allure-results", tmp_path / "r1") is not None
    assert load_durations(tmp_path / "r1" / "durations.json") == {"t1": 2.5, "t2": 2.5}
    one = make_source(tmp_path / "one", "1/2", ["t1"])
    assert lab_report.keep_durations(one / "allure-results", tmp_path / "r2") is None
    assert not (tmp_path / "r2" / "durations.json").exists()


def test_two_shards_that_differ_name_the_second_against_the_first(tmp_path):
    a = make_source(tmp_path / "a", "1/2", ["t1"], host="lab-a")
    b = make_source(tmp_path / "b", "2/2", ["t2"], host="lab-b", vLLM="0.17.0")
    merged = merge_results([str(a), str(b)], tmp_path / "out")
    assert merged.problems == ["vLLM differs between shards: shard 1/2 (lab-a) ran 0.17.1;"
                               " shard 2/2 (lab-b): 0.17.0"]
