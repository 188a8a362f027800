"""hil bench fails when a timed run fails: its figures would not be valid."""

from __future__ import annotations

import importlib.util
import json
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


def test_a_failing_part_makes_the_bench_exit_non_zero(tmp_path, monkeypatch, capsys):
    bench = load_bench()
    _no_models(monkeypatch)

    def broken(*a: Any, **kw: Any) -> Any:
        raise RuntimeError("engine died")

    monkeypatch.setattr(bench, "probe_overhead", broken)
    assert bench.main(["--parts", "probes", "--out", str(tmp_path)]) == 1
    result = json.loads((tmp_path / "latest.json").read_text())
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
    failures = json.loads((tmp_path / "latest.json").read_text())["failures"]
    assert failures == ["run warm: exit 1 [1 failed]", "mission warm: exit 1 [1 failed]"]


def test_start_figures_are_median_and_nearest_rank_p90():
    bench = load_bench()
    fig = bench.start_figures([1.0, 9.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0])
    assert (fig["n"], fig["median"], fig["p90"]) == (10, 5.5, 9.0)
    assert bench.start_figures([])["median"] is None


def test_the_bench_starts_a_spyre_eager_variant_the_default_stack_runs():
    vid = load_bench().spyre_eager()
    assert KINDS["spyre"].stack_feature_problem(VARIANTS[vid], DEFAULT_STACK) is None
