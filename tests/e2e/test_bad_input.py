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


@pytest.mark.e2e  # runs a child pytest and a child hil explore (neither starts an engine)
def test_hil_explore_refuses_a_bad_variable_with_pytests_own_message(tmp_path):
    import os
    import subprocess
    import sys

    from harness.core.paths import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("HIL_")}
    env["HIL_ENGINE_START"] = "zygote"

    def child(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", *argv], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=300)

    pytest_run = child("pytest", "-p", "no:cacheprovider", "-q", "--collect-only",
                       "suites/test_token_equality.py", f"--hil-reports-dir={tmp_path / 'p'}")
    search = child("harness.cli", "explore", "--budget", "5", "--target", "vllm-cpu",
                   "--reports-dir", str(tmp_path / "e"))
    said = [line.removeprefix("ERROR: ") for line in pytest_run.stderr.splitlines()
            if line.startswith("ERROR: ")]
    assert pytest_run.returncode == 4 and said, pytest_run.stderr
    assert search.returncode == 2 and search.stdout == "", search.stderr
    assert search.stderr.splitlines() == [f"hil explore: {said[0]}"]
    assert not (tmp_path / "e").exists() and not (tmp_path / "p").exists()
