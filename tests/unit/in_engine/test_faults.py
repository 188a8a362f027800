"""Faults are named from the harness's own unless external ones are allowed, also when
HIL_FAULTS reaches the engine process from an inventory."""

import os

import pytest

from harness.in_engine.faults import ALLOW_EXTERNAL_ENV, apply_faults, parse_fault


def test_faults_by_name_only_unless_allowed(monkeypatch):
    with pytest.raises(ValueError, match="pass --allow-external-faults"):
        parse_fault("os.system:command=id")
    fn, kwargs = parse_fault("os.path.join:a=b", allow_external=True)
    assert fn is os.path.join and kwargs == {"a": "b"}
    # In the engine process: HIL_FAULTS from an inventory obeys the same rule.
    monkeypatch.setenv("HIL_FAULTS", "os.getpid")
    monkeypatch.delenv(ALLOW_EXTERNAL_ENV, raising=False)
    with pytest.raises(ValueError, match="pass --allow-external-faults"):
        apply_faults([], {})


def test_attn_scale_scales_every_attention_layer_vllm_builds(monkeypatch, capsys):
    """The fault wraps the constructor of vLLM's attention layer (found where the installed
    vLLM keeps it): each layer then computes with its score scale times the factor."""
    import sys
    import types

    from harness.in_engine.faults import FAULTS, kernels

    class Attention:
        def __init__(self, num_heads, head_size, scale, num_kv_heads=None):
            self.scale = scale

    module = types.ModuleType("fake_vllm_attention")
    module.Attention = Attention
    monkeypatch.setitem(sys.modules, "fake_vllm_attention", module)
    monkeypatch.setattr(kernels, "_ATTENTION_MODULES", ("no_such_module", "fake_vllm_attention"))
    FAULTS["attn-scale"]({}, factor="1.08")
    assert Attention(4, 16, 0.25).scale == pytest.approx(0.27)
    assert Attention(4, 16, scale=0.5, num_kv_heads=2).scale == pytest.approx(0.54)
    assert "attention scale x1.08" in capsys.readouterr().out
    monkeypatch.setattr(kernels, "_ATTENTION_MODULES", ("no_such_module",))
    with pytest.raises(RuntimeError, match="no vLLM Attention layer found in no_such_module"):
        FAULTS["attn-scale"]({})
