"""The neuron target's arguments, per-device settings and checks (no engine, no device)."""

import json
import sys
from pathlib import Path

import pytest

from harness.core.config import ConfigError, EngineConfig
from harness.lab.inventory import InventoryError, load_inventory
from harness.lab.leases import LeaseManager
from harness.targets.neuron.config import (
    DEVICE_ENGINE_ENV,
    check_block_geometry,
    check_engine_info,
    model_support,
    neuron_llm_kwargs,
    parse_engine_settings,
    settings_from_env,
)
from harness.targets.neuron.discovery import neuron_core_range
from harness.targets.neuron.kind import NeuronTarget
from harness.targets.neuron.sdk import describe


def cfg(**kw):
    base = dict(target="neuron", model="/models/tiny-llama", max_model_len=256, max_num_seqs=4)
    base.update(kw)
    return EngineConfig(**base)


def test_llm_kwargs_ask_for_max_num_seqs_blocks_of_max_model_len_and_host_sampling():
    kw = neuron_llm_kwargs(cfg(), parse_engine_settings(None, "test"))
    # vllm-neuron adds the null block itself: max_num_seqs, not max_num_seqs + 1.
    assert kw["num_gpu_blocks_override"] == 4
    assert kw["block_size"] == 256
    assert kw["enable_prefix_caching"] is False
    assert kw["tensor_parallel_size"] == 1
    assert kw["additional_config"] == {"override_neuron_config": {"on_device_sampling_config": None}}


def test_llm_kwargs_take_the_devices_settings_and_an_explicit_block_count():
    settings = parse_engine_settings(
        {"tensor_parallel_size": 2, "dtype": "bfloat16",
         "override_neuron_config": {"enable_bucketing": False}}, "test")
    kw = neuron_llm_kwargs(cfg(num_blocks_override=3), settings)
    assert kw["tensor_parallel_size"] == 2 and kw["dtype"] == "bfloat16"
    assert kw["num_gpu_blocks_override"] == 3
    assert kw["additional_config"]["override_neuron_config"] == {
        "enable_bucketing": False, "on_device_sampling_config": None}


def test_a_block_size_other_than_max_model_len_is_refused():
    with pytest.raises(ConfigError, match="block_size 16 != max_model_len 256"):
        neuron_llm_kwargs(cfg(block_size=16), parse_engine_settings(None, "test"))


