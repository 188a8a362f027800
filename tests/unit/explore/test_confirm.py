"""A finding is confirmed before it is reported: its shrunk example replayed on fresh engines
(three by default, as triage repeats a failure) must fail the same check with the same cause
each time; otherwise it is flaky, reported with each replay's verdict line, not as a defect.
Each finding names the checks that held on its example."""

from __future__ import annotations

import itertools

import pytest

from harness import cli
from harness.core.verdict import Verdict
from harness.explore.command import report
from harness.explore.confirm import (
    CONFIRM_REPLAYS,
    CONFIRMED,
    FLAKY,
    OTHER_CAUSE,
    OTHER_CHECK,
    PASSED,
    REFUSED,
    SAME,
    UNCONFIRMED,
    Finding,
    cause,
    confirm,
)
from harness.explore.findings import FINDINGS_FILE, RunInfo, console_lines, write_findings
from harness.explore.runner import FAILED, REJECTED, Outcome
from harness.explore.runner import PASSED as RUN_PASSED
from harness.explore.search import Explorer, Identity, SearchResult, Tally
from harness.triage.plan import REPEATS
from tests.unit.explore.fakes import RuleRunner, ScriptedRunner
from tests.unit.explore.test_findings import EXAMPLE

ID = Identity("spyre-eager-cp", "tiny-llama", "default", ("forget-free",))
LEAK = "kv invariant conservation broken at step {}: {} of 3 blocks are neither free, owned nor pad: {}"
HELD = [Verdict.passed("kv_aborts"), Verdict.passed("token_equality")]


def failed(check: str = "kv_ledger.conservation", why: str = LEAK.format(0, 1, "[1]")) -> Outcome:
    return Outcome(FAILED, verdicts=[Verdict.failed(check, why), *HELD])


def finding(outcome: Outcome | None = None) -> Finding:
    outcome = outcome or failed()
    check = outcome.failure.check  # type: ignore[union-attr]
    return Finding(check=check, example=EXAMPLE, outcome=outcome, identity=ID, found_after=4.0,
                   examples_before=2, shrink_seconds=3.0, shrink_runs=5, original=EXAMPLE)


def replayed(*outcomes: Outcome, replays: int | None = None) -> tuple[Finding, ScriptedRunner]:
    runner = ScriptedRunner(list(outcomes))
    f = confirm(finding(), runner, len(outcomes) if replays is None else replays,
                log=lambda line: None, clock=itertools.count().__next__)
    return f, runner


def test_the_cause_is_the_first_line_with_what_moves_between_runs_made_alike():
    def same(a: str, b: str) -> bool:
        return cause(Verdict.failed("c", a)) == cause(Verdict.failed("c", b))

    assert same(LEAK.format(0, 1, "[1]"), LEAK.format(7, 2, "[4, 5]"))  # steps, counts, ids
    assert same("request r4 reports 64 cached tokens but shares only 63 with request r0",
                "request r2 reports 128 cached tokens but shares only 127 with request r1")
    assert same("EngineCrashed: engine exited (pid 4242), log /tmp/tmpa1b2/engine-3.log",
                "EngineCrashed: engine exited (pid 17), log /tmp/tmpzz9/engine-1.log")
    assert same("block at 0x7f3a2c00 freed twice", "block at 0x55d0 freed twice")
    assert same("step 3\nmore text", "step 4\nother text")  # the first line only
    assert not same(LEAK.format(0, 1, "[1]"), "kv invariant freed_on_finish broken at step 0")
    assert not same("EngineCrashed: engine exited", "EngineTimeout: engine exited")


def test_a_failure_that_reproduces_on_every_fresh_engine_is_confirmed():
    moved = failed(why=LEAK.format(3, 2, "[0, 2]"))  # the same cause at another step
    f, runner = replayed(failed(), moved, failed())
    c = f.confirmation
    assert c is not None and c.status == CONFIRMED and not f.flaky
    assert runner.fresh == [True, True, True]  # each replay on an engine of its own
    assert [r.outcome for r in c.replays] == [SAME] * 3
    assert c.replays[1].line == f"[check kv_ledger.conservation] {LEAK.format(3, 2, '[0, 2]')}"
    assert c.summary() == ("confirmed: failed the same way (the same check, the same cause) in"
                           " 3 of 3 replays on fresh engines")


def test_a_replay_that_passes_or_fails_otherwise_makes_the_finding_flaky_with_its_runs():
    other_cause = failed(why="kv invariant conservation broken at step 2: the pool has no pad")
    other_check = failed("kv_ledger.freed_on_finish", "kv invariant freed_on_finish broken")
    passed = Outcome(RUN_PASSED, verdicts=HELD)
    refused = Outcome(REJECTED, "the engine did not start: out of memory", whole_geometry=True)
    f, _ = replayed(failed(), other_cause, other_check, passed, refused)
    c = f.confirmation
    assert c is not None and c.status == FLAKY and f.flaky and c.reproduced == 1
    assert [r.outcome for r in c.replays] == [SAME, OTHER_CAUSE, OTHER_CHECK, PASSED, REFUSED]
    assert c.lines() == [
        f"replay 1: failed the same way: [check kv_ledger.conservation] {LEAK.format(0, 1, '[1]')}",
        "replay 2: failed with another cause: [check kv_ledger.conservation] kv invariant"
        " conservation broken at step 2: the pool has no pad",
        "replay 3: failed another check: [check kv_ledger.freed_on_finish] kv invariant"
        " freed_on_finish broken",
        "replay 4: passed: 2 check(s) held",
        "replay 5: refused: the engine did not start: out of memory",
    ]
    assert c.summary().startswith("flaky: failed the same way (the same check, the same cause)"
                                  " in 1 of 5 replays") and "not reported as a defect" in c.summary()


