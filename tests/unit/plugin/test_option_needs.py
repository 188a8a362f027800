"""Every option either acts or is refused (harness/plugin/option_needs.py): each option of the
pytest plugin and of every ``hil`` command is declared independent or listed with what it
needs; one given without it is refused naming both (pytest: exit 4, ``hil``: exit 2); the
pytest options a ``hil`` wrapper sets itself are refused naming the wrapper's own option; a
direct pytest run into a reports folder a ``hil`` command holds is refused by its lock."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import cli
from harness.core.paths import REPO_ROOT
from harness.plugin import option_needs
from harness.plugin.option_needs import (
    COMMAND_INDEPENDENT,
    COMMAND_NEEDS,
    PYTEST_INDEPENDENT,
    PYTEST_NEEDS,
    WRAPPER_OWNS,
    is_independent,
    owned_refusal,
    refusal,
    unmet,
)
from harness.plugin.options import BY_NAME, OPTIONS, check_needs
from harness.staging.run_folder import lock_holder, reports_lock
from tests.bad_input import assert_nothing_lost, earlier_run, write

SUITE = "suites/test_token_equality.py"
USAGE = 4
OPTION = re.compile(r"--[a-z][a-z0-9-]*")


def _hil_options(parser: argparse.ArgumentParser) -> set[str]:
    return {a.option_strings[-1] for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)}


# ------------------------------------------------------------------ the tables are complete


def test_every_pytest_option_is_independent_or_listed():
    names = {o.name for o in OPTIONS}
    dependent = [n.option for n in PYTEST_NEEDS]
    assert len(dependent) == len(set(dependent)), "an option listed twice in PYTEST_NEEDS"
    for name in names:
        listed = name in dependent
        assert listed != is_independent(name), (
            f"{name}: declare it in harness/plugin/option_needs.py, either independent"
            " (PYTEST_INDEPENDENT) or with what it needs (PYTEST_NEEDS), not both")
    stale = (PYTEST_INDEPENDENT | set(dependent)) - names
    assert not stale, f"option_needs.py lists options the plugin does not have: {stale}"


def test_every_hil_option_is_independent_or_listed():
    parsers = cli.subcommand_parsers(cli.build_parser())
    assert set(parsers) == set(COMMAND_INDEPENDENT), "a hil command without its entry"
    for cmd, parser in parsers.items():
        names = _hil_options(parser)
        dependent = {n.option for n in COMMAND_NEEDS.get(cmd, ())}
        assert not dependent & COMMAND_INDEPENDENT[cmd], cmd
        assert names == COMMAND_INDEPENDENT[cmd] | dependent, (
            f"hil {cmd}: declare each option in harness/plugin/option_needs.py (COMMAND_INDEPENDENT"
            f" or COMMAND_NEEDS); parser {sorted(names)}, declared"
            f" {sorted(COMMAND_INDEPENDENT[cmd] | dependent)}")
    assert set(COMMAND_NEEDS) <= set(parsers) and set(WRAPPER_OWNS) <= set(parsers)


def test_what_a_need_names_exists():
    """Each need names options its parser has (pytest's --alluredir is allure-pytest's)."""
    pytest_names = {o.name for o in OPTIONS} | {"--alluredir", "--stacks"}
    for need in PYTEST_NEEDS:
        for name in OPTION.findall(need.needs + " " + need.fix):
            assert name in pytest_names, (need.option, name)
    parsers = cli.subcommand_parsers(cli.build_parser())
    for cmd, needs in COMMAND_NEEDS.items():
        for need in needs:
            for name in OPTION.findall(need.needs + " " + need.fix):
                assert name in _hil_options(parsers[cmd]), (cmd, need.option, name)
    for cmd, owned in WRAPPER_OWNS.items():
        for o in owned:
            assert not o.use or o.use in _hil_options(parsers[cmd]), (cmd, o)


# ------------------------------------------------------------------ pytest: each need


def _values(**given: object) -> dict[str, object]:
    values: dict[str, object] = {o.name: o.declared_default() for o in OPTIONS}
    values.update({"--stack": "default", "--alluredir": None})
    values.update({f"--{k.replace('_', '-')}": v for k, v in given.items()})
    return values


DEFAULTS = {o.name: o.declared_default() for o in OPTIONS}
# Each dependent option given alone, and with what it needs: (given, with the need).
CASES = {
    "--python": ({"python": "/usr/bin/python3"}, {"stack": "host"}),
    "--shard-durations": ({"shard_durations": "d.json"}, {"shard": "1/2"}),
    "--hil-clean-results": ({"hil_clean_results": True}, {"alluredir": "/r"}),
    "--allure-attach-passed": ({"allure_attach_passed": True}, {"alluredir": "/r"}),
    "--triage-max": ({"triage_max": 5, "no_triage": True}, {"no_triage": False}),
    "--triage-budget": ({"triage_budget": 60.0, "no_triage": True}, {"no_triage": False}),
    "--lease-wait": ({"lease_wait": 30.0, "lease_share": True}, {"lease_share": False}),
    "--no-engine-replace": ({"no_engine_replace": True, "no_engine_reuse": True},
                            {"no_engine_reuse": False}),
    "--allow-external-faults": ({"allow_external_faults": True}, {"inject_fault": ["m.f"]}),
}


def test_each_dependent_option_has_a_case():
    assert set(CASES) == {n.option for n in PYTEST_NEEDS}


@pytest.mark.parametrize("need", PYTEST_NEEDS, ids=[n.option for n in PYTEST_NEEDS])
def test_a_dependent_option_without_its_need_is_refused_naming_both(need):
    alone, with_need = CASES[need.option]
    values = _values(**alone)
    assert unmet(PYTEST_NEEDS, values, DEFAULTS) == [need]
    message = refusal(need, values)
    assert message.startswith(need.option) and need.needs in message
    assert f"leave {need.option} out" in message and need.fix in message
    assert unmet(PYTEST_NEEDS, _values(**{**alone, **with_need}), DEFAULTS) == []
    assert unmet(PYTEST_NEEDS, _values(), DEFAULTS) == []  # nothing given: nothing refused


def test_the_message_names_the_variable_that_gave_the_value(monkeypatch):
    """check_needs reads a run's options as pytest parsed them: a value from the option's
    variable is named by the variable (unset it), one from the command line by the option."""
    def config(args: list[str], **given: object) -> SimpleNamespace:
        values = _values(**given)
        return SimpleNamespace(
            getoption=lambda name, default=None: values.get(name, default),
            option=SimpleNamespace(allure_report_dir=values["--alluredir"]),
            invocation_params=SimpleNamespace(args=args))

    monkeypatch.setenv("HIL_HOST_PYTHON", "/opt/card/python")
    with pytest.raises(pytest.UsageError) as refused:
        check_needs(config([], python="/opt/card/python"))
    assert str(refused.value).startswith(
        "env HIL_HOST_PYTHON (option --python) '/opt/card/python' only means something with"
        " --stack host: ")
    assert str(refused.value).endswith("or unset HIL_HOST_PYTHON")
    with pytest.raises(pytest.UsageError, match=r"^--python '/x' only means .* leave --python"
                                                r" out$"):
        check_needs(config(["--python", "/x"], python="/x"))
    check_needs(config([], python="/opt/card/python", stack="host"))  # accepted


# ------------------------------------------------------------------ pytest: child runs


def child_pytest(tmp_path: Path, args: list[str], env: dict[str, str] | None = None,
                 reports: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", SUITE,
           f"--hil-reports-dir={reports or tmp_path / 'reports'}",
           f"--lease-dir={tmp_path / 'leases'}", *args]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, env, message", [
    (["--python", "/usr/bin/python3"], {},
     "ERROR: --python '/usr/bin/python3' only means something with --stack host: it is the"
     " Python the engines of the host stack run in, and this run's stack is 'default'"),
    ([], {"HIL_SHARD_DURATIONS": "durations.json"},
     "ERROR: env HIL_SHARD_DURATIONS (option --shard-durations) 'durations.json' only means"
     " something with --shard: "),
], ids=["python-without-host-stack", "env-shard-durations-without-shard"])
def test_a_child_pytest_refuses_a_dependent_option_alone(tmp_path, args, env, message):
    reports = tmp_path / "reports"
    earlier = earlier_run(reports)
    run = child_pytest(tmp_path, args, env)
    out = run.stdout + run.stderr
    assert run.returncode == USAGE, out[-3000:]
    assert message in out and "Traceback" not in out, out[-3000:]
    assert len([ln for ln in out.splitlines() if ln.startswith("ERROR:")]) == 1, out
    assert_nothing_lost(earlier)
    assert not (reports / "timing.json").exists()


def test_a_direct_run_into_a_reports_folder_a_hil_command_holds_is_refused(tmp_path):
    reports = tmp_path / "reports"
    earlier = earlier_run(reports)
    assert lock_holder(reports) is None  # no lock file yet: nobody holds it
    with reports_lock(reports, "hil run -m cpu"):
        holder = lock_holder(reports)
        assert holder is not None and f"pid {os.getpid()}" in holder
        assert "`hil run -m cpu`" in holder
        run = child_pytest(tmp_path, ["--model", "tiny-llama", "--target", "vllm-cpu"])
    out = run.stdout + run.stderr
    assert run.returncode == USAGE, out[-3000:]
    assert (f"ERROR: --hil-reports-dir {reports}: in use by pid {os.getpid()} on" in out
            and "(`hil run -m cpu`, started " in out), out[-3000:]
    assert "wait for it to finish, or pass another --hil-reports-dir" in out
    assert_nothing_lost(earlier)
    assert lock_holder(reports) is None  # released: the lock file stays, nobody holds it


# ------------------------------------------------------------------ hil commands


def _stub(monkeypatch, module, name: str) -> dict:
    seen: dict = {}

    def fake(args, extra):
        seen.update(args=args, extra=extra)
        return 0

    monkeypatch.setattr(module, name, fake)
    return seen


@pytest.mark.parametrize("argv, message", [
    (["report", "--port", "8080"],
     "hil report: --port 8080 only means something with --serve: it is the port --serve serves"
     " the report on, and this command does not serve it; add --serve, or leave --port out"),
    (["report", "a", "--results", "b"],
     "hil report: --results 'b' only means something with a report of one results folder (no"
     " SOURCE): "),
    (["nightly", "--shard-durations", "d.json"],
     "hil nightly: --shard-durations 'd.json' only means something with --shard: "),
], ids=["port-without-serve", "results-with-sources", "nightly-durations-without-shard"])
def test_a_hil_command_refuses_a_dependent_option_alone(tmp_path, monkeypatch, capsys, argv,
                                                        message):
    seen = {name: _stub(monkeypatch, cli, name) for name in ("cmd_report", "cmd_nightly")}
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not any(seen.values()) and not list(tmp_path.iterdir())


def test_a_hil_command_with_what_the_option_needs_runs(monkeypatch):
    seen = _stub(monkeypatch, cli, "cmd_report")
    assert cli.main(["report", "--serve", "--port", "8080"]) == 0 and seen["args"].port == 8080
    seen = _stub(monkeypatch, cli, "cmd_nightly")
    assert cli.main(["nightly", "--shard", "1/2", "--shard-durations", "d.json"]) == 0
    monkeypatch.setenv("HIL_SHARD", "2/2")
    assert cli.main(["nightly", "--shard-durations", "d.json"]) == 0


@pytest.mark.parametrize("argv, use", [
    (["run", "--alluredir", "X"], "use hil run's own --reports-dir instead"),
    (["run", "-m", "cpu", "--junitxml=x.xml"], "use hil run's own --reports-dir instead"),
    (["run", "--hil-reports-dir", "X"], "use hil run's own --reports-dir instead"),
    (["nightly", "--alluredir=X"], "use hil nightly's own --reports-dir instead"),
    (["run", "--hil-clean-results"], "leave --hil-clean-results out"),
    (["triage", "suites/t.py::a", "--alluredir", "X"], "use hil triage's own --reports-dir"),
    (["triage", "suites/t.py::a", "--triage-budget", "9"], "use hil triage's own --budget"),
], ids=["run-alluredir", "run-junitxml", "run-hil-reports-dir", "nightly-alluredir",
        "run-clean-results", "triage-alluredir", "triage-budget"])
def test_an_option_the_wrapper_sets_is_refused_naming_its_own(tmp_path, monkeypatch, capsys,
                                                              argv, use):
    from harness import triage_command

    seen = [_stub(monkeypatch, cli, "cmd_run"), _stub(monkeypatch, cli, "cmd_nightly"),
            _stub(monkeypatch, triage_command, "cmd_triage")]
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    owned = next(a.split("=")[0] for a in argv[1:] if a.split("=")[0] in
                 {o.option for o in WRAPPER_OWNS[argv[0]]})
    assert err.startswith(f"hil {argv[0]}: {owned} is hil {argv[0]}'s to set: ") and use in err
    assert not any(seen) and not list(tmp_path.iterdir())


def test_hil_run_alluredir_was_a_run_that_recorded_nothing(tmp_path, monkeypatch, capsys):
    """The issue's row: ``hil run --alluredir X`` ran, passed and published nothing (exit 0);
    now nothing runs and the reports folder is not made."""
    ran: list = []
    monkeypatch.setattr(cli.ChildRunner, "run", lambda self, cmd, cwd: ran.append(cmd))
    reports = tmp_path / "reports"
    assert cli.main(["run", "--reports-dir", str(reports), "--alluredir", str(tmp_path)]) == 2
    assert not ran and not reports.exists()
    assert owned_refusal("run", ["-k", "x"]) is None


def test_an_unsharded_hil_run_is_not_given_the_published_durations(tmp_path, monkeypatch):
    """hil run names REPORTS/durations.json to pytest only for a sharded run: pytest refuses
    --shard-durations without --shard."""
    from harness.staging.interrupt import ChildOutcome

    ran: list[list[str]] = []

    def child(self, cmd, cwd):
        ran.append(cmd)
        return ChildOutcome(code=4)  # refused: nothing published, nothing else to fake

    monkeypatch.setattr(cli.ChildRunner, "run", child)
    monkeypatch.delenv("HIL_SHARD", raising=False)
    monkeypatch.delenv("HIL_SHARD_DURATIONS", raising=False)
    reports = tmp_path / "reports"
    reports.mkdir()
    write(reports, "durations.json", '{"tests": {"t.py::a": 1.5}}')
    cli.main(["run", "--reports-dir", str(reports), "-k", "x"])
    cli.main(["run", "--reports-dir", str(reports), "--shard", "1/2"])
    monkeypatch.setenv("HIL_SHARD", "2/2")
    cli.main(["run", "--reports-dir", str(reports)])
    named = [any(a.startswith("--shard-durations=") for a in cmd) for cmd in ran]
    assert named == [False, True, True]


def test_the_tables_are_data_not_code():
    """One declared structure: the module holds the tables and pure functions only."""
    assert all(isinstance(n, option_needs.Need) for n in PYTEST_NEEDS)
    assert all(isinstance(n, option_needs.Need) for ns in COMMAND_NEEDS.values() for n in ns)
    assert all(isinstance(o, option_needs.Owned) for os_ in WRAPPER_OWNS.values() for o in os_)
    assert {n.option for n in PYTEST_NEEDS} <= set(BY_NAME)
