"""A new device kind is one package: a copy of the vllm-cpu kind under a name of its own
(``cpu-copy``), written into a temporary folder outside the checkout and declared by an entry
point (``vllm_hil.kinds``), runs the suites with no file of the checkout edited.

The child pytests find it on PYTHONPATH (its package and a dist-info folder whose
entry_points.txt importlib.metadata reads). The collection puts the new variant in every test
the vllm-cpu variant runs in (the same capabilities), the kind contract holds for it, and one
token-equality test really runs on its engine and passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.suite_runner import ROOT, run_suite

pytestmark = pytest.mark.e2e  # child pytests, one engine start

NAME = "cpu-copy"
PACKAGE = "cpu_copy"
COPIED = "vllm-cpu"  # the kind copied, and its variants' ids
# The copied kind under its new name: its package is the copy; only its name, place and
# variants' ids are its own (and its selftest cases, rewritten to its targets).
IDENTITY = f'''

import dataclasses as _dataclasses


class CpuCopyTarget(VllmCpuTarget):
    """vLLM's CPU engine as a kind of its own, declared by an entry point."""

    name = "{NAME}"
    order = 15
    variants = tuple(_dataclasses.replace(v, id=v.id.replace("{COPIED}", "{NAME}", 1),
                                          target="{NAME}") for v in VllmCpuTarget.variants)
    markers = {{"cpu": "runs on this machine's CPU ({NAME})"}}
    selftest_module = "{PACKAGE}.selftest_cases"
    variables = ()  # the copied kind's variables are declared by it, once


KIND = CpuCopyTarget
'''


def git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder outside the checkout holding the new kind's package and its dist-info."""
    site = tmp_path_factory.mktemp("kind-site")
    package = site / PACKAGE
    shutil.copytree(ROOT / "harness" / "targets" / "vllm_cpu", package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    kind = package / "kind.py"
    kind.write_text(kind.read_text() + IDENTITY)
    cases = package / "selftest_cases.py"
    if cases.exists():
        cases.write_text(cases.read_text().replace(f'"{COPIED}', f'"{NAME}'))
    dist = site / f"{PACKAGE}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {NAME}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[vllm_hil.kinds]\n{NAME} = {PACKAGE}.kind\n")
    return site


def child_env(site: Path) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(site), *([path] if path else [])])}


def collect(site: Path, *args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "suites", "--collect-only", "-q", "-p",
         "no:cacheprovider", "--model", "tiny-llama", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, **child_env(site)})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_a_kind_declared_by_an_entry_point_runs_the_suites(site: Path, tmp_path: Path) -> None:
    before = git_status()
    ids = collect(site, "--target", f"{COPIED},{COPIED}-bf16,{NAME},{NAME}-bf16")
    mine = {i for i in ids if f"-{NAME}" in i}
    copied = {i for i in ids if f"-{COPIED}" in i}
    assert mine and {i.replace(f"-{NAME}", f"-{COPIED}") for i in mine} == copied
    suites = {i.split("::")[0] for i in mine}
    assert {"suites/test_token_equality.py", "suites/test_block_freeing.py",
            "suites/test_no_recompute.py", "suites/test_capacity.py"} <= suites

    contract = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/unit/targets/test_kind_contract.py", "-k", NAME,
         # its own reports folder: the checkout's is this run's, held while it runs
         f"--hil-reports-dir={tmp_path / 'contract-reports'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, **child_env(site)})
    assert contract.returncode == 0, (contract.stdout + contract.stderr)[-3000:]
    assert " passed" in contract.stdout and " deselected" in contract.stdout

    run = run_suite(tmp_path, "suites/test_token_equality.py", "--model", "tiny-llama",
                    "--target", NAME, "-k", "single and not one-token", env=child_env(site))
    assert run.returncode == 0, run.output[-3000:]
    assert list(run.outcomes.values()) == ["passed"], run.outcomes
    assert f"[tiny-llama-{NAME}-" in next(iter(run.outcomes))
    assert git_status() == before, "the run changed a file of the checkout"