def test_no_replay_asked_leaves_the_finding_unconfirmed_not_flaky():
    f, runner = replayed(replays=0)
    assert runner.fresh == [] and f.confirmation is not None
    assert f.confirmation.status == UNCONFIRMED and not f.flaky
    assert "--confirm 0" in f.confirmation.summary()


def test_the_default_count_of_replays_is_triages():
    assert CONFIRM_REPLAYS == REPEATS == 3
    parsers = cli.subcommand_parsers(cli.build_parser())
    parse = parsers["explore"].parse_args
    assert parse(["--budget", "5"]).confirm == 3 and parse(["--budget", "5", "--confirm", "0"]).confirm == 0


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_a_count_of_replays_not_a_whole_number_is_refused(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["explore", "--reports-dir", str(tmp_path), "--budget", "5", "--confirm", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --confirm" in err and "a whole number, 0 or more" in err, err
    assert not (tmp_path / "explore").exists()


def test_the_search_replays_its_finding_on_fresh_engines_before_reporting_it(tmp_path):
    def at_edge(example):
        return "kv_ledger.block_boundary" if any(r.prompt_len == 64 for r in example.requests) \
            else None

    for replays in (3, 0):
        runner = RuleRunner(at_edge)
        search = Explorer(runner, tmp_path / f"explore-{replays}", ID, seed=0, budget=1e6,
                          shrink_budget=60.0, per_geometry=6, geometry_draws=30,
                          confirm=replays, log=lambda line: None,
                          clock=itertools.count(step=0.01).__next__)
        (f,) = search.run().findings
        assert f.confirmation is not None and len(f.confirmation.replays) == replays
        # the last runs are the replays: the shrunk example, each on a fresh engine
        if replays:
            assert runner.runs[-replays:] == [f.example] * replays
            assert runner.fresh[-replays:] == [True] * replays
            assert f.confirmation.status == CONFIRMED
        else:
            assert f.confirmation.status == UNCONFIRMED


def info(tmp_path) -> RunInfo:
    return RunInfo(seed=0, budget=10, shrink_budget=5, model="tiny-llama", stack="default",
                   explore_dir=tmp_path / "explore")


def result(*findings: Finding) -> SearchResult:
    return SearchResult(list(findings), Tally(examples=4, passed=3, failed=1, geometries=1),
                        9.0, "a finding")


def test_findings_md_shows_the_replays_and_the_checks_that_held(tmp_path):
    f, _ = replayed(failed(), failed(), failed())
    write_findings(info(tmp_path), [("spyre-eager-cp", result(f))])
    text = (tmp_path / "explore" / FINDINGS_FILE).read_text()
    assert text.startswith("# hil explore: 1 finding\n")
    assert f"## Finding {f.key}: [check kv_ledger.conservation]" in text
    assert "Confirmed: failed the same way (the same check, the same cause) in 3 of 3" in text
    assert "| 3 | failed the same way | 1.0 | [check kv_ledger.conservation] kv invariant" in text
    assert "Checks that held on this example: kv_aborts, token_equality." in text


def test_a_flaky_finding_is_written_and_said_as_flaky_and_exits_1(tmp_path, capsys):
    f, _ = replayed(failed(), Outcome(RUN_PASSED, verdicts=HELD), failed())
    tests = write_findings(info(tmp_path), [("spyre-eager-cp", result(f))])
    text = (tmp_path / "explore" / FINDINGS_FILE).read_text()
    assert text.startswith("# hil explore: 1 flaky finding (not confirmed)\n"), text
    assert f"## Flaky finding {f.key}: [check kv_ledger.conservation]" in text
    assert "Flaky: failed the same way (the same check, the same cause) in 2 of 3" in text
    assert "| 2 | passed | 1.0 | 2 check(s) held |" in text
    assert "flaky" in tests[0].read_text()  # its regression test says so too
    assert report(info(tmp_path), [("spyre-eager-cp", result(f))], tests) == 1
    out = capsys.readouterr().out
    assert f"hil explore: flaky finding {f.key}: [check kv_ledger.conservation]" in out
    assert "hil explore: flaky: failed the same way" in out
    assert "hil explore: replay 2: passed: 2 check(s) held" in out
    assert "hil explore: checks that held on its example: kv_aborts, token_equality" in out


def test_the_console_names_a_confirmed_finding_and_the_checks_that_held():
    f, _ = replayed(failed(), failed(), failed())
    lines = console_lines(f)
    assert lines[0] == f"finding {f.key}: [check kv_ledger.conservation] {LEAK.format(0, 1, '[1]')}"
    assert lines[2].startswith("confirmed: failed the same way")
    assert not any(line.startswith("replay ") for line in lines)  # listed when flaky only
    assert lines[-1] == "checks that held on its example: kv_aborts, token_equality"
