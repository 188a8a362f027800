"""Token equality: greedy tokens from every target equal the CPU reference's.

Each case of fixtures/prompts/token_equality.json goes to the device as one
engine call (a batch), and every request is compared position by position with
the transformers reference; a differing token passes only as a documented
near-tie (see harness.checks.tokens), which is reported, never hidden. The
logprobs of the compared tokens must be close to the reference's
(harness.checks.logprobs). The same engine call runs every request once more
teacher-forced, fed the reference's tokens, so every generated position is
judged given the reference's history, also after a near-tie
(harness.checks.forcing).
"""

import pytest

from harness.scenario.prompts import PromptSet

PROMPTS = PromptSet.load("token_equality")

pytestmark = [pytest.mark.token_equality, pytest.mark.nightly, pytest.mark.timeout(1800)]


@pytest.mark.parametrize("case", PROMPTS.case_ids())
def test_greedy_tokens_equal_reference(hil, model, target_variant, case):
    scenario = hil.scenario(PROMPTS, case, model, target_variant)  # as the device compiles it
    engine = hil.engine_config(target_variant, model, scenario)

    reference = hil.reference(model, scenario)
    device = hil.generate(engine, scenario, teacher=reference)

    hil.expect(
        hil.check_tokens(model, scenario, device, reference),
        hil.check_logprobs(scenario, device, reference, model),
        *hil.check_forced(model, scenario, device, reference),
        *hil.check_distribution(model, scenario, device, reference),
        trace=device,
    )
