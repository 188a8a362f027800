"""One real calibration: tiny-llama in bf16 on a few of the suites' prompts, and the 8 %
attention-scale fault judged by its thresholds (a few seconds of CPU)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from fixtures import models
from fixtures.models import build_model, model_content_hash
from harness.calibration.fault import judge_measurement
from harness.calibration.measure import measure, suite_sequences
from harness.calibration.store import calibrate


@pytest.fixture(scope="module")
def llama() -> Path:
    # The suites' own model cache: a trained build costs CPU time, so it is made once and shared.
    return build_model("tiny-llama", Path(os.environ.get("HIL_CACHE_DIR",
                                                          str(models.DEFAULT_CACHE_DIR))))


def test_tiny_llama_bf16_noise_is_measured_and_an_attention_fault_exceeds_it(
        llama: Path, tmp_path: Path) -> None:
    sequences = suite_sequences(AutoTokenizer.from_pretrained(str(llama)))[:4]
    digest = model_content_hash(llama)
    c = calibrate(llama, digest, "bf16", tmp_path, sequences=sequences)
    th = c.thresholds
    n = sum(s.max_tokens for s in sequences)
    assert c.measured and th.positions == n == c.value["positions"]
    assert c.value["reference_disagreements"] == 0
    kl, full = th.metrics["kl_topk"], th.metrics["kl_full"]
    assert 0.0 < kl.p99 <= kl.max <= full.max * 1.001  # bf16 is noisy; the bound stays under
    assert th.metrics["chosen_logprob"].max < 0.5  # well under the documented card tolerance
    assert not calibrate(llama, digest, "bf16", tmp_path, sequences=sequences).measured

    faulted = measure(llama, digest, "bf16", tmp_path, sequences=sequences, attn_scale=1.08)
    judged = {j.metric: j for j in judge_measurement(faulted, th)}
    assert judged["kl_topk"].run_failed and judged["chosen_logprob"].run_failed
    honest = measure(llama, digest, "bf16", tmp_path, sequences=sequences)
    assert not any(j.run_failed for j in judge_measurement(honest, th))
