"""An engine shared by a generate() test and a step-driven test: generate() returns when the
last request finishes, one step before the runner frees its blocks, so the engine is drained
before the next test and the step-driven run starts from an idle ledger (order-independent)."""

from harness.checks.ledger import KvSnapshot, check_idle
from harness.scenario import EngineLimits, shaped_scenario
from harness.session import HilSession, SessionOptions
from harness.variants import VARIANTS


def test_generate_leaves_the_spyre_runner_idle_for_the_next_test(tmp_path):
    from fixtures.models import DEFAULT_CACHE_DIR

    hil = HilSession(SessionOptions(cache_dir=DEFAULT_CACHE_DIR, reports_dir=tmp_path))
    try:
        model = hil.model("tiny-llama")
        limits = EngineLimits(256, 4)
        cfg = VARIANTS["spyre-eager-cb"].engine_config(str(model.path), limits)
        batch = shaped_scenario("batch", model.tokenizer, [(20, 8, 0), (70, 12, 0)], limits)
        hil.generate(cfg, batch)

        snaps = [KvSnapshot.from_dict(k) for k in hil.kv_snapshot(cfg)]
        problems = [v for s in snaps for v in check_idle(s, step=None)]
        assert not problems, [str(v) for v in problems]

        steps = shaped_scenario("steps", model.tokenizer, [(30, 6, 0)], limits)
        trace = hil.run_steps(cfg, steps)
        assert hil.ledger_report(trace) is None, hil.ledger_report(trace)
        assert len(hil.pool.started) == 1  # one engine served both
    finally:
        hil.close()
