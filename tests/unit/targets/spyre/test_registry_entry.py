"""A started card engine is held to the plugin's registry entry it ran with (its KV blocks, each
variable it declares), the report names that entry, and a lab geometry takes its shape from an
entry of the registry file the engine would read (harness/targets/spyre/registry_entry.py)."""

from __future__ import annotations

import pytest
import yaml

from harness.core.config import ConfigError
from harness.targets.spyre.kind import SpyreTarget
from harness.targets.spyre.registry_entry import (
    MODEL_CONFIG_FILE_ENV,
    TKV_LIMIT_ENV,
    entry_geometry,
    entry_label,
    entry_problem,
    registry_file,
)

GRANITE = "ibm-granite/granite-3.3-8b-instruct"


def _info(blocks=17, env=None, **facts):
    declared_env = {TKV_LIMIT_ENV: "1024"}
    registry = {"entry": "lab/model", "file": "lab.yaml", "tensor_parallel_size": 1,
                "declared_blocks": 17, "declared_env": declared_env,
                "env": dict(declared_env) if env is None else env, "blocks_override": 17,
                **facts}
    return {"kv_num_blocks": blocks, "registry": registry}


def test_an_engine_as_its_entry_declares_or_without_an_entry_has_no_problem():
    assert entry_problem(_info()) is None
    assert entry_problem({"kv_num_blocks": 5}) is None
    assert entry_problem(_info(blocks=3, entry=None)) is None


def test_an_engine_whose_blocks_or_variables_differ_from_its_entry_is_refused_naming_both():
    blocks = entry_problem(_info(blocks=16))
    assert blocks and "'lab/model' (lab.yaml)" in blocks
    assert "declares num_gpu_blocks_override 17, but the engine's KV cache has 16 blocks" in blocks
    env = entry_problem(_info(env={TKV_LIMIT_ENV: "2048"}))
    assert env and "'lab/model' (lab.yaml)" in env
    assert f"declares {TKV_LIMIT_ENV}=1024, but the engine process runs with {TKV_LIMIT_ENV}=2048" in env
    assert f"runs with {TKV_LIMIT_ENV}=None" in entry_problem(_info(env={}))


def test_an_entry_the_engine_could_not_read_is_a_problem_not_a_pass():
    # The plugin's registry raised in the engine (engine_info records the error): the start
    # check cannot hold the engine to its entry, and says so instead of passing.
    info = {"kv_num_blocks": 20, "registry": {"entry": None, "error": "AttributeError('x')"}}
    problem = entry_problem(info)
    assert problem and "could not be asked" in problem and "AttributeError('x')" in problem


def test_the_block_count_expected_is_the_override_rounded_down_to_a_multiple_of_the_batch():
    # The platform rounds an override down to a multiple of max_num_seqs: 18 at batch 4 is 16.
    assert entry_problem({**_info(blocks=16, declared_blocks=18), "max_num_seqs": 4}) is None
    off = entry_problem({**_info(blocks=12, declared_blocks=18), "max_num_seqs": 4})
    assert off and ("declares num_gpu_blocks_override 18 (rounded down to a multiple of batch 4:"
                    " 16), but the engine's KV cache has 12 blocks") in off
    assert entry_problem({**_info(blocks=18, declared_blocks=18), "max_num_seqs": 4})


def test_the_report_names_the_entry_only_where_one_applied():
    assert entry_label(_info()) == "lab/model (TP 1, 17 blocks, TKV limit 1024)"
    assert entry_label(_info(declared_blocks=None, declared_env={})) == "lab/model (TP 1)"
    assert entry_label({}) is None and entry_label(_info(entry=None)) is None
    assert SpyreTarget.report_parameters(_info()) == {
        "registry entry": "lab/model (TP 1, 17 blocks, TKV limit 1024)"}
    assert SpyreTarget.report_parameters(_info(entry=None)) == {}
    assert SpyreTarget.report_parameters({}) == {}


def test_the_start_check_is_the_entry_check():
    target = object.__new__(SpyreTarget)  # check_started reads only the engine's facts
    assert target.check_started(_info()) is None
    assert "16 blocks" in target.check_started(_info(blocks=16))


@pytest.fixture
def plugin_registry(monkeypatch):
    """The installed plugin's own registry file, read as YAML, and its entry GRANITE's shapes."""
    monkeypatch.delenv(MODEL_CONFIG_FILE_ENV, raising=False)
    path = registry_file()
    if path is None or not path.is_file():
        pytest.skip("no sendnn-inference with a model registry in this environment")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return path, data, data["models"][GRANITE]["continuous_batching_configs"]


def test_an_entry_shape_picked_by_tp_gives_its_geometry_from_the_plugins_registry(plugin_registry):
    _, _, shapes = plugin_registry
    (tp4,) = [c for c in shapes if c["tp_size"] == 4]
    assert entry_geometry(GRANITE, {"tensor_parallel_size": 4}) == {
        "tensor_parallel_size": 4, "max_model_len": tp4["max_model_len"],
        "max_num_seqs": tp4["max_num_seqs"], "pool": "device",
        "batch_tkv_limit": int(tp4["device_config"]["env_vars"][TKV_LIMIT_ENV])}


def test_an_ambiguous_shape_or_an_unknown_entry_is_refused_naming_the_file_and_what_it_has(
        plugin_registry):
    path, data, shapes = plugin_registry
    tp1 = [c for c in shapes if c["tp_size"] == 1]
    assert len(tp1) > 1
    with pytest.raises(ConfigError) as e:
        entry_geometry(GRANITE, {"tensor_parallel_size": 1})
    assert str(path) in str(e.value) and f"{len(tp1)} match" in str(e.value)
    for c in shapes:
        assert (f"TP {c['tp_size']}, context {c['max_model_len']}, batch {c['max_num_seqs']}"
                in str(e.value))
    with pytest.raises(ConfigError) as e:
        entry_geometry("lab/none", {})
    assert f"the registry {path} has no entry 'lab/none'" in str(e.value)
    assert f"(entries: {', '.join(data['models'])})" in str(e.value)


def test_the_labs_registry_file_is_read_instead_of_the_plugins(monkeypatch, tmp_path):
    lab = tmp_path / "lab_models.yaml"
    lab.write_text("models:\n  lab/model:\n    continuous_batching_configs:\n"
                   "      - {tp_size: 1, max_model_len: 2048, max_num_seqs: 8}\n")
    monkeypatch.setenv(MODEL_CONFIG_FILE_ENV, str(lab))
    assert registry_file() == lab
    assert entry_geometry("lab/model", {}) == {"tensor_parallel_size": 1, "max_model_len": 2048,
                                               "max_num_seqs": 8, "pool": "device"}
    with pytest.raises(ConfigError, match=rf"{GRANITE!r} \(entries: lab/model\)"):
        entry_geometry(GRANITE, {"tensor_parallel_size": 4})
    with pytest.raises(ConfigError, match="none matches"):
        entry_geometry("lab/model", {"max_num_seqs": 4})
