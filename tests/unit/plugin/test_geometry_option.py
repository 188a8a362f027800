"""--geometry at the start of a run: unknown names, a lab's own geometries (from the
inventory), one the machine cannot hold, and what a selection collects (child pytest runs that
only collect: no engine starts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.paths import REPO_ROOT
from harness.geometry.catalog import GeometryError, add_lab_geometries, load_geometries

USAGE = 4
INVENTORY = """[[device]]
id = "cpu0"
kind = "cpu"

[geometry.{name}]
description = "a lab's shape"
max_model_len = {context}
max_num_seqs = {batch}
chunk_size = 1024
pool = "device"
models = ["tiny-llama"]
"""


def collect(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
           f"--hil-reports-dir={tmp_path / 'reports'}", "suites", "-m", "cpu", *args]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def inventory(tmp_path: Path, name: str, context: int, batch: int) -> str:
    path = tmp_path / "inv.toml"
    path.write_text(INVENTORY.format(name=name, context=context, batch=batch))
    return str(path)


def test_an_unknown_geometry_is_refused_naming_the_known_ones(tmp_path):
    run = collect(tmp_path, "--geometry", "huge")
    assert run.returncode == USAGE, run.stdout + run.stderr
    assert "--geometry: unknown geometry 'huge'; known: small, card, tight, tkv-bound" in run.stderr


def test_a_selection_without_small_runs_only_the_tests_that_take_a_geometry(tmp_path):
    run = collect(tmp_path, "--geometry", "tight,card", "--model", "tiny-llama")
    assert run.returncode == 0, run.stdout + run.stderr
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert ids and all("::test_full_batch_in_geometry[" in i for i in ids), ids
    assert {i.rsplit("-", 1)[-1].rstrip("]") for i in ids} == {"tight", "card"}


def test_a_labs_geometry_from_the_inventory_runs_for_its_models(tmp_path):
    inv = inventory(tmp_path, "lab-1k", 1024, 8)
    run = collect(tmp_path, "--inventory", inv, "--geometry", "lab-1k")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "test_full_batch_in_geometry[tiny-llama-vllm-cpu-lab-1k]" in run.stdout


def test_a_labs_geometry_the_machine_cannot_hold_is_refused_before_any_engine(tmp_path):
    inv = inventory(tmp_path, "lab-huge", 131072, 4096)  # 0.5 G tokens of KV cache
    run = collect(tmp_path, "--inventory", inv, "--geometry", "lab-huge", "--model", "tiny-llama")
    assert run.returncode == USAGE, run.stdout + run.stderr
    assert "geometry 'lab-huge'" in run.stderr and "GiB of KV cache for model tiny-llama" in run.stderr
    assert "run it on a host with at least" in run.stderr


def test_a_labs_geometry_may_not_take_a_shipped_name():
    with pytest.raises(GeometryError, match="'tight' is a name the harness ships"):
        add_lab_geometries(load_geometries(), {"tight": {}}, "inv.toml")
    with pytest.raises(GeometryError, match="models = 'x' must be a list of model names"):
        add_lab_geometries(load_geometries(), {"mine": {
            "description": "d", "max_model_len": 512, "max_num_seqs": 4, "chunk_size": 128,
            "models": "x"}}, "inv.toml")
