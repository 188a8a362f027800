"""Nothing a command wrote is lost to a later run: each command's report is published only
when its run completed (``StagedReport``). A run that searched nothing, refused its input or
was stopped leaves the earlier report byte for byte and says, in one line, where it is and
where its own output went. The commands' work is faked here; their writing is real."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import types
from pathlib import Path

import pytest

from harness import cli

EARLIER_FINDINGS = b"# hil explore: 1 finding\n\n## Finding abc123: [check kv_ledger.x]\n"


def _kept(files: dict[Path, bytes]) -> None:
    for path, data in files.items():
        assert path.read_bytes() == data, f"{path} changed"


# ---------------------------------------------------------------- the mechanism


def test_a_completed_report_replaces_the_earlier_one(tmp_path):
    from harness.staging.staged_report import StagedReport

    (tmp_path / "r.md").write_text("earlier")
    (tmp_path / "other.txt").write_text("not the report's")
    with StagedReport(tmp_path, "cmd", "r.md") as out:
        (out.staging / "r.md").write_text("new")
        assert (tmp_path / "r.md").read_text() == "earlier"  # nothing published yet
        out.complete()
    assert (tmp_path / "r.md").read_text() == "new" and out.published
    assert (tmp_path / "other.txt").read_text() == "not the report's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt", "r.md"]  # no staging
    assert out.line == f"r.md written: {tmp_path / 'r.md'}"


def test_an_incomplete_run_keeps_the_earlier_report_and_says_where_both_are(tmp_path):
    from harness.staging.staged_report import StagedReport

    (tmp_path / "r.md").write_bytes(b"earlier\x00bytes")
    with StagedReport(tmp_path, "cmd", "r.md") as out:
        (out.staging / "r.md").write_text("half")
        out.incomplete("nothing was searched")
    assert (tmp_path / "r.md").read_bytes() == b"earlier\x00bytes" and not out.published
    assert out.kept is not None and out.kept.name.startswith("cmd-incomplete-")
    assert (out.kept / "r.md").read_text() == "half"
    assert out.line == (f"kept the earlier r.md at {tmp_path / 'r.md'}; this run's partial output"
                        f" (nothing was searched) at {out.kept}")


def test_a_run_that_wrote_nothing_leaves_no_folder(tmp_path):
    from harness.staging.staged_report import StagedReport

    with StagedReport(tmp_path, "cmd", "r.md") as out:
        pass  # refused: never completed
    assert list(tmp_path.iterdir()) == [] and out.kept is None
    assert out.line == f"no earlier r.md in {tmp_path}; this run wrote none (the run did not complete)"


def test_a_stop_keeps_the_earlier_report_and_carries_the_line(tmp_path):
    from harness.staging.interrupt import Stopped
    from harness.staging.staged_report import StagedReport

    (tmp_path / "r.md").write_text("earlier")
    with pytest.raises(Stopped) as stop:
        with StagedReport(tmp_path, "cmd", "r.md") as out:
            (out.staging / "r.md").write_text("half")
            raise Stopped(signal.SIGTERM)
    assert stop.value.signum == signal.SIGTERM
    assert (tmp_path / "r.md").read_text() == "earlier"
    assert out.kept is not None and out.kept.name.startswith("cmd-interrupted-")
    assert stop.value.kept == out.line and "kept the earlier r.md at" in out.line
    with pytest.raises(Stopped) as stop:  # Python's own Ctrl-C: a SIGINT
        with StagedReport(tmp_path, "cmd", "r.md"):
            raise KeyboardInterrupt
    assert stop.value.signum == signal.SIGINT


def test_the_staging_of_a_killed_run_is_tidied_by_the_next(tmp_path):
    from harness.staging.staged_report import StagedReport

    dead = tmp_path / ".cmd-staging-20260101-000000-999999999"
    dead.mkdir()
    (dead / "r.md").write_text("half")
    empty = tmp_path / ".cmd-staging-20260101-000000-999999998"
    empty.mkdir()
    live = tmp_path / f".cmd-staging-20260101-000000-{os.getpid()}"
    live.mkdir()
    with StagedReport(tmp_path, "cmd", "r.md") as out:
        out.complete()
    assert not dead.exists() and not empty.exists() and live.exists()
    (kept,) = tmp_path.glob("cmd-interrupted-*")
    assert (kept / "r.md").read_text() == "half"


# ---------------------------------------------------------------- hil explore


class _FakeSession:
    def model(self, name):
        return types.SimpleNamespace(label=name)

    def close(self):
        pass


def _fake_search(monkeypatch, run):
    """hil explore with its session, runner and search faked: ``run()`` is the search."""
    from harness.explore import runner, search, session

    monkeypatch.setattr(session, "open_session", lambda *a, **k: _FakeSession())
    monkeypatch.setattr(session, "usable_variant", lambda hil, v, model: (v, ""))
    monkeypatch.setattr(runner, "ExampleRunner", lambda *a, **k: None)

    class FakeExplorer:
        def __init__(self, *args, **kwargs):
            pass

        def run(self):
            return run()

    monkeypatch.setattr(search, "Explorer", FakeExplorer)


def _earlier_findings(reports: Path) -> dict[Path, bytes]:
    folder = reports / "explore"
    folder.mkdir(parents=True)
    (folder / "findings.md").write_bytes(EARLIER_FINDINGS)
    (folder / "test_finding_abc123.py").write_bytes(b"def test_finding_abc123(): pass\n")
    return {p: p.read_bytes() for p in folder.iterdir()}


def test_explore_that_searched_nothing_keeps_the_earlier_findings(tmp_path, monkeypatch, capsys):
    """`hil explore --budget 0.000001`: no example ran (exit 2); findings.md that held a
    finding is not replaced by "no findings"."""
    from harness.explore.search import SearchResult, Tally

    files = _earlier_findings(tmp_path)
    _fake_search(monkeypatch, lambda: SearchResult([], Tally(), 0.0, "budget spent"))
    assert cli.main(["explore", "--reports-dir", str(tmp_path), "--budget", "0.000001",
                     "--target", "vllm-cpu"]) == 2
    _kept(files)
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if "nothing was searched" in ln]
    assert f"kept the earlier findings.md at {tmp_path / 'explore' / 'findings.md'}" in line
    (partial,) = (tmp_path / "explore").glob("explore-incomplete-*/findings.md")
    assert str(partial.parent) in line
    assert partial.read_text().startswith("# hil explore: no findings")


def test_explore_that_searched_publishes_its_findings(tmp_path, monkeypatch, capsys):
    from harness.explore.search import SearchResult, Tally

    files = _earlier_findings(tmp_path)
    ran = Tally(examples=3, passed=3, geometries=1)
    _fake_search(monkeypatch, lambda: SearchResult([], ran, 1.0, "budget spent"))
    assert cli.main(["explore", "--reports-dir", str(tmp_path), "--budget", "1",
                     "--target", "vllm-cpu"]) == 0
    findings = tmp_path / "explore" / "findings.md"
    assert findings.read_text().startswith("# hil explore: no findings")
    assert f"findings.md written: {findings}" in capsys.readouterr().out
    # the earlier regression test is kept: it fails while its defect is there
    test = tmp_path / "explore" / "test_finding_abc123.py"
    assert test.read_bytes() == files[test]
    assert not list((tmp_path / "explore").glob(".explore-staging-*"))


def test_explore_stopped_keeps_the_earlier_findings_and_says_so(tmp_path, monkeypatch, capsys):
    files = _earlier_findings(tmp_path)

    def stopped():
        os.kill(os.getpid(), signal.SIGTERM)  # hil explore's own handlers take it
        raise AssertionError("the signal did not stop the search")

    _fake_search(monkeypatch, stopped)
    assert cli.main(["explore", "--reports-dir", str(tmp_path), "--budget", "1",
                     "--target", "vllm-cpu"]) == 143
    _kept(files)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "stopped by" in ln]
    assert lines == [f"hil explore: stopped by SIGTERM; kept the earlier findings.md at"
                     f" {tmp_path / 'explore' / 'findings.md'}; this run wrote none (stopped)"]


# ---------------------------------------------------------------- hil registry


def test_an_empty_registry_table_keeps_the_earlier_one(tmp_path, monkeypatch, capsys):
    """A registry run with no row to table: the 4-row registry.md stays, nothing beside it."""
    from harness.targets.spyre import registry

    if importlib.util.find_spec(registry.PLUGIN) is None:
        pytest.skip(f"{registry.PLUGIN} is not installed here: hil registry refuses to run")
    folder = tmp_path / "registry"
    folder.mkdir()
    (folder / "registry.md").write_text("| entry | TP |\n|---|---|\n| a | 1 |\n| b | 2 |\n"
                                        "| c | 4 |\n| d | 4 |\n")
    (folder / "registry.json").write_text(json.dumps([{"entry": "a"}] * 4))
    files = {p: p.read_bytes() for p in folder.iterdir()}
    # vLLM's CPU platform, without the import (seconds): the command only checks its module
    monkeypatch.setitem(sys.modules, "vllm.platforms",
                        types.SimpleNamespace(current_platform=object()))
    monkeypatch.setattr(registry, "registry_rows", lambda *a, **k: [])
    args = argparse.Namespace(model=["ibm-granite/granite-3.3-8b-instruct"], tp=None,
                              max_model_len=None, max_num_seqs=None, reports_dir=str(tmp_path))
    assert registry.registry_command(args, []) == 2
    _kept(files)
    err = capsys.readouterr().err
    assert "nothing was written" in err and str(folder) in err
    assert not list(folder.glob("registry-*"))


# ---------------------------------------------------------------- hil calibrate


def test_a_stopped_calibration_keeps_the_earlier_one_and_says_so(tmp_path, monkeypatch, capsys):
    from harness.calibration import command

    earlier = tmp_path / "calibration.md"
    earlier.write_bytes(b"# Reduced-precision calibration\n\nthe earlier tables\n")

    def measuring(models, precisions, cache_dir, reports_dir, **kw):
        (Path(reports_dir) / "calibration.md").write_text("# half written")
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal did not stop the measurement")

    monkeypatch.setattr(command, "run", measuring)
    code = cli.main(["calibrate", "--reports-dir", str(tmp_path), "--cache-dir",
                     str(tmp_path / "cache")])
    assert code == 143
    assert earlier.read_bytes() == b"# Reduced-precision calibration\n\nthe earlier tables\n"
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "stopped by" in ln]
    (partial,) = tmp_path.glob("calibrate-interrupted-*/calibration.md")
    assert lines == [f"hil calibrate: stopped by SIGTERM; kept the earlier calibration.md at"
                     f" {earlier}; this run's partial output (stopped) at {partial.parent}"]


# ---------------------------------------------------------------- hil bench


def test_a_bench_whose_timed_runs_failed_keeps_the_earlier_figures(tmp_path, monkeypatch, capsys):
    from bench import harness_bench

    out = tmp_path / "bench"
    out.mkdir()
    earlier = out / "latest.json"
    earlier.write_text(json.dumps({"date": "earlier", "engine_start": {"fresh_s": 9.0}}))
    data = earlier.read_bytes()
    import fixtures.models

    monkeypatch.setattr(fixtures.models, "build_model", lambda name, cache: None)

    def broken(*a, **k):
        raise RuntimeError("the engine did not start")

    monkeypatch.setattr(harness_bench, "engine_starts", broken)
    assert harness_bench.main(["--parts", "starts", "--out", str(out)]) == 1
    assert earlier.read_bytes() == data
    err = capsys.readouterr().err
    assert f"kept the earlier latest.json at {earlier}" in err
    (record,) = out.glob("bench-*.json")  # the run's own record, beside it
    assert "the engine did not start" in record.read_text()
