"""hil bench fails when a timed run fails: its figures would not be valid."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from harness.core.paths import REPO_ROOT
from harness.stacks.spec import DEFAULT_STACK
from harness.targets import KINDS
from harness.targets.variants import VARIANTS

ROOT = REPO_ROOT


def load_bench() -> Any:
    spec = importlib.util.spec_from_file_location("harness_bench", ROOT / "bench" / "harness_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _no_models(monkeypatch: Any) -> None:
    import fixtures.models

    monkeypatch.setattr(fixtures.models, "build_model", lambda name, cache: cache / name)


def _record(out: Path) -> dict[str, Any]:
    """The figures of a bench whose timed runs failed: its own record, bench-<time>.json
    (latest.json, the earlier bench's, is not replaced by figures that are not valid)."""
    assert not (out / "latest.json").exists()
    (record,) = [p for p in out.glob("bench-*.json") if p.is_file()]
    return json.loads(record.read_text())


def test_a_failing_part_makes_the_bench_exit_non_zero(tmp_path, monkeypatch, capsys):
    bench = load_bench()
    _no_models(monkeypatch)

    def broken(*a: Any, **kw: Any) -> Any:
        raise RuntimeError("engine died")

    monkeypatch.setattr(bench, "probe_overhead", broken)
    assert bench.main(["--parts", "probes", "--out", str(tmp_path)]) == 1
    result = _record(tmp_path)
    assert result["failures"] == ["probes: RuntimeError: engine died"]
    assert "timed runs failed" in capsys.readouterr().err


def test_a_failing_suite_run_makes_the_bench_exit_non_zero(tmp_path, monkeypatch):
    bench = load_bench()
    _no_models(monkeypatch)

    def run(label: str, *a: Any) -> dict[str, Any]:
        rc = 1 if label in ("warm", "mission warm") else 0
        return {"label": label, "returncode": rc, "outcome": "1 failed" if rc else "ok", "wall_s": 1.0,
                "engines_started": 0, "reference_computed": 0, "engine_start_s": {},
                "split_s": {k: 0.0 for k in ("engine_start", "engine_calls", "engine_compute",
                                             "reference", "checks")}}

    monkeypatch.setattr(bench, "pytest_run", run)
    assert bench.main(["--parts", "runs,mission", "--out", str(tmp_path)]) == 1
    failures = _record(tmp_path)["failures"]
    assert failures == ["run warm: exit 1 [1 failed]", "mission warm: exit 1 [1 failed]"]


def test_start_figures_are_median_and_nearest_rank_p90():
    from bench.suite_runs import start_figures

    fig = start_figures([1.0, 9.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0])
    assert (fig["n"], fig["median"], fig["p90"]) == (10, 5.5, 9.0)
    assert start_figures([])["median"] is None


def test_the_bench_starts_variants_the_default_stack_runs_without_a_device():
    from bench.bench_variants import cpu_kinds, device_cpu_variant, paged_variant

    paged, device_mode = VARIANTS[paged_variant()], VARIANTS[device_cpu_variant()]
    for v in (paged, device_mode):
        assert KINDS[v.target].stack_feature_problem(v, DEFAULT_STACK) is None
        assert not KINDS[v.target].needs_device(v)
    # The plain engine runs on the CPU itself; the other is a device kind's plugin on the CPU.
    assert not KINDS[paged.target].device.leased and KINDS[device_mode.target].device.leased
    assert (paged.backend, paged.mode) == (None, None)
    assert cpu_kinds()[:2] == [paged.target, device_mode.target]


def _row(label: str, wall: float, rc: int = 1, engines: int = 1) -> dict[str, Any]:
    return {"label": label, "returncode": rc, "outcome": "1 failed" if rc else "1 passed",
            "wall_s": wall, "engines_started": engines, "reference_computed": 0,
            "engine_start_s": {}, "split_s": {}}


def _triage_stats(reports: Any, *triages: dict[str, Any]) -> None:
    (reports / "stats").mkdir(parents=True)
    (reports / "stats" / "main.json").write_text(json.dumps(
        {"engines_started": 0, "engines": [], "triage": list(triages)}))
    (reports / "stats" / "old.json").write_text(json.dumps({"engines_started": 0, "engines": []}))


def test_the_triage_part_gives_seconds_per_triaged_failure(tmp_path, monkeypatch, capsys):
    from bench.triage_cost import BUDGET, SELECTION
    from tests.unit.report.test_triage_report import batching_result

    bench = load_bench()
    _no_models(monkeypatch)
    runs: list[tuple[str, list[str]]] = []

    def run(label: str, args: list[str], cache: Any, reports: Any) -> dict[str, Any]:
        runs.append((label, args))
        if "--no-triage" in args:
            return _row(label, 20.0)
        _triage_stats(reports, batching_result().to_dict())  # 42 s, 3 runs made
        return _row(label, 65.0, engines=5)

    monkeypatch.setattr(bench, "pytest_run", run)
    assert bench.main(["--parts", "triage", "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "latest.json").read_text())
    fig = result["triage"]
    assert (fig["failures_triaged"], fig["triage_s_per_failure"], fig["runs_per_failure"]) == (
        1, 42.0, 3.0)
    assert (fig["wall_difference_s_per_failure"], fig["engines_started_by_triage"]) == (45.0, 4)
    assert result["ratios"]["triage_s_per_failure"] == 42.0
    assert result["ratios"]["with_triage_over_without"] == 3.25
    assert [a[:len(SELECTION)] for _, a in runs] == [SELECTION] * 3  # warm-up, without, with
    assert f"--triage-budget={BUDGET}" in runs[2][1]
    assert "triage s/failure" in capsys.readouterr().out


def test_the_triage_part_makes_no_figures_when_nothing_was_triaged(tmp_path, monkeypatch):
    bench = load_bench()
    _no_models(monkeypatch)

    def run(label: str, args: list[str], cache: Any, reports: Any) -> dict[str, Any]:
        _triage_stats(reports)
        return _row(label, 20.0)

    monkeypatch.setattr(bench, "pytest_run", run)
    assert bench.main(["--parts", "triage", "--out", str(tmp_path)]) == 1
    result = _record(tmp_path)
    assert "triage_s_per_failure" not in result["triage"]
    assert result["failures"] == ["triage: no failure was triaged (the statistics hold no triage):"
                                  " the session does not triage this failure"]
    assert "triage_s_per_failure" not in result["ratios"]


def test_a_faulted_run_that_passes_is_named_not_measured():
    from bench.triage_cost import triage_figures

    fig = triage_figures(_row("fault, --no-triage", 20.0, rc=0), _row("fault, triage", 21.0), [])
    assert fig["problem"] == ("the run 'fault, --no-triage' did not fail (exit 0 [1 passed]): the"
                              " fault no longer fails the test")


def test_the_mission_part_reports_the_triage_seconds_of_a_green_run(tmp_path, monkeypatch):
    bench = load_bench()
    _no_models(monkeypatch)
    triage = {"mission cold": 26.1, "mission warm": 0.02, "mission warm -n 2": 0.01}
    wall = {"mission cold": 230.0, "mission warm": 140.0, "mission warm -n 2": 75.0}
    args: dict[str, list[str]] = {}

    def run(label: str, run_args: list[str], *a: Any) -> dict[str, Any]:
        args[label] = run_args
        return {"label": label, "returncode": 0, "outcome": "ok", "wall_s": wall[label],
                "engines_started": 0, "reference_computed": 0, "engine_start_s": {},
                "split_s": {"engine_start": 0.0, "engine_calls": 0.0, "engine_compute": 70.0,
                            "reference": 0.0, "checks": 0.0, "triage": triage[label]}}

    monkeypatch.setattr(bench, "pytest_run", run)
    assert bench.main(["--parts", "mission", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "latest.json").read_text())  # published: nothing failed
    assert result["green_run_triage_s"] == {"cold": 26.1, "warm": 0.02, "warm -n 2": 0.01}
    assert args["mission warm"] == ["suites", "-m", "cpu"]
    assert args["mission warm -n 2"] == ["suites", "-m", "cpu", "-n", "2"]
    # Wall over the forward passes (summed over the workers) of each warm run.
    assert result["ratios"]["mission_warm_wall_over_forward"] == 2.0
    assert result["ratios"]["mission_warm_n2_wall_s"] == 75.0
    assert result["ratios"]["mission_warm_n2_wall_over_forward"] == 1.07


def test_the_ci_part_times_the_readme_command_step_by_step_on_a_clone(tmp_path, monkeypatch):
    import subprocess

    from bench.ci_wall import ci_command, ci_steps, ci_wall
    from harness.core.paths import REPO_ROOT

    readme = (REPO_ROOT / "README.md").read_text()
    assert ci_command(REPO_ROOT) in readme  # what CI runs is the README's command
    assert ci_steps("./setup.sh --stack a && pytest -n 2 && pytest x") == [
        "./setup.sh --stack a", "pytest -n 2", "pytest x"]
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    (repo / "setup.sh").write_text("#!/bin/sh\nexit 0\n")
    (repo / "setup.sh").chmod(0o755)

    def commit(command: str) -> None:
        (repo / ".ci" / "run").write_text(f"#!/bin/sh\n{command}\n")
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
        subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m",
                        "c"], cwd=repo, check=True)

    monkeypatch.setenv("HIL_BENCH_LEAK", "1")  # a HIL_ variable of the caller's: unset, as CI does
    commit("./setup.sh && echo '===== 3 passed in 1.00s =====' && test -z \"$HIL_BENCH_LEAK\"")
    out = ci_wall(repo, tmp_path / "w1")
    assert [s["returncode"] for s in out["steps"]] == [0, 0, 0] and out["problem"] is None
    assert out["steps"][1]["summary"] == "3 passed in 1.00s"
    assert "by_file" in out["steps"][1] and out["steps"][1]["by_file"] == []  # not pytest
    commit("./setup.sh && false && echo never")
    out = ci_wall(repo, tmp_path / "w2")
    assert [s["returncode"] for s in out["steps"]] == [0, 1]  # a failed step ends the run
    assert out["problem"] == "step failed (exit 1): false"


def test_the_ci_part_sums_a_pytest_step_by_module(tmp_path):
    from bench.ci_wall import by_file, with_junit

    xml = tmp_path / "j.xml"
    assert with_junit(".venv/bin/python -m pytest -n 2", xml) == (
        f".venv/bin/python -m pytest -n 2 --junitxml={xml}")
    assert with_junit("pytest suites -m cpu", xml).endswith(f" --junitxml={xml}")
    assert with_junit("./setup.sh --stack default", xml) == "./setup.sh --stack default"
    assert by_file(xml) == []  # no file: nothing, no error
    xml.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.e2e.test_a" name="t1" time="10.5"/>'
        '<testcase classname="tests.e2e.test_a.TestX" name="t2" time="2"/>'
        '<testcase classname="suites.test_b" name="t3" time="20"/>'
        '</testsuite></testsuites>')
    assert by_file(xml) == [("suites.test_b", 20.0, 1), ("tests.e2e.test_a", 12.5, 2)]
    xml.write_text("<testsuites")
    assert by_file(xml) == []
