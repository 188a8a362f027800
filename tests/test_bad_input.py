"""Bad configuration and bad input give a clear error naming the value and the fix."""

import json

import pytest

from harness.engine.config import ConfigError, EngineConfig, WarmupShape
from harness.engine.host import EngineHost, EngineStartError
from harness.scenario import EngineLimits, PromptSet, Scenario
from harness.targets import target_for
from harness.variants import VARIANTS, select_variants
from tests.suite_runner import run_suite


def cfg(**kw):
    base = dict(target="vllm-cpu", model="/m", max_model_len=256, max_num_seqs=4)
    base.update(kw)
    return EngineConfig(**base)


def test_unknown_target_names_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown target 'tpu'.*vllm-cpu, spyre, neuron"):
        cfg(target="tpu")


def test_unknown_spyre_mode_and_backend():
    with pytest.raises(ConfigError, match=r"unknown spyre mode 'xx'.*sb, cb, cp"):
        cfg(target="spyre", mode="xx", backend="eager")
    with pytest.raises(ConfigError, match=r"unknown spyre backend 'gpu'.*eager, sendnn"):
        cfg(target="spyre", mode="cb", backend="gpu")


def test_mode_on_a_target_without_modes():
    with pytest.raises(ConfigError, match="takes no mode or backend"):
        cfg(mode="cb")


def test_spyre_geometry_is_checked():
    with pytest.raises(ConfigError, match="not a multiple of the 64-token KV block"):
        cfg(target="spyre", mode="cb", backend="eager", max_model_len=200)
    with pytest.raises(ConfigError, match="max_num_batched_tokens a multiple of 64"):
        cfg(target="spyre", mode="cp", backend="eager", max_num_batched_tokens=100)
    with pytest.raises(ConfigError, match="warmup prompt length 100 is not a multiple of 64"):
        cfg(target="spyre", mode="sb", backend="eager", warmup=WarmupShape(100, 20, 2))


def test_unknown_target_selection():
    with pytest.raises(ValueError, match=r"unknown target 'spyre-foo'.*spyre-eager-cb"):
        select_variants("spyre-foo")
    assert [v.id for v in select_variants("cb")] == ["spyre-eager-cb", "spyre-sendnn-cb"]
    assert {v.id for v in select_variants("spyre-eager")} == {
        "spyre-eager-sb", "spyre-eager-cb", "spyre-eager-cp"}
    assert len(select_variants("")) == len(VARIANTS)


def test_prompt_longer_than_max_model_len():
    with pytest.raises(ConfigError, match=r"prompt of 250 tokens \+ max_tokens 16 exceeds max_model_len 256"):
        target_for(cfg()).check_request(250, 16)


def test_spyre_cb_counts_the_padded_prompt():
    t = target_for(cfg(target="spyre", mode="cb", backend="eager"))
    t.check_request(192, 64)  # exactly fits
    with pytest.raises(ConfigError, match=r"padded to 256.*exceeds max_model_len 256"):
        t.check_request(193, 1)


def test_static_batching_prompt_must_fit_warmup_shape():
    t = target_for(cfg(target="spyre", mode="sb", backend="eager", warmup=WarmupShape(64, 20, 2)))
    t.check_request(64, 20)
    with pytest.raises(ConfigError, match=r"does not fit the static-batching warmup shape \(prompt_len 64"):
        t.check_request(65, 20)
    with pytest.raises(ConfigError, match="new_tokens 20"):
        t.check_request(10, 21)


def test_prompt_set_with_unknown_prompt(tmp_path):
    bad = {"name": "x", "engine": {"max_model_len": 128, "max_num_seqs": 2}, "max_tokens": 4,
           "prompts": {"a": {"text": "hi"}}, "cases": {"c": {"prompts": ["a", "nope"]}}}
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="case 'c' names unknown prompt 'nope'"):
        PromptSet.load(p)


def test_scenario_is_refused_before_the_engine_starts(tmp_path):
    from harness.session import HilSession, SessionOptions

    session = HilSession(SessionOptions(cache_dir=tmp_path, reports_dir=tmp_path))
    from harness.scenario import RequestSpec

    sc = Scenario("s", [RequestSpec("r0", tuple(range(250)), 16)], EngineLimits(256, 4))
    with pytest.raises(ConfigError, match="scenario s, request r0: prompt of 250 tokens"):
        session.generate(cfg(), sc)
    assert not session.engine_started(cfg()) and session.stats().engines == []


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
    run = run_suite(tmp_path, "suites/test_token_equality.py", "--target", "tpu")
    assert run.returncode == 4
    assert "--target: unknown target 'tpu'" in run.output
    run = run_suite(tmp_path, "suites/test_token_equality.py", "--model", str(tmp_path / "nope"))
    assert run.returncode == 4
    assert f"model folder not found: {tmp_path / 'nope'}" in run.output
