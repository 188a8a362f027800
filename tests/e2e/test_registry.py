"""hil registry: the Spyre plugin's registry and configurator, run on the registered HF
configs without weights (sendnn-inference 2.x, the default stack).

The command builds each registered model's HF config from the registry's architecture, lets
vLLM make its engine configuration, and asks the plugin's own registry and configurator what
applies, as the plugin does at engine start on a card. granite-3.3-8b-instruct at TP 4,
context 32768, batch 32 gets its entry's block override (8192), batch TKV limit (131072) and
``FLEX_HDMA_*`` variables. A configurator that forgets the block override (a fault installed in
the plugin of the command's own process, through its inherited PYTHONPATH) fails that row and
the command.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.suite_runner import ROOT

pytestmark = pytest.mark.e2e  # imports vLLM and the plugin, builds engine configurations

GRANITE = "ibm-granite/granite-3.3-8b-instruct"
FORGET_BLOCKS = """
from sendnn_inference.config.configurators.model_configurator import ModelConfigurator
ModelConfigurator._configure_gpu_blocks = lambda self, device_config, vllm_config: None
"""


def _run(tmp_path, pythonpath=None):
    pytest.importorskip("sendnn_inference")
    env = {**os.environ, "VLLM_PLUGINS": ""}  # the fault imports the plugin before the command
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "registry", "--model", GRANITE,
                           "--reports-dir", str(tmp_path / "reports")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    rows = json.loads((tmp_path / "reports" / "registry" / "registry.json").read_text())
    return proc, {(r["tp"], r["max_model_len"], r["max_num_seqs"]): r for r in rows}


def test_a_registered_model_gets_its_entrys_settings_through_the_plugin(tmp_path):
    proc, rows = _run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    tp4 = rows[(4, 32768, 32)]
    assert tp4["matched"] == GRANITE and tp4["problem"] is None
    assert tp4["applied_blocks"] == 8192
    assert tp4["applied_env"] == {"VLLM_DT_MAX_BATCH_TKV_LIMIT": "131072",
                                  "FLEX_HDMA_P2PSIZE": "268435456",
                                  "FLEX_HDMA_COLLSIZE": "33554432"}
    assert rows[(1, 3072, 16)]["applied_blocks"] is None  # its TP 1 shapes set nothing
    assert ("4 shape(s), 4 built through the plugin's configuration step, 0 not as declared"
            in proc.stdout)


def test_a_configurator_forgetting_the_block_override_fails_the_row(tmp_path):
    (tmp_path / "fault").mkdir()
    (tmp_path / "fault" / "sitecustomize.py").write_text(FORGET_BLOCKS)
    proc, rows = _run(tmp_path, pythonpath=str(tmp_path / "fault"))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert rows[(4, 32768, 32)]["problem"] == ("the entry declares num_gpu_blocks_override 8192,"
                                               " the configurator applied None")
    assert "NOT AS DECLARED" in proc.stdout and "1 not as declared" in proc.stdout


def test_a_size_no_registry_shape_has_is_refused_and_the_earlier_table_kept(tmp_path):
    """--tp 3 (the registry's sizes are 1, 2 and 4) and a folder whose config.json is not JSON
    are refused before any row is built: exit 2, one message, an earlier table unchanged."""
    pytest.importorskip("sendnn_inference")
    table = tmp_path / "reports" / "registry" / "registry.md"
    table.parent.mkdir(parents=True)
    table.write_bytes(b"| an earlier table |\n")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": ')
    for args, message in (
            (["--model", GRANITE, "--tp", "3"], "hil registry: --tp 3: the plugin's registry has"
             " no decoder shape of tensor-parallel size 3; its sizes: 1, 2, 4;"),
            (["--model", str(folder), "--tp", "1", "--max-model-len", "512", "--max-num-seqs",
              "4"], f"hil registry: --model: {folder}/config.json: not valid JSON")):
        proc = subprocess.run([sys.executable, "-m", "harness.cli", "registry", *args,
                               "--reports-dir", str(tmp_path / "reports")], cwd=ROOT,
                              env={**os.environ, "VLLM_PLUGINS": ""}, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert table.read_bytes() == b"| an earlier table |\n"
        assert not (table.parent / "registry.json").exists()
