"""Neuron's ``hil selftest`` cases: on a Neuron device, the faults that patch vLLM itself (the
device required, not skipped). A host without one has no Neuron case."""

from __future__ import annotations

from harness.targets.selftest_case import Case, vllm_cases

DEVICE_CASES: tuple[Case, ...] = vllm_cases("neuron", extra=("--require-device",))
