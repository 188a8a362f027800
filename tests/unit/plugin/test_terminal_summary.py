"""The run's terminal summary and stats name the reference cache entries found bad."""

import json

from tests.suite_runner import Reporter, config_for


def test_run_summary_names_bad_reference_entries(tmp_path):
    from harness.session.facade import HilSession, SessionOptions

    session = HilSession(SessionOptions(cache_dir=tmp_path, reports_dir=tmp_path))
    session.ref_cache.bad.append("x.json: wrong shape; recomputed")
    path = session.write_stats("main")
    assert json.loads(path.read_text())["reference_bad"] == ["x.json: wrong shape; recomputed"]
    from harness.plugin.summary import write_summary

    tr = Reporter()
    write_summary(tr, config_for(tmp_path))
    assert "reference cache: 1 bad entry recomputed" in tr.lines
    assert "  bad entry: x.json: wrong shape; recomputed" in tr.lines
