"""Target selection (``--target``): an unknown name names the known variants."""

import pytest

from harness.targets.variants import VARIANTS, select_variants


def test_unknown_target_selection():
    with pytest.raises(ValueError, match=r"unknown target 'spyre-foo'.*spyre-eager-cb"):
        select_variants("spyre-foo")
    assert [v.id for v in select_variants("cb")] == ["spyre-eager-cb", "spyre-sendnn-cb"]
    assert {v.id for v in select_variants("spyre-eager")} == {
        "spyre-eager-sb", "spyre-eager-cb", "spyre-eager-cp", "spyre-eager-pc"}
    assert len(select_variants("")) == len([v for v in VARIANTS.values() if not v.opt_in])


def test_opt_in_variants_run_only_where_named() -> None:
    """Pausing off (np) is a control: not in an unnamed selection, nor in a kind or prefix."""
    from harness.targets.variants import select_variants

    assert "spyre-eager-np" not in {v.id for v in select_variants(None)}
    assert "spyre-eager-np" not in {v.id for v in select_variants("spyre")}
    assert "spyre-eager-np" not in {v.id for v in select_variants("spyre-eager")}
    assert [v.id for v in select_variants("np")] == ["spyre-eager-np", "spyre-sendnn-np"]
    assert [v.id for v in select_variants("spyre-eager-np")] == ["spyre-eager-np"]
    assert {v.id for v in select_variants("cp,np")} == {
        "spyre-eager-cp", "spyre-sendnn-cp", "spyre-eager-np", "spyre-sendnn-np"}


def test_an_id_names_its_variant_alone_and_the_bf16_target_is_in_unnamed_runs() -> None:
    assert [v.id for v in select_variants("vllm-cpu")] == ["vllm-cpu"]
    assert [v.id for v in select_variants("vllm-cpu-bf16")] == ["vllm-cpu-bf16"]
    assert {"vllm-cpu", "vllm-cpu-bf16"} <= {v.id for v in select_variants(None)}
    bf16 = VARIANTS["vllm-cpu-bf16"]
    assert bf16.markers == ("cpu",) and bf16.suites == ("token_equality",)


def test_the_bf16_target_runs_the_token_equality_suite_only() -> None:
    """Precision shows in the numbers, not in the KV blocks: -m cpu collects vllm-cpu-bf16 for
    token equality and for no other suite."""
    import subprocess
    import sys

    from harness.core.paths import REPO_ROOT

    out = subprocess.run(
        [sys.executable, "-m", "pytest", "suites", "--collect-only", "-q", "-m", "cpu",
         "-p", "no:cacheprovider", "--model", "tiny-llama"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    bf16 = [i for i in ids if "vllm-cpu-bf16" in i]
    assert bf16 and all(i.startswith("suites/test_token_equality.py::") for i in bf16), out.stdout
    assert any("vllm-cpu-bf16" not in i and "test_block_freeing" in i for i in ids)


def test_an_engine_that_does_not_compute_in_the_dtype_asked_for_is_refused() -> None:
    """A bf16 engine that silently ran fp32 would pass the bf16 tolerances for the wrong
    reason: the pool refuses it after start (``check_started``)."""
    from harness.core.config import EngineConfig
    from harness.targets import kind

    def target(backend):
        cfg = EngineConfig(target="vllm-cpu", backend=backend, model="m", max_model_len=256,
                           max_num_seqs=2)
        return kind("vllm-cpu")(cfg)

    assert target("bf16").check_started({"model_dtype": "torch.bfloat16"}) is None
    assert target(None).check_started({"model_dtype": "torch.float32"}) is None
    why = target("bf16").check_started({"model_dtype": "torch.float32"})
    assert why == "asked vLLM for dtype bfloat16, but the engine's model computes in torch.float32"
    assert "unreported" in (target(None).check_started({}) or "")
    assert target("bf16").llm_kwargs()["dtype"] == "bfloat16"
