"""A scenario no engine can serve is refused before the engine starts."""

import pytest

from harness.core.config import ConfigError
from harness.scenario.prompts import EngineLimits, Scenario
from tests.bad_input import cfg


def test_scenario_is_refused_before_the_engine_starts(tmp_path):
    from harness.session.facade import HilSession, SessionOptions

    session = HilSession(SessionOptions(cache_dir=tmp_path, reports_dir=tmp_path))
    from harness.scenario.prompts import RequestSpec

    sc = Scenario("s", [RequestSpec("r0", tuple(range(250)), 16)], EngineLimits(256, 4))
    with pytest.raises(ConfigError, match="scenario s, request r0: prompt of 250 tokens"):
        session.generate(cfg(), sc)
    assert not session.engine_started(cfg()) and session.stats().engines == []