@pytest.mark.parametrize("raw, message", [
    ({"tensor_parallel_size": 0}, "positive integer"),
    ({"tensor_parallel_size": True}, "positive integer"),
    ({"tp": 2}, "unknown key"),
    ({"dtype": "int8"}, "is not one of"),
    ({"override_neuron_config": {"on_device_sampling_config": {"top_k": 1}}}, "samples on the host"),
    ({"override_neuron_config": {"pa_num_blocks": 8}}, "num_gpu_blocks_override"),
    ([1, 2], "must be a table"),
])
def test_bad_engine_settings_are_refused(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_engine_settings(raw, "inventory.toml: device #1")


def test_settings_travel_through_the_lease_environment():
    s = parse_engine_settings({"tensor_parallel_size": 2}, "test")
    assert settings_from_env({DEVICE_ENGINE_ENV: s.to_json()}) == s
    assert settings_from_env({}).tensor_parallel_size == 1


def _model(tmp_path: Path, arch: str) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    return tmp_path


def test_model_families(tmp_path):
    assert model_support(_model(tmp_path, "LlamaForCausalLM")) is None
    assert model_support(_model(tmp_path, "Qwen3ForCausalLM")) is None
    why = model_support(_model(tmp_path, "GraniteForCausalLM"))
    assert why is not None and "GraniteForCausalLM" in why and "LlamaForCausalLM" in why
    assert NeuronTarget.model_probe(tmp_path) == why


def test_block_geometry_check():
    ok = {"block_size": 256, "num_gpu_blocks": 5}
    assert check_block_geometry(ok, 256, 4) is None
    twice = check_block_geometry({"block_size": 256, "num_gpu_blocks": 6}, 256, 4)
    assert twice is not None and "added twice" in twice
    missing = check_block_geometry({"block_size": 256, "num_gpu_blocks": 4}, 256, 4)
    assert missing is not None and "null block is missing" in missing
    size = check_block_geometry({"block_size": 16, "num_gpu_blocks": 5}, 256, 4)
    assert size is not None and "block size 16" in size
    assert check_block_geometry({"block_size": 256, "num_gpu_blocks": 3}, 256, 4, requested=2) is None


def test_engine_info_check():
    info = {"platform_module": "vllm_neuron.platform", "platform": "NeuronPlatform",
            "visible_cores": "0-1"}
    assert check_engine_info(info, "0-1") is None
    wrong = check_engine_info({**info, "platform_module": "vllm.platforms.cpu",
                               "platform": "CpuPlatform"}, "0-1")
    assert wrong is not None and "vllm.platforms.cpu.CpuPlatform" in wrong
    cores = check_engine_info({**info, "visible_cores": "2-3"}, "0-1")
    assert cores is not None and "'2-3'" in cores and "'0-1'" in cores
    assert check_engine_info({**info, "model_dtype": "torch.bfloat16"}, "0-1", "bfloat16") is None
    dtype = check_engine_info({**info, "model_dtype": "torch.float32"}, "0-1", "bfloat16")
    assert dtype is not None and "engine.dtype bfloat16" in dtype and "torch.float32" in dtype
    unreported = check_engine_info(info, "0-1", "float32")
    assert unreported is not None and "an unreported dtype" in unreported


def test_target_env_keeps_compiled_artifacts_in_the_cache_and_needs_cores(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    t = NeuronTarget(cfg(device="neuron0", extra_env=(("NEURON_RT_VISIBLE_CORES", "0-1"),)))
    env = t.engine_env()
    assert env["VLLM_PLUGINS"] == "neuron"
    assert env["NEURON_COMPILED_ARTIFACTS"].startswith(str(tmp_path / "neuron-compiled" / "tiny-llama-"))
    other = NeuronTarget(cfg(max_num_seqs=2, device="neuron0",
                             extra_env=(("NEURON_RT_VISIBLE_CORES", "0-1"),))).engine_env()
    assert other["NEURON_COMPILED_ARTIFACTS"] != env["NEURON_COMPILED_ARTIFACTS"]
    with pytest.raises(ConfigError, match="has no core range"):
        NeuronTarget(cfg(device="neuron1")).engine_env()


def test_target_checks_after_start():
    t = NeuronTarget(cfg(device="neuron0", extra_env=(("NEURON_RT_VISIBLE_CORES", "0-1"),)))
    info = {"platform_module": "vllm_neuron.platform", "platform": "NeuronPlatform",
            "visible_cores": "0-1", "block_size": 256, "num_gpu_blocks": 5,
            "model_dtype": "torch.float32"}
    assert t.check_started(info) is None
    problem = t.check_started({**info, "num_gpu_blocks": 6})
    assert problem is not None and "added twice" in problem
    # The inventory's engine.dtype travels in the lease; the engine must compute in it.
    bf16 = NeuronTarget(cfg(device="neuron0", extra_env=(
        ("NEURON_RT_VISIBLE_CORES", "0-1"), ("HIL_NEURON_ENGINE", '{"dtype": "bfloat16"}'))))
    wrong = bf16.check_started(info)
    assert wrong is not None and "engine.dtype bfloat16" in wrong
    assert bf16.check_started({**info, "model_dtype": "torch.bfloat16"}) is None


def test_stack_probe_names_device_and_stack():
    why = NeuronTarget.stack_probe(None, "default")
    assert why is not None and "/dev/neuron" in why and "--stack neuron" in why
    assert NeuronTarget.stack_probe(None, "neuron") is None


def _inventory(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "inv.toml"
    p.write_text(body)
    return p


def test_inventory_neuron_cores_and_engine_reach_the_lease(tmp_path):
    inv = load_inventory(_inventory(tmp_path, """
[[device]]
id = "neuron0"
kind = "neuron"
cores = "0-1"
engine = { tensor_parallel_size = 2, override_neuron_config = { enable_bucketing = false } }
"""), root=tmp_path)
    leases = LeaseManager(inv, tmp_path / "leases", tmp_path / "run", worker="gw0")
    env = leases.lease("neuron", None, None).env()
    assert env["NEURON_RT_VISIBLE_CORES"] == "0-1"
    assert settings_from_env(env).tensor_parallel_size == 2
    kw = NeuronTarget(cfg(device="neuron0", extra_env=tuple(sorted(env.items())))).llm_kwargs()
    assert kw["tensor_parallel_size"] == 2
    assert kw["additional_config"]["override_neuron_config"]["enable_bucketing"] is False


@pytest.mark.parametrize("body, message", [
    ('[[device]]\nid = "n0"\nkind = "neuron"\ncores = "zero"\n', "must be like"),
    ('[[device]]\nid = "n0"\nkind = "neuron"\nengine = { tp = 2 }\n', "unknown key"),
    ('[[device]]\nid = "c0"\nkind = "spyre"\ncores = "0"\n', "for kind neuron only"),
])
def test_inventory_refuses_bad_neuron_fields(tmp_path, body, message):
    with pytest.raises(InventoryError, match=message):
        load_inventory(_inventory(tmp_path, body), root=tmp_path)


def test_discovery_reads_the_core_range_from_sysfs(tmp_path):
    node = tmp_path / "sys/devices/virtual/neuron_device/neuron1"
    node.mkdir(parents=True)
    (node / "core_count").write_text("2\n")
    assert neuron_core_range("neuron1", tmp_path) == "2-3"
    assert neuron_core_range("neuron0", tmp_path) is None


def test_sdk_check_says_what_is_missing_here():
    line = describe(sys.executable)  # the harness's venv never has the SDK
    assert "torch-neuronx (torch_neuronx)" in line
    assert "neuronx-distributed-inference" in line and "./setup.sh --stack neuron" in line


def test_a_stack_python_of_major_version_only_takes_the_sdk_environments_python(monkeypatch):
    from harness.stacks.install import find_python
    from harness.stacks.spec import StackError

    monkeypatch.setenv("HIL_PYTHON", sys.executable)
    assert find_python("3") == sys.executable
    assert find_python(f"{sys.version_info[0]}.{sys.version_info[1]}") == sys.executable
    with pytest.raises(StackError, match="no Python 3.99 found"):
        find_python("3.99")
