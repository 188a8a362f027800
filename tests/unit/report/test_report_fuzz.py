"""Property-based tests of what `hil report` reads and where it writes.

1. Any bytes in an allure-results folder: the reader keeps each well-formed result and names
   every other file; the summary, the durations and the merge's tables are made; never an
   exception.
2. Random sequences of `hil report` and merge invocations with bad outputs and sources and
   corrupt result files: never a traceback; a refusal exits 2 naming the input and leaves the
   reports folder byte-identical; a report never changes the results it reads.

Bounded (hypothesis max_examples, the Allure tool a stand-in): a few seconds in all."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import cli
from harness.lab_merge.merge import durations_of, where_markdown
from harness.report import generate
from harness.report.results import load_results
from harness.report.stack_summary import write_report_summary

FAKE_ALLURE = '#!/bin/sh\nmkdir -p "$4" && echo "<html>report</html>" > "$4/index.html"\n'
FIELDS = ["uuid", "name", "status", "start", "stop", "historyId", "labels", "parameters",
          "steps", "attachments", "statusDetails", "fullName", "links"]

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8)


def good(i: int) -> dict[str, object]:
    return {"uuid": f"u{i}", "name": f"t{i}", "status": "passed", "start": 1000 * i,
            "stop": 1000 * i + 500, "historyId": f"h{i}",
            "labels": [{"name": "nodeid", "value": f"t.py::t{i}"}],
            "parameters": [{"name": "device", "value": "card0"}],
            "steps": [{"name": "s", "status": "passed", "attachments": [{"source": "a.txt"}]}],
            "statusDetails": {"message": "m"}}


# A result file's bytes: a good result with one field replaced, any JSON, or broken bytes.
MUTATED = st.builds(lambda i, k, v: json.dumps({**good(i), k: v}).encode(),
                    st.integers(0, 3), st.sampled_from(FIELDS), JSON)
RESULT_BYTES = st.one_of(MUTATED, JSON.map(lambda v: json.dumps(v).encode()),
                         st.binary(max_size=30),
                         MUTATED.map(lambda b: b[: len(b) // 2]))


@pytest.fixture
def fake_tool(tmp_path, monkeypatch):
    script = tmp_path / "allure"
    script.write_text(FAKE_ALLURE)
    script.chmod(0o755)
    monkeypatch.setattr(generate, "find_tool", lambda env=None: (str(script), "/bin/sh"))


@settings(max_examples=120, deadline=None)
@given(files=st.lists(RESULT_BYTES, min_size=1, max_size=4))
def test_the_reader_names_what_it_cannot_use(files):
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "allure-results"
        results.mkdir()
        for i, data in enumerate(files):
            (results / f"f{i}-result.json").write_bytes(data)
        folder = load_results(results)
        named = " ".join(folder.problems)
        for i in range(len(files)):
            path = results / f"f{i}-result.json"
            assert path in folder.results or f"{path}: skipped" in named
        write_report_summary(results, Path(tmp) / "summary.md", folder)
        durations_of(folder.tests)
        where_markdown(folder.tests)


def _shard(root: Path, label: str, first: int) -> Path:
    results = root / "allure-results"
    results.mkdir(parents=True)
    for i in (first, first + 1):
        (results / f"u{i}-result.json").write_text(json.dumps(good(i)))
    (results / "environment.properties").write_text(f"host=h\nrun.shard={label} by count\n")
    return root


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith(".hil-lock")}


OUTPUTS = ["", "{r}", "{r}/allure-results", "{t}/mine", "{t}/mine/notes.txt", "{t}/new",
           "{r}/allure-results/x", "{t}"]
SOURCES = ["{t}/a", "{t}/b", "{t}/copy", "{t}/typo", "{t}/mine/notes.txt", "{t}/empty",
           "{r}/merged-results"]
OPS = st.one_of(
    st.tuples(st.just("report"), st.sampled_from(OUTPUTS)),
    st.tuples(st.just("merge"), st.lists(st.sampled_from(SOURCES), min_size=1, max_size=3)),
    st.tuples(st.just("corrupt"), RESULT_BYTES),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=1, max_size=5))
def test_report_and_merge_never_lose_what_they_do_not_own(fake_tool, ops, capsys):
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        reports = t / "reports"
        (reports / "allure-results").mkdir(parents=True)
        (reports / "allure-results" / "u9-result.json").write_text(json.dumps(good(9)))
        (t / "mine").mkdir()
        (t / "mine" / "notes.txt").write_text("mine")
        (t / "empty").mkdir()
        a, b = _shard(t / "a", "1/2", 0), _shard(t / "b", "2/2", 2)
        shutil.copytree(a, t / "copy")
        (t / "copy" / "allure-results" / "environment.properties").write_text(
            "host=h\nrun.shard=2/2 by count\n")
        outside = {p: _snapshot(p) for p in (t / "mine", a, b, t / "copy")}
        for n, (op, arg) in enumerate(ops):
            if op == "corrupt":
                (reports / "allure-results" / f"c{n}-result.json").write_bytes(arg)
                continue
            before = _snapshot(reports)
            if op == "report":
                out = arg.format(r=reports, t=t)
                argv = ["report", "--reports-dir", str(reports), *(["--output", out] if out else [])]
                named = [out]
            else:
                srcs = [s.format(r=reports, t=t) for s in arg]
                argv = ["report", "--reports-dir", str(reports), *srcs]
                named = srcs
            rc = cli.main(argv)  # an exception fails the test: never a traceback
            err = capsys.readouterr().err
            assert rc in (0, 1, 2), (argv, rc, err)
            if rc == 2:
                assert _snapshot(reports) == before, (argv, err)
                assert any(x and x in err for x in named), (argv, err)
            else:
                results = {k: v for k, v in before.items() if "/allure-results/" in k
                           and k.startswith(str(reports / "allure-results"))}
                after = _snapshot(reports)
                assert all(after.get(k) == v for k, v in results.items()), argv
        assert {p: _snapshot(p) for p in outside} == outside
