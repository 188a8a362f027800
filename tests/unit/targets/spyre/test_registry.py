"""hil registry's judgement of a registered shape, over rows built by hand (the plugin's
configuration step itself runs in tests/e2e/test_registry.py)."""

import os
from types import SimpleNamespace

from harness.targets.spyre.registry import (
    RegistryRow,
    format_rows,
    hf_config,
    kept_environment,
)

TP4 = {"VLLM_DT_MAX_BATCH_TKV_LIMIT": "131072", "FLEX_HDMA_P2PSIZE": "268435456"}


def _row(**kw):
    row = RegistryRow("ibm-granite/granite-3.3-8b-instruct", 4, 32768, 32,
                      matched="ibm-granite/granite-3.3-8b-instruct", declared_blocks=8192,
                      declared_env=dict(TP4), applied_blocks=8192, applied_env=dict(TP4))
    for key, value in kw.items():
        setattr(row, key, value)
    row.judge()
    return row


def test_a_shape_configured_as_declared_passes_and_shows_its_settings():
    row = _row()
    assert row.problem is None and row.verdict == "as declared"
    assert row.tkv_limit == "131072"
    line = format_rows([row]).splitlines()[2]
    assert "| 8192 | 131072 | FLEX_HDMA_P2PSIZE=268435456 | as declared |" in line


def test_a_configurator_that_drops_a_setting_fails_the_row():
    assert _row(applied_blocks=None).problem == ("the entry declares num_gpu_blocks_override"
                                                  " 8192, the configurator applied None")
    dropped = _row(applied_env={"VLLM_DT_MAX_BATCH_TKV_LIMIT": "131072"})
    assert dropped.problem == ("the entry declares FLEX_HDMA_P2PSIZE=268435456, the"
                               " configurator applied None")
    assert dropped.verdict.startswith("NOT AS DECLARED: ")


def test_no_match_fails_and_another_entry_of_one_architecture_is_judged_by_its_settings():
    assert _row(matched=None).problem == "the plugin's registry matched no entry for this shape"
    same = _row(matched="ibm-granite/granite-4-8b-dense")
    assert same.problem is None and "(the same architecture)" in same.verdict
    other = _row(matched="ibm-granite/granite-4-8b-dense", applied_blocks=2080)
    assert other.problem.startswith("the registry matched 'ibm-granite/granite-4-8b-dense':")


def test_a_shape_that_cannot_be_built_here_says_why_and_does_not_fail():
    row = _row(matched=None, applied_blocks=None, applied_env={},
               note="not built here: transformers names no causal or image-text model")
    assert row.problem is None and row.verdict.startswith("not built here")


def test_the_hf_config_is_the_registry_architecture_with_its_model_class():
    arch = SimpleNamespace(model_type="llama", attributes={"num_hidden_layers": 32,
                                                             "quantization_config": {"format": "f"}})
    config = hf_config(arch)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 32 and config["quantization_config"] == {"format": "f"}


def test_each_row_starts_from_the_environment_as_it_was():
    os.environ.pop("HIL_TEST_REGISTRY_VAR", None)
    with kept_environment():
        os.environ["HIL_TEST_REGISTRY_VAR"] = "1"
    assert "HIL_TEST_REGISTRY_VAR" not in os.environ
