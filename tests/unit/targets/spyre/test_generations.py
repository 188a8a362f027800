"""The Spyre plugin generations: which one a stack carries, and the platform check."""

from __future__ import annotations

from harness.targets.spyre.generations import (
    SENDNN_INFERENCE,
    VLLM_SPYRE,
    by_distribution,
    for_stack,
    platform_problem,
)


def test_each_stack_names_its_generation():
    assert for_stack("default") is SENDNN_INFERENCE
    assert for_stack("spyre-1.10") is VLLM_SPYRE
    assert for_stack("legacy-spyre-0.4") is VLLM_SPYRE
    assert for_stack("neuron") is None
    assert for_stack("no-such-stack") is None


def test_newest_generation_wins_on_a_host_with_both():
    assert by_distribution({"vllm-spyre", "sendnn-inference"}) is SENDNN_INFERENCE


def test_names_differ_per_generation():
    assert SENDNN_INFERENCE.var("DYNAMO_BACKEND") == "SENDNN_INFERENCE_DYNAMO_BACKEND"
    assert VLLM_SPYRE.var("DYNAMO_BACKEND") == "VLLM_SPYRE_DYNAMO_BACKEND"
    assert VLLM_SPYRE.mode_env("cb") == {"VLLM_SPYRE_USE_CB": "1", "VLLM_SPYRE_USE_CHUNKED_PREFILL": "0"}
    # 2.x has one runner; pausing is on as users run it, off only in mode np
    assert SENDNN_INFERENCE.mode_env("cp") == {"SENDNN_INFERENCE_PAUSING_ENABLED": "1"}
    assert SENDNN_INFERENCE.mode_env("np") == {"SENDNN_INFERENCE_PAUSING_ENABLED": "0"}
    assert SENDNN_INFERENCE.mode_kwargs("np") == {"enable_prefix_caching": False}
    assert SENDNN_INFERENCE.mode_kwargs("pc") == {"enable_prefix_caching": True}
    assert SENDNN_INFERENCE.mode_kwargs("cp") == {"enable_prefix_caching": False}


def test_fallback_to_another_platform_names_both():
    info = {"platform_module": "vllm.platforms.cpu", "platform": "CpuPlatform", "plugins": "spyre"}
    why = platform_problem(SENDNN_INFERENCE, info, "spyre-eager-cp")
    assert why is not None
    assert "sendnn_inference.platform.SpyrePlatform" in why and "vllm.platforms.cpu.CpuPlatform" in why
    assert "VLLM_PLUGINS='spyre'" in why


def test_the_right_platform_passes():
    info = {"platform_module": "sendnn_inference.platform", "platform": "SpyrePlatform"}
    assert platform_problem(SENDNN_INFERENCE, info, "spyre-eager-cp") is None
    assert platform_problem(None, info, "vllm-cpu") is None


def test_a_mode_the_stacks_plugin_lacks_is_a_skip_naming_the_generation():
    from harness.targets.spyre.kind import SpyreTarget
    from harness.targets.variants import VARIANTS

    why = SpyreTarget.stack_feature_problem(VARIANTS["spyre-eager-cb"], "default")
    assert why == ("spyre-eager-cb does not run on stack default: sendnn-inference 2.x has no"
                   " mode 'cb' (its modes: cp, pc, np)")
    assert SpyreTarget.stack_feature_problem(VARIANTS["spyre-eager-pc"], "default") is None
    assert "no mode 'pc'" in SpyreTarget.stack_feature_problem(VARIANTS["spyre-eager-pc"], "spyre-1.10")
    assert SpyreTarget.stack_feature_problem(VARIANTS["spyre-eager-cb"], "spyre-1.10") is None
