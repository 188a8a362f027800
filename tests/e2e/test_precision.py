"""Reduced precision on the CPU: vllm-cpu-bf16 is judged by the calibrated bf16 noise, and a
kernel error the size of an 8 % attention-scale error still fails there.

``attn-scale`` multiplies the score scale of every attention layer vLLM builds
(``harness/in_engine/faults/kernels.py``). The same selection without the fault passes (honest
bf16 noise is not a failure); with it most tests of both models fail, each on a numerics check
(on tiny-llama's single request the distribution distance sees it first: ``hil selftest``'s
case), and the fp32 target fails too (there the tight fp32 tolerances see it).
"""

import pytest

from harness.lab.quarantine import host_cpu_flags
from harness.report.categories import classify
from tests.suite_runner import run_suite

pytestmark = pytest.mark.e2e  # each test runs a suite in a child pytest with engines

SINGLE = ("suites/test_token_equality.py", "-k", "single and not one-token",
          "--model", "tiny-llama,tiny-granite")
NUMERICS = {"distribution drift", "logprob drift", "token mismatch"}


def categories(run) -> dict[str, str]:
    return {name: classify("failed", run.messages[name].strip().splitlines()[0])
            for name in run.failed()}


def test_bf16_passes_honestly_and_an_attention_scale_error_fails_it(tmp_path):
    honest = run_suite(tmp_path / "honest", *SINGLE, "--target", "vllm-cpu-bf16")
    assert honest.returncode == 0, honest.output[-3000:]
    assert len(honest.outcomes) == 2 and set(honest.outcomes.values()) == {"passed"}
    # The run says which thresholds it judged by.
    assert "calibrated tiny-llama bf16 (348 positions): logprob limit" in honest.output

    run = run_suite(tmp_path / "fault", "suites/test_token_equality.py",
                    "--model", "tiny-llama,tiny-granite", "--target", "vllm-cpu-bf16",
                    "--inject-fault", "attn-scale:factor=1.08")
    assert run.returncode == 1, run.output[-3000:]
    cats = categories(run)
    for model in ("tiny-llama", "tiny-granite"):
        cases = [n for n in run.outcomes if f"[{model}-" in n]
        failed = [n for n in cases if n in cats]
        assert len(failed) * 2 > len(cases), (model, run.outcomes)  # most cases of each model
    assert set(cats.values()) <= NUMERICS, cats
    assert "distribution drift" in cats.values(), cats
    drift = next(n for n, c in cats.items() if c == "distribution drift")
    assert "than the measured noise allows on vllm-cpu-bf16" in run.messages[drift]
    assert "calibrated bf16" in run.messages[drift]  # the thresholds it was judged by
    selftest = "test_greedy_tokens_equal_reference[tiny-llama-vllm-cpu-bf16-single]"
    if selftest not in cats and "avx512f" not in host_cpu_flags():
        # Known gap: with vLLM's AVX2 kernels the single request stays within the calibrated
        # noise under this fault (9 of the 10 tiny-llama cases still fail it), so hil selftest's
        # selection misses it on such hosts (docs/upstream/vllm-cpu-avx2-bf16-noise.md).
        pytest.xfail("hil selftest's attn-scale selection (single) does not catch the fault on"
                     " a host without AVX-512 (vLLM's AVX2 bf16 kernels)")
    assert cats[selftest] == "distribution drift"  # hil selftest's case


def test_an_attention_scale_error_fails_the_fp32_target(tmp_path):
    run = run_suite(tmp_path, *SINGLE, "--target", "vllm-cpu",
                    "--inject-fault", "attn-scale:factor=1.08")
    assert run.returncode == 1, run.output[-3000:]
    assert len(run.failed()) == 2, run.outcomes
    assert set(categories(run).values()) <= NUMERICS
    assert all("beyond 0.01 nats on vllm-cpu" in run.messages[n] for n in run.failed())
