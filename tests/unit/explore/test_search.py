"""The search, on a runner whose examples fail by a rule (no engine): it keeps to a geometry
for its workloads, stops at the first failure, shrinks it to the smallest workload and the
simplest geometry where the same check fails, counts refused geometries and examples, keeps
to its budget, and replays a failing geometry first next time."""

from __future__ import annotations

import itertools
import json

from harness.explore.example import Example
from harness.explore.search import CELLS_FILE, Explorer, Identity
from tests.unit.explore.fakes import RuleRunner

ID = Identity("spyre-eager-cp", "tiny-llama", "default", ("forget-free",))


def explorer(tmp_path, runner, budget=60.0, per_geometry=6, seed=0, clock=None, **kw):
    return Explorer(runner, tmp_path / "explore", ID, seed=seed, budget=budget,
                    shrink_budget=60.0, per_geometry=per_geometry, geometry_draws=30,
                    log=lambda line: None,
                    clock=clock or itertools.count(step=0.01).__next__, **kw)


def at_edge(example: Example) -> str | None:
    """Fails where a request's prompt sits on a 64-token edge in a batch of two or more."""
    if example.geometry.max_num_seqs >= 2 and any(r.prompt_len == 64 for r in example.requests):
        return "kv_ledger.block_boundary"
    return None


def test_a_failure_is_found_and_shrunk_to_the_smallest_example(tmp_path):
    runner = RuleRunner(at_edge)
    result = explorer(tmp_path, runner, budget=1e6).run()
    assert result.stopped == "a finding"
    (finding,) = result.findings
    assert finding.check == "kv_ledger.block_boundary"
    (r,) = finding.example.requests
    assert (r.prompt_len, r.max_tokens, r.arrival, r.abort_after, r.shared) == (64, 1, 0, None, 0)
    g = finding.example.geometry
    # the simplest geometry where it still fails: batch 2, the rest simplest
    assert (g.max_model_len, g.max_num_seqs, g.chunk_size, g.pool, g.batch_tkv_limit,
            g.prefix_caching) == (128, 2, 128, "full-batch", None, False)
    assert finding.identity == ID and finding.verdict.check == finding.check
    assert finding.found_after > 0 and finding.examples_before >= 1
    # found on the geometry's shared engine; every shrink step on an engine of its own
    first = runner.runs.index(finding.original)
    assert not any(runner.fresh[:first + 1]) and all(runner.fresh[first + 1:])


def test_the_workloads_of_a_geometry_run_together_on_its_engine(tmp_path):
    runner = RuleRunner(lambda e: None)
    result = explorer(tmp_path, runner, budget=1.0, per_geometry=6).run()
    assert result.findings == [] and result.stopped == "the budget was spent"
    geometries = [e.geometry for e in runner.runs]
    switches = sum(1 for a, b in zip(geometries, geometries[1:], strict=False) if a != b)
    assert switches == result.tally.geometries - 1  # one run of examples per geometry
    assert result.tally.examples == len(runner.runs) <= 6 * result.tally.geometries
    assert result.tally.passed == result.tally.examples


def test_the_budget_ends_the_search_between_examples(tmp_path):
    clock = itertools.count(step=1.0).__next__  # a second passes at every look
    runner = RuleRunner(lambda e: None)
    result = explorer(tmp_path, runner, budget=20.0, clock=clock).run()
    assert result.stopped == "the budget was spent"
    assert 0 < len(runner.runs) < 20


def test_refused_geometries_are_counted_not_run(tmp_path):
    runner = RuleRunner(lambda e: None,
                        refuses=lambda g: "no TKV limit here" if g.batch_tkv_limit else None,
                        refused_at_start=lambda g: "pool too small" if g.pool is None else None)
    result = explorer(tmp_path, runner, budget=1.0).run()
    tally = result.tally
    assert tally.geometries_refused["no TKV limit here"] > 0
    assert all(e.geometry.batch_tkv_limit is None and e.geometry.pool for e in runner.runs)
    assert sum(tally.geometries_refused.values()) + tally.geometries > tally.geometries


def test_a_failing_geometry_is_replayed_first_next_time(tmp_path):
    first = explorer(tmp_path, RuleRunner(at_edge), budget=1e6).run()
    (finding,) = first.findings
    cells = json.loads((tmp_path / "explore" / CELLS_FILE).read_text())
    assert [c["target"] for c in cells.values()] == [ID.target]
    again = RuleRunner(at_edge)
    second = explorer(tmp_path, again, budget=1e6, seed=99).run()
    assert second.findings and second.findings[0].check == finding.check
    assert again.runs[0].geometry == first.findings[0].original.geometry
    assert second.findings[0].examples_before == 1  # the database's example, first
    # another identity (no fault) does not replay it
    other = Explorer(RuleRunner(lambda e: None), tmp_path / "explore",
                     Identity(ID.target, ID.model, ID.stack), seed=0, budget=1.0,
                     shrink_budget=1.0, log=lambda line: None)
    assert other.replay_geometries() == []


def test_a_shrink_cut_short_by_its_time_keeps_the_simplest_failing_example(tmp_path):
    """hypothesis's last failing candidate before the shrink time ran out may be larger than
    one it ran earlier: the finding is the simplest example that failed."""
    clock = itertools.count(step=1.0).__next__  # a second passes at every look
    runner = RuleRunner(lambda e: "kv_ledger.conservation")  # every example fails
    finder = Explorer(runner, tmp_path / "explore", ID, seed=0, budget=1e6, shrink_budget=3.0,
                      per_geometry=6, geometry_draws=30, log=lambda line: None, clock=clock)
    (finding,) = finder.run().findings
    assert finding.example.simplicity() == min(e.simplicity() for e in runner.runs)
    assert finding.example.simplicity() <= finding.original.simplicity()


def two_checks(example: Example) -> str:
    """Every example fails, one of two checks by its first prompt's parity: hypothesis
    shrinks both, as two bugs."""
    return "kv_ledger.conservation" if example.requests[0].prompt_len % 2 else "no_preemption"


def test_two_checks_failing_when_the_shrink_time_runs_out_still_make_a_finding(tmp_path):
    """Hypothesis ends a search that met two failing checks, one of them cut short by the
    shrink time, with a group of errors (the spent budget among them): the finding is kept,
    not lost to the group."""
    for shrink in (2.0, 5.0, 9.0):
        clock = itertools.count(step=1.0).__next__
        runner = RuleRunner(two_checks)
        finder = Explorer(runner, tmp_path / f"explore-{shrink}", ID, seed=0, budget=1e6,
                          shrink_budget=shrink, per_geometry=8, geometry_draws=30,
                          log=lambda line: None, clock=clock)
        result = finder.run()
        assert result.stopped == "a finding", (shrink, result.stopped)
        assert result.findings[0].check in ("kv_ledger.conservation", "no_preemption")


def test_an_error_of_the_harness_in_a_group_is_not_taken_for_a_spent_budget(tmp_path):
    """Only the search's own ends are settled: anything else in hypothesis's group of errors
    goes on up, as a harness error."""
    import pytest

    from harness.explore.search import OutOfBudget, _Cell

    finder = explorer(tmp_path, RuleRunner(lambda e: None))
    cell = _Cell()
    assert finder._settle(BaseExceptionGroup("x", [OutOfBudget()]), cell) is None
    group = BaseExceptionGroup("x", [OutOfBudget(), KeyError("bug")])
    with pytest.raises(BaseExceptionGroup):
        finder._settle(group, cell)
