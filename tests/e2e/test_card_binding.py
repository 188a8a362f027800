"""A card test passes only on its card: with no inventory device serving its variant it never
starts an engine unleased (where it would open whatever card or simulator its environment
names); it skips saying why, and fails under --require-device. No engine starts here: the
runtime is the emulated torch_sendnn on the path, the host a fake device tree with one card."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.suite_runner import ROOT, run_suite

pytestmark = pytest.mark.e2e  # child pytests

SELECT = ("-m", "spyre", "--target", "spyre-sendnn-cp", "--model", "tiny-llama",
          "-k", "test_greedy_tokens_equal_reference and single")


def card_host(tmp_path: Path, features: list[str] | None) -> dict[str, str]:
    root, inventory = tmp_path / "host", tmp_path / "inventory.toml"
    subprocess.run([sys.executable, str(ROOT / "tools/card-host/fake_device_tree.py"), str(root),
                    "--cards", "1", "--inventory", str(inventory)], check=True, capture_output=True)
    if features is not None:  # the lab's card serves these modes only
        inventory.write_text(inventory.read_text() + f"features = {features!r}\n".replace("'", '"'))
    return {"HIL_DEVICE_ROOT": str(root), "SENDNN_EMULATION_ROOT": str(root),
            "HIL_INVENTORY": str(inventory),
            "PYTHONPATH": str(ROOT / "emulation/torch_sendnn")}  # the runtime, emulated


def test_a_card_variant_no_device_serves_skips_and_fails_under_require_device(tmp_path):
    env = card_host(tmp_path, ["pc"])  # a card in sysfs, but listed for pc alone
    run = run_suite(tmp_path / "skip", "suites/test_token_equality.py", *SELECT, env=env)
    assert run.returncode == 0, run.output[-3000:]
    assert set(run.outcomes.values()) == {"skipped"}, run.outcomes
    assert "runs only on a leased device that serves it" in run.output, run.output[-3000:]
    run = run_suite(tmp_path / "fail", "suites/test_token_equality.py", *SELECT,
                    "--require-device", env=env)
    assert run.returncode == 1, run.output[-3000:]
    assert run.failed() and all(v in ("failed", "error") for v in run.outcomes.values())
    for name in run.failed():
        assert "runs only on a leased device that serves it" in run.messages[name]
