"""An engine shared by a generate() test and a step-driven test: generate() returns when the
last request finishes, which may be a step before the engine frees its blocks (vllm-spyre 1.x's
CB runner frees them one step later), so the engine is drained before the next test and the
step-driven run starts from an idle ledger (order-independent). On the default stack's Spyre
path (sendnn-inference 2.x, spyre-eager-cp) and on vllm-spyre 1.x's CB runner (spyre-1.10)."""

import pytest

from harness.scenario.prompts import EngineLimits, shaped_scenario
from harness.session.facade import HilSession, SessionOptions
from harness.targets.variants import VARIANTS
from tests.suite_runner import SPYRE_1X_STACK, needs_spyre_1x

pytestmark = pytest.mark.e2e  # starts a Spyre plugin engine


@pytest.mark.parametrize(("stack", "variant"), [
    ("default", "spyre-eager-cp"),
    pytest.param(SPYRE_1X_STACK, "spyre-eager-cb", marks=needs_spyre_1x),
], ids=["default-cp", "spyre-1.10-cb"])
def test_generate_leaves_the_spyre_runner_idle_for_the_next_test(tmp_path, stack, variant):
    from fixtures.models import DEFAULT_CACHE_DIR

    hil = HilSession(SessionOptions(cache_dir=DEFAULT_CACHE_DIR, reports_dir=tmp_path,
                                    stack=stack))
    try:
        model = hil.model("tiny-llama")
        limits = EngineLimits(256, 4, cp_chunk=128)  # the chunk is read by cp only
        cfg = VARIANTS[variant].engine_config(str(model.path), limits, stack=stack)
        batch = shaped_scenario("batch", model.tokenizer, [(20, 8, 0), (70, 12, 0)], limits)
        hil.generate(cfg, batch)

        idle = hil.check_idle_ledgers(cfg, "after generate()")
        assert idle.ok, idle.details

        steps = shaped_scenario("steps", model.tokenizer, [(30, 6, 0)], limits)
        trace = hil.run_steps(cfg, steps)
        ledger = hil.check_ledger(trace)
        assert ledger.ok, ledger.details
        assert len(hil.stats().engines) == 1  # one engine served both
    finally:
        hil.close()
