"""A quarantine entry is judged against the whole suite, not the selection: a run narrowed by
node ids (``FILE::test``) or ``-k`` does not make an entry of an existing test "match no
collected test" (a warning, refused under --strict-quarantine); and an entry that matches
every test of the suite (``*``, ``suites/*``...) is refused: it would report every failure as
known. Pure functions (harness/lab/quarantine.py), a property-based test of them, and child
pytest runs of a small suite for the plugin's side (harness/plugin/ordering.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core.paths import REPO_ROOT
from harness.lab.quarantine import (
    KnownFailure,
    everything_refusal,
    judge_quarantine,
    matches_every_test,
)
from tests.suite_runner import CHECKOUT_PLUGINS

S = "suites/test_s.py"
RUN = [(f"{S}::test_a[tiny-llama-vllm-cpu-pair]", ("vllm-cpu", "tiny-llama")),
       (f"{S}::test_a[tiny-llama-vllm-cpu-long]", ("vllm-cpu", "tiny-llama")),
       (f"{S}::test_b", ())]
FILES = [S, "suites/test_t.py"]


@pytest.mark.parametrize("pattern, every", [
    ("*", True), ("*::*", True), ("suites/*", True), ("suites/test_*.py::*", True),
    (f"{S}::*", False),  # one file of two
    ("*[*]", False),  # test_b has no parameters
    ("*vllm-cpu*", False),  # one target: on another it would not match
    ("*tiny-llama*", False),  # one model
    (f"{S}::test_b", False),  # a literal names one test
    ("suites/test_s*", False),
])
def test_an_entry_matches_every_test_only_when_it_would_in_any_run(pattern, every):
    assert matches_every_test(KnownFailure(pattern, "r", "I"), RUN, FILES) is every


def test_an_entry_of_everything_is_refused_naming_it():
    entries = [KnownFailure(f"{S}::test_b", "r", "I", "q.toml: known #1"),
               KnownFailure("suites/*", "r", "I", "q.toml: known #2")]
    assert everything_refusal(entries, RUN, FILES) == (
        "q.toml: known #2 ('suites/*') matches every test of the suite (the 3 tests of the"
        " files collected here, on every target and model): a quarantine of everything reports"
        " every failure as known; name the tests it holds for (a file, a test, its parameter"
        " ids)")
    assert everything_refusal(entries[:1], RUN, FILES) is None
    assert everything_refusal(entries, [], FILES) is None  # nothing collected: nothing judged


# ------------------------------------------------------------------ property-based

NAMES = st.sampled_from(["test_a", "test_b", "test_c", "test_free", "test_order"])
PARAMS = st.lists(st.sampled_from(["tiny-llama-vllm-cpu-pair", "tiny-granite-vllm-cpu-long",
                                   "tiny-llama-spyre-eager-cp-pair"]), unique=True, max_size=3)
SUITE = st.dictionaries(st.sampled_from(["suites/test_s.py", "suites/test_t.py"]),
                        st.dictionaries(NAMES, PARAMS, min_size=1, max_size=3),
                        min_size=1, max_size=2)


def _tests(suite: dict[str, dict[str, list[str]]]) -> list[tuple[str, tuple[str, ...]]]:
    out = []
    for file, tests in suite.items():
        for name, params in tests.items():
            if not params:
                out.append((f"{file}::{name}", ()))
            for p in params:
                variant = re.search(r"vllm-cpu|spyre-eager-cp", p).group(0)
                out.append((f"{file}::{name}[{p}]", (variant, p.split("-vllm")[0]
                                                     .split("-spyre")[0])))
    return out


def _wildcarded(nodeid: str, holes: list[int]) -> str:
    """``nodeid`` with some of its characters made wildcards (``*`` for a run of them)."""
    chars = list(nodeid)
    for h in sorted({h % len(chars) for h in holes}, reverse=True):
        chars[h] = "*"
    return re.sub(r"\*+", "*", "".join(chars))


@settings(max_examples=300, deadline=None)
@given(suite=SUITE, picks=st.lists(st.tuples(st.integers(0, 99), st.lists(st.integers(0, 200),
                                                                          max_size=3)),
                                   min_size=1, max_size=4),
       selected=st.lists(st.integers(0, 99), max_size=3))
def test_entries_of_existing_tests_are_never_flagged_whatever_the_selection(suite, picks,
                                                                            selected):
    whole = _tests(suite)
    # The plugin judges against the whole suite, whatever was selected (a node id, -k):
    # the selection below only narrows what runs, never what the entries are judged by.
    narrowed = [whole[i % len(whole)] for i in selected] or whole
    entries, seen = [], set()
    for n, (pick, holes) in enumerate(picks, 1):
        pattern = _wildcarded(whole[pick % len(whole)][0], holes)
        if pattern not in seen:
            seen.add(pattern)
            entries.append(KnownFailure(pattern, "r", "I", f"q: known #{n}"))
    check = judge_quarantine(entries, whole, other_ids=["vllm-cpu", "spyre-eager-cp",
                                                        "tiny-llama", "tiny-granite"])
    assert check.unmatched == [], (narrowed, check.warnings())
    files = sorted(suite)
    for k in entries:
        every = matches_every_test(k, whole, files)
        if every:  # then it matches each test of the suite, on any target and model
            assert all(k.matches(n) for n, _ in whole)
            assert "*" in k.test or "?" in k.test
        if k.test == "*":
            assert every
    refusal = everything_refusal(entries, whole, files)
    assert (refusal is None) == (not any(matches_every_test(k, whole, files) for k in entries))
    if refusal:
        assert re.match(r"q: known #\d+ \('.*'\) matches every test of the suite", refusal)


# ------------------------------------------------------------------ the plugin, in a child run

SMALL_SUITE = {
    "test_a.py": "import pytest\n\n\n@pytest.mark.parametrize('p', ['x', 'y'])\n"
                 "def test_one(p):\n    pass\n\n\ndef test_two():\n    pass\n",
    "test_b.py": "def test_three():\n    pass\n",
}
ENTRY = '[[known]]\ntest = "{}"\nreason = "r"\nissue = "I-1"\n'


def child(tmp_path: Path, entries: list[str], *selection: str) -> subprocess.CompletedProcess:
    for name, body in SMALL_SUITE.items():
        (tmp_path / name).write_text(body)
    (tmp_path / "q.toml").write_text("".join(ENTRY.format(e) for e in entries))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *CHECKOUT_PLUGINS,
           "--collect-only", f"--hil-reports-dir={tmp_path / 'reports'}",
           f"--quarantine={tmp_path / 'q.toml'}", "--strict-quarantine", *selection]
    return subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
                          capture_output=True, text=True, timeout=300)


def test_a_run_narrowed_by_node_ids_judges_entries_against_the_whole_file(tmp_path):
    """Before: ``pytest FILE::test_two`` made the entries of test_one warn "has no test
    'test_one'" (refused under --strict-quarantine); now they match test_one in the file, and
    only the entry of a test the file does not have is flagged."""
    run = child(tmp_path, ["test_a.py::test_one[y]", "test_a.py::test_one[*]",
                           "test_a.py::test_gone"], "test_a.py::test_two", "test_b.py::test_three")
    out = run.stdout + run.stderr
    assert run.returncode == 4, out[-3000:]
    assert ("ERROR: --strict-quarantine: " in out and "known #3 ('test_a.py::test_gone')"
            " matches no collected test: test_a.py has no test 'test_gone'" in out), out[-3000:]
    assert "known #1" not in out and "known #2" not in out and "Traceback" not in out


def test_a_run_narrowed_by_k_judges_entries_against_the_whole_suite(tmp_path):
    run = child(tmp_path, ["test_a.py::test_one[y]", "test_a.py::test_one[*]"],
                "test_a.py", "-k", "two")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "matches no collected test" not in out and "Traceback" not in out


def test_an_entry_of_every_test_is_refused_in_a_child_run(tmp_path):
    run = child(tmp_path, ["test_*"], "test_b.py::test_three")
    out = run.stdout + run.stderr
    assert run.returncode == 4, out[-3000:]
    assert ("ERROR: --quarantine: " in out and "known #1 ('test_*') matches every test of the"
            " suite" in out), out[-3000:]
    assert "Traceback" not in out
