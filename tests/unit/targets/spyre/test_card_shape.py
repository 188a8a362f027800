"""What a Spyre card compiles: the harness's rule (the engines it starts on the sendnn
backend, the limits it lifts a test to, the skips it gives) and the emulated compiler's refusal,
which must agree with it (no engines)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.core.config import EngineConfig
from harness.core.paths import REPO_ROOT
from harness.geometry.catalog import load_geometries
from harness.scenario.prompts import EngineLimits, Scenario
from harness.session.facade import HilSession, SessionOptions
from harness.targets import kind
from harness.targets.spyre import card_shape

SPYRE = kind("spyre")
VARIANTS = {v.id: v for v in SPYRE.variants}


def test_the_rules_accept_the_card_shapes_and_name_what_is_off() -> None:
    assert card_shape.shape_problems(512, 4, 128) == []
    assert card_shape.shape_problems(32768, 32, 1024) == []
    assert card_shape.shape_problems(256, 4, 128) == ["context 256 is under 512"]
    assert card_shape.shape_problems(576, 4, 128) == []
    assert card_shape.shape_problems(600, 4, 128) == ["context 600 is not a multiple of 64"]
    assert card_shape.shape_problems(65536, 4, 128) == ["context 65536 is over 32768"]
    assert card_shape.shape_problems(512, 2, 128) == [
        "batch 2 is not a power of two of at least 4"]
    assert card_shape.shape_problems(512, 12, 100) == [
        "batch 12 is not a power of two of at least 4", "prefill chunk 100 is not a multiple of 64"]
    geometries = load_geometries()
    for name in ("card", "tp4"):  # what the shipped card geometries declare
        g = geometries[name]
        assert card_shape.shape_problems(g.max_model_len, g.max_num_seqs, g.chunk_size) == [], name


def test_a_tests_limits_are_lifted_to_the_smallest_shape_a_card_compiles() -> None:
    small = EngineLimits(256, 2, cp_chunk=128)
    cp, eager, sb = (VARIANTS[f"spyre-{b}-{m}"] for b, m in
                     (("sendnn", "cp"), ("eager", "cp"), ("sendnn", "sb")))
    assert SPYRE.compiled_limits(cp, small) == EngineLimits(512, 2, cp_chunk=128)
    assert SPYRE.compiled_limits(cp, small, round_batch=True) == EngineLimits(512, 4, cp_chunk=128)
    assert SPYRE.compiled_limits(cp, EngineLimits(600, 5), round_batch=True) == EngineLimits(640, 8)
    assert SPYRE.compiled_limits(eager, small, round_batch=True) == small  # the CPU takes any
    assert SPYRE.compiled_limits(sb, small) == small  # static batching compiles its warmup shape
    assert kind("vllm-cpu").compiled_limits(VARIANTS["spyre-sendnn-cp"], small) == small


def _cfg(variant: str, max_model_len: int, max_num_seqs: int, chunk: int = 128) -> EngineConfig:
    v = VARIANTS[variant]
    return EngineConfig(target="spyre", model="/m", max_model_len=max_model_len,
                        max_num_seqs=max_num_seqs, mode=v.mode, backend=v.backend,
                        max_num_batched_tokens=chunk)


def test_an_engine_a_card_does_not_compile_is_a_problem_naming_the_rule() -> None:
    problem = SPYRE.compile_problem(_cfg("spyre-sendnn-cp", 256, 2))
    assert problem is not None
    assert problem.startswith("spyre-sendnn-cp: a Spyre card does not compile this engine"
                              " (context 256 is under 512; batch 2 is not a power of two of at"
                              " least 4); a card compiles a context of 512 to 32768 tokens")
    assert SPYRE.compile_problem(_cfg("spyre-sendnn-cp", 512, 4)) is None
    assert SPYRE.compile_problem(_cfg("spyre-eager-cp", 256, 2)) is None
    sb = SimpleNamespace(backend="sendnn", mode="sb", max_model_len=256, max_num_seqs=2,
                         max_num_batched_tokens=None)  # its warmup shape is its own
    assert SPYRE.compile_problem(sb) is None  # type: ignore[arg-type]
    assert kind("vllm-cpu").compile_problem(_cfg("spyre-sendnn-cp", 256, 2)) is None


def test_a_geometry_a_card_does_not_compile_is_a_skip_on_the_card_only() -> None:
    g = load_geometries()
    cp = VARIANTS["spyre-sendnn-cp"]
    problem = SPYRE.geometry_problem(cp, g["small"], "default")
    assert problem is not None and "does not compile geometry 'small' (context 256 is under 512)" in problem
    assert "select a geometry of that shape (`card`, `tp4`, or the lab's own)" in problem
    assert SPYRE.geometry_problem(cp, g["card"], "default") is None
    assert SPYRE.geometry_problem(cp, g["tp4"], "default") is None
    assert SPYRE.geometry_problem(VARIANTS["spyre-eager-cp"], g["small"], "default") is None


def test_the_session_skips_a_card_engine_of_a_shape_the_card_does_not_compile(tmp_path: Path) -> None:
    s = HilSession(SessionOptions(cache_dir=tmp_path, reports_dir=tmp_path))
    model = SimpleNamespace(path=Path("/m"))
    narrow = Scenario("s", [], EngineLimits(256, 2, cp_chunk=128))
    with pytest.raises(pytest.skip.Exception, match=r"does not compile this engine \(context 256"
                       r" is under 512; batch 2 .*this test's engine: context 256, batch 2, chunk 128"):
        s.engine_config(VARIANTS["spyre-sendnn-cp"], model, narrow)  # type: ignore[arg-type]
    eager = s.engine_config(VARIANTS["spyre-eager-cp"], model, narrow)  # type: ignore[arg-type]
    assert (eager.max_model_len, eager.max_num_seqs) == (256, 2)
    lifted = s.limits(VARIANTS["spyre-sendnn-cp"], 256, 2, round_batch=True)
    cfg = s.engine_config(VARIANTS["spyre-sendnn-cp"], model,  # type: ignore[arg-type]
                          Scenario("s", [], lifted))
    assert (cfg.max_model_len, cfg.max_num_seqs, cfg.max_num_batched_tokens) == (512, 4, 128)


@pytest.fixture
def emulated_compiler(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.syspath_prepend(str(REPO_ROOT / "emulation" / "torch_sendnn"))
    for name in [m for m in sys.modules if m.startswith("torch_sendnn")]:
        monkeypatch.delitem(sys.modules, name)
    for var in ("VLLM_DT_MAX_CONTEXT_LEN", "VLLM_DT_MAX_BATCH_SIZE", "VLLM_DT_CHUNK_LEN"):
        monkeypatch.delenv(var, raising=False)
    import torch_sendnn.backend as backend
    import torch_sendnn.compiler as compiler

    yield SimpleNamespace(backend=backend, compiler=compiler)
    for name in [m for m in sys.modules if m.startswith("torch_sendnn")]:
        del sys.modules[name]  # the emulation must not look installed to later tests


def _plugin_env(monkeypatch: pytest.MonkeyPatch, context: int, batch: int, chunk: int) -> None:
    # as the plugin hands them to the runtime (platform.py: the batch at least 2)
    monkeypatch.setenv("VLLM_DT_MAX_CONTEXT_LEN", str(context))
    monkeypatch.setenv("VLLM_DT_MAX_BATCH_SIZE", str(max(batch, 2)))
    monkeypatch.setenv("VLLM_DT_CHUNK_LEN", str(chunk))


def test_the_emulated_compiler_refuses_what_the_harness_does_not_start(
        emulated_compiler, monkeypatch: pytest.MonkeyPatch) -> None:
    for context in (256, 448, 512, 544, 600, 2048, 32768, 40960):
        for batch in (1, 2, 3, 4, 6, 8, 16, 32):
            for chunk in (100, 128, 512):
                _plugin_env(monkeypatch, context, batch, chunk)
                harness = bool(card_shape.shape_problems(context, batch, chunk))
                emulated = bool(emulated_compiler.compiler.refusals())
                assert harness == emulated, (context, batch, chunk)


def test_the_emulated_backend_refuses_a_dynamic_graph_at_a_shape_the_card_does_not_compile(
        emulated_compiler, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = SimpleNamespace(code="def forward(x): return x", graph=SimpleNamespace(nodes=[]),
                            forward=lambda *a: a)
    _plugin_env(monkeypatch, 256, 2, 128)
    with pytest.raises(emulated_compiler.compiler.SendnnCompileError,
                       match=r"compilation failed, unsupported shape: VLLM_DT_MAX_CONTEXT_LEN=256:"
                       r" .*; VLLM_DT_MAX_BATCH_SIZE=2: the batch must be a power of two"):
        emulated_compiler.backend.sendnn(graph, [], {"sendnn.dynamic": True})
    assert callable(emulated_compiler.backend.sendnn(graph, [], {}))  # a static graph: one shape
    _plugin_env(monkeypatch, 512, 4, 128)
    assert callable(emulated_compiler.backend.sendnn(graph, [], {"sendnn.dynamic": True}))


def test_torch_compile_on_the_emulated_backend_fails_at_a_shape_the_card_does_not_compile(
        emulated_compiler, monkeypatch: pytest.MonkeyPatch) -> None:
    # Through torch.compile as the plugin's model loader calls it: the options reach the backend.
    import torch

    _plugin_env(monkeypatch, 256, 4, 128)
    model = torch.compile(torch.nn.Linear(4, 4), backend="sendnn", options={"sendnn.dynamic": True})
    with pytest.raises(Exception, match="compilation failed, unsupported shape: VLLM_DT_MAX_CONTEXT_LEN=256"):
        model(torch.ones(2, 4))
    torch._dynamo.reset()
