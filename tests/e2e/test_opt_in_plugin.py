"""Installed, the plugin is opt-in: another project's pytest run in the same environment (its
own `model` fixture, `model` parametrization and `--model`/`--target` options) collects, runs
and orders its tests as without the harness, and nothing of the harness is written or printed;
the same environment runs the harness when a session asks for it (harness/plugin/activation.py).

The child pytests run in a folder outside this checkout with this venv's Python, where the
harness is installed with its pytest11 entry points and nothing blocks them; no engine starts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # child pytests of an installed copy (seconds, no engine)

CONFTEST = '''
import pytest


def pytest_addoption(parser):
    parser.addoption("--model", default="theirs")
    parser.addoption("--target", default="x86")


@pytest.fixture
def model(request):
    return request.config.getoption("--model")
'''

TESTS = '''
import pytest


def test_z_their_fixture(model):
    assert model == "theirs"


@pytest.mark.parametrize("model", ["m1", "m2"])
def test_y_their_parametrization(model):
    assert model.startswith("m")


@pytest.mark.parametrize("target_variant", ["cpu"])
def test_x_their_variant(target_variant, request):
    assert request.config.getoption("--target") == "x86"


def test_w_plain():
    pass
'''

# The order the file declares them: the harness, active, would sort parametrized tests first.
FOREIGN_ORDER = ["test_z_their_fixture", "test_y_their_parametrization[m1]",
                 "test_y_their_parametrization[m2]", "test_x_their_variant[cpu]", "test_w_plain"]

HARNESS_TEST = '''
import pytest


@pytest.mark.token_equality  # a harness marker: --strict-markers accepts it only when active
def test_marked():
    pass
'''


def child_env() -> dict[str, str]:
    """This environment without what would configure the child's pytest or the harness."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("HIL_", "PYTEST_")) and k != "PYTHONPATH"}


def pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=folder, capture_output=True, text=True, timeout=300,
                          env=child_env())


def files_in(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


def harness_lines(output: str) -> list[str]:
    """Lines of the harness: all that name it but pytest's list of installed plugins."""
    return [line for line in output.splitlines()
            if re.search(r"vllm-hil|vllm_hil|hil-cache", line) and not line.startswith("plugins:")]


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    project = tmp_path / "their-project"
    project.mkdir()
    (project / "conftest.py").write_text(CONFTEST)
    (project / "test_theirs.py").write_text(TESTS)
    return project


def test_another_projects_run_is_left_alone(foreign: Path) -> None:
    before = files_in(foreign)
    proc = pytest_in(foreign, "-v", "-rA")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"plugins:.*vllm-hil", out), "the harness is not installed in this venv"
    ran = re.findall(r"^test_theirs\.py::(\S+) PASSED", proc.stdout, re.M)
    assert ran == FOREIGN_ORDER, out[-3000:]
    assert "5 passed" in out
    assert harness_lines(out) == [], out[-3000:]
    assert files_in(foreign) == before  # no reports/, .hil-cache/, timing.json...
    # their own values of the names the harness also uses
    proc = pytest_in(foreign, "-q", "--model", "theirs", "--target", "x86")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert files_in(foreign) == before


def test_the_harness_adds_nothing_to_their_markers_and_fixtures(foreign: Path) -> None:
    markers = pytest_in(foreign, "--markers").stdout
    assert "token_equality" not in markers and "hil_targets" not in markers
    fixtures = pytest_in(foreign, "--fixtures").stdout
    assert not re.search(r"^(hil|target_variant)\b", fixtures, re.M), fixtures[-3000:]
    assert re.search(r"^model\b", fixtures, re.M)  # theirs
    # options: only the harness's own names, none of the generic ones
    helptext = pytest_in(foreign, "--help").stdout
    assert "--require-device" in helptext
    assert "--hil-reports-dir" in helptext
    assert re.findall(r"^\s+--model\b", helptext, re.M) == ["  --model"]  # theirs alone


@pytest.mark.parametrize("opt_in, why", [
    (["-p", "vllm_hil"], "-p vllm_hil"),
    (["--hil-reports-dir", "{out}"], "a vllm-hil option"),
    (["--require-device"], "a vllm-hil option"),
])
def test_a_session_that_asks_gets_the_harness(tmp_path: Path, opt_in: list[str],
                                              why: str) -> None:
    project = tmp_path / "asks"
    project.mkdir()
    (project / "test_marked.py").write_text(HARNESS_TEST)
    out_dir = tmp_path / "out"
    args = [a.replace("{out}", str(out_dir)) for a in opt_in]
    proc = pytest_in(project, "--strict-markers", *args, "--target", "vllm-cpu")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert f"vllm-hil: active ({why})" in out
    assert "1 passed" in out
    reports = out_dir if "--hil-reports-dir" in opt_in else project / "reports"
    assert (reports / "timing.json").is_file()
    fixtures = pytest_in(project, *args, "--fixtures").stdout
    assert re.search(r"^target_variant\b", fixtures, re.M), fixtures[-3000:]


WITHOUT_ALLURE = """
import sys

for name in ("allure", "allure_commons", "allure_commons.types", "allure_commons.utils"):
    sys.modules[name] = None  # as on a host without allure-pytest
import pytest

sys.exit(pytest.main(sys.argv[1:]))
"""


def test_a_host_without_allure_pytest_runs_them_too(foreign: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", WITHOUT_ALLURE, "-p", "no:cacheprovider",
                           "-p", "no:allure_pytest", "-q"], cwd=foreign, capture_output=True,
                          text=True, timeout=300, env=child_env())
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "5 passed" in proc.stdout


def test_without_asking_their_harness_marker_is_unknown(tmp_path: Path) -> None:
    project = tmp_path / "does-not-ask"
    project.mkdir()
    (project / "test_marked.py").write_text(HARNESS_TEST)
    proc = pytest_in(project, "--strict-markers")
    assert proc.returncode != 0
    assert "'token_equality' not found in `markers`" in proc.stdout + proc.stderr
    assert files_in(project) == {"test_marked.py"}
