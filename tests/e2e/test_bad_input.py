"""Bad input that takes an engine or a child pytest to see: a model the stack cannot load,
and a pytest run refusing an unknown target and a missing model folder."""

import json

import pytest

from harness.core.errors import EngineStartError
from harness.engine.host import EngineHost
from harness.targets import target_for
from tests.bad_input import cfg
from tests.suite_runner import run_suite


@pytest.mark.e2e  # starts an engine process
def test_model_the_stack_cannot_load(tmp_path):
    model = tmp_path / "not-a-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "no-such-arch",
                                                   "architectures": ["NoSuchForCausalLM"]}))
    c = cfg(model=str(model))
    t = target_for(c)
    with pytest.raises(EngineStartError) as info:
        EngineHost(c, t.engine_env(), t.llm_kwargs(), tmp_path / "logs", start_timeout=300)
    text = str(info.value)
    assert f"engine vllm-cpu failed to start with model {model}" in text
    assert "supports its architecture" in text


@pytest.mark.e2e  # runs a child pytest
def test_cli_rejects_unknown_target_and_missing_model(tmp_path):
    run = run_suite(tmp_path, "suites/test_token_equality.py", "--target", "not-a-kind")
    assert run.returncode == 4
    assert "--target: unknown target 'not-a-kind'" in run.output
    run = run_suite(tmp_path, "suites/test_token_equality.py", "--model", str(tmp_path / "nope"))
    assert run.returncode == 4
    assert f"model folder not found: {tmp_path / 'nope'}" in run.output
