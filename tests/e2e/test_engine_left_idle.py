"""An engine shared by a generate() test and a step-driven test: generate() returns when the
last request finishes, one step before the runner frees its blocks, so the engine is drained
before the next test and the step-driven run starts from an idle ledger (order-independent)."""

import pytest

from harness.scenario.prompts import EngineLimits, shaped_scenario
from harness.session.facade import HilSession, SessionOptions
from harness.targets.variants import VARIANTS

pytestmark = pytest.mark.e2e  # starts a vllm-spyre engine


def test_generate_leaves_the_spyre_runner_idle_for_the_next_test(tmp_path):
    from fixtures.models import DEFAULT_CACHE_DIR

    hil = HilSession(SessionOptions(cache_dir=DEFAULT_CACHE_DIR, reports_dir=tmp_path))
    try:
        model = hil.model("tiny-llama")
        limits = EngineLimits(256, 4)
        cfg = VARIANTS["spyre-eager-cb"].engine_config(str(model.path), limits)
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
