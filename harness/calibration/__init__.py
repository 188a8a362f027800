"""Reduced-precision calibration: the noise of fp16 and bf16 against fp32, measured on the CPU,
and the thresholds the card and half-precision targets judge by (``store.calibrated_thresholds``).

Layering: imports harness.core, harness.reference, harness.scenario and fixtures only; the
pure modules (``thresholds``, ``topk_kl``) carry no torch import, so checks can use them.
"""
