"""Device runs skip with the reason here, and fail under --require-device."""

import pytest

from harness.targets.neuron.kind import NeuronTarget
from harness.targets.spyre.kind import SpyreTarget
from harness.targets.variants import VARIANTS
from tests.suite_runner import run_suite


@pytest.mark.e2e  # runs a child pytest
def test_spyre_card_runs_skip_with_what_was_looked_for(tmp_path):
    if SpyreTarget.availability_probe(VARIANTS["spyre-sendnn-cb"]) is None:
        pytest.skip("a Spyre card is present here: the card runs execute instead")
    run = run_suite(tmp_path, "suites/test_token_equality.py", "-m", "spyre",
                    "--model", "tiny-llama", "-k", "single and not one-token", "-rs")
    assert run.returncode == 0, run.output[-2000:]
    assert set(run.outcomes.values()) == {"skipped"}
    assert len(run.outcomes) == 2  # cp, pc: the default stack's plugin has no sb or cb
    assert "no Spyre device found: looked for PCI vendor:device 1014:06a7" in run.output


@pytest.mark.e2e  # runs a child pytest
def test_require_device_turns_the_skip_into_a_failure(tmp_path):
    if SpyreTarget.availability_probe(VARIANTS["spyre-sendnn-cb"]) is None:
        pytest.skip("a Spyre card is present here: the card runs execute instead")
    run = run_suite(tmp_path, "suites/test_token_equality.py", "-m", "spyre or neuron",
                    "--model", "tiny-llama", "-k", "single and not one-token",
                    "--require-device")
    assert run.returncode == 1
    assert len(run.outcomes) == 3  # the spyre modes of the default stack (cp, pc) + neuron
    # The default stack's sendnn-inference 2.x has no sb or cb: a mode the stack lacks is not
    # collected, device or not; the modes it has fail for the missing device.
    assert not [n for n in run.outcomes if "-sb-" in n or "-cb-" in n], run.outcomes
    missing = set(run.outcomes.values())
    assert missing == {"error"} or missing == {"failed"}, run.outcomes
    assert "device required but missing: no Spyre device found" in run.output or any(
        "device required but missing: no Spyre device found" in m for m in run.messages.values())


def test_neuron_reason_is_precise():
    reason = NeuronTarget.availability_probe(VARIANTS["neuron"])
    if reason is not None:
        assert "looked for /dev/neuron" in reason or "vllm-neuron is not installed" in reason
