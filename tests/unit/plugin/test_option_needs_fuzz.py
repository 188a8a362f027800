"""Property-based tests of "every option either acts or is refused": random combinations of
the pytest plugin's options (and the variables that give them), random ``hil report``,
``hil nightly``, ``hil run`` and ``hil triage`` command lines. The oracle is each rule written
out again here: an option given without what it needs is refused naming both (the variable
when it gave the value), a pytest option a wrapper sets is refused naming the wrapper's own,
and anything else goes on (the command reached, nothing refused).

Bounded (hypothesis max_examples, no child process): a few seconds in all."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import cli, triage_command
from harness.plugin.option_needs import PYTEST_NEEDS, WRAPPER_OWNS
from harness.plugin.options import OPTIONS, check_needs

# The rules, written again: option -> (what the refusal names as needed, does it hold?).
ORACLE = {
    "--python": ("--stack host", lambda v: v["--stack"] == "host"),
    "--shard-durations": ("--shard", lambda v: bool(v["--shard"])),
    "--hil-clean-results": ("--alluredir", lambda v: bool(v["--alluredir"])),
    "--allure-attach-passed": ("--alluredir", lambda v: bool(v["--alluredir"])),
    "--triage-max": ("--no-triage", lambda v: not v["--no-triage"]),
    "--triage-budget": ("--no-triage", lambda v: not v["--no-triage"]),
    "--lease-wait": ("--lease-share", lambda v: not v["--lease-share"]),
    "--no-engine-replace": ("--no-engine-reuse", lambda v: not v["--no-engine-reuse"]),
    "--allow-external-faults": ("--inject-fault", lambda v: bool(v["--inject-fault"]
                                                                  or v["--inventory"])),
}
# A value that says something, per dependent option (its default says nothing).
GIVEN = {"--python": "/opt/py", "--shard-durations": "d.json", "--hil-clean-results": True,
         "--allure-attach-passed": True, "--triage-max": 7, "--triage-budget": 42.0,
         "--lease-wait": 9.0, "--no-engine-replace": True, "--allow-external-faults": True}
# The options the needs look at, with the values a run may have.
STATES = {
    "--stack": st.sampled_from(["default", "host", "canary"]),
    "--shard": st.sampled_from(["", "1/2"]),
    "--alluredir": st.sampled_from([None, "/r/allure-results"]),
    "--no-triage": st.booleans(), "--lease-share": st.booleans(),
    "--no-engine-reuse": st.booleans(),
    "--inject-fault": st.sampled_from([[], ["forget-free"]]),
    "--inventory": st.sampled_from(["", "inv.toml"]),
}
BY = {o.name: o for o in OPTIONS}
FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_the_oracle_covers_every_need():
    assert set(ORACLE) == {n.option for n in PYTEST_NEEDS} == set(GIVEN)


@FUZZ
@given(given_opts=st.lists(st.sampled_from(sorted(GIVEN)), unique=True, max_size=4),
       states=st.fixed_dictionaries(STATES),
       from_env=st.lists(st.sampled_from(sorted(GIVEN)), unique=True, max_size=2))
def test_a_random_run_is_refused_exactly_when_a_rule_says(monkeypatch, given_opts, states,
                                                          from_env):
    values = {o.name: o.declared_default() for o in OPTIONS}
    values.update(states)
    values.update({name: GIVEN[name] for name in given_opts})
    args: list[str] = []
    for name in GIVEN:
        env = BY[name].env
        if env:
            monkeypatch.delenv(env, raising=False)
    for name in given_opts:
        env = BY[name].env
        if name in from_env and env:
            monkeypatch.setenv(env, str(GIVEN[name]))
        else:
            args.append(name)
    config = SimpleNamespace(
        getoption=lambda name, default=None: values.get(name, default),
        option=SimpleNamespace(allure_report_dir=values["--alluredir"]),
        invocation_params=SimpleNamespace(args=args))
    broken = [n.option for n in PYTEST_NEEDS
              if n.option in given_opts and not ORACLE[n.option][1](values)]
    if not broken:
        check_needs(config)
        return
    with pytest.raises(pytest.UsageError) as refused:
        check_needs(config)
    message = str(refused.value)
    first = broken[0]
    env = BY[first].env
    by_variable = first in from_env and env is not None
    assert message.startswith(f"env {env} (option {first})" if by_variable else first)
    assert ORACLE[first][0] in message
    assert message.endswith(f"unset {env}" if by_variable else f"leave {first} out")


# ------------------------------------------------------------------ hil command lines

# --stack never reaches hil run's pytest arguments: argparse takes it for --stacks.
OWNED = sorted({o.option for owned in WRAPPER_OWNS.values() for o in owned} - {"--stack"})
HARMLESS = ["-v", "-k", "single", "--model", "tiny-llama", "-x"]


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[list[str], dict[str, str], str | None]:
    """A random command line and environment, and the option its refusal must name (None:
    accepted)."""
    cmd = draw(st.sampled_from(["report", "nightly", "run", "triage"]))
    env: dict[str, str] = {}
    if cmd == "report":
        serve, port = draw(st.booleans()), draw(st.sampled_from([None, 0, 8080]))
        results, sources = draw(st.sampled_from(["", "res"])), draw(st.sampled_from([[], ["a"]]))
        argv = [cmd, *sources, *(["--serve"] if serve else []),
                *(["--port", str(port)] if port is not None else []),
                *(["--results", results] if results else [])]
        names = ("--port" if port and not serve else None) or (
            "--results" if results and sources else None)
        return argv, env, names
    if cmd == "nightly":
        shard = draw(st.sampled_from(["", "arg", "env"]))
        durations = draw(st.sampled_from(["", "arg", "env"]))
        argv = [cmd, *(["--shard", "1/2"] if shard == "arg" else []),
                *(["--shard-durations", "d.json"] if durations == "arg" else [])]
        env.update({"HIL_SHARD": "1/2"} if shard == "env" else {})
        env.update({"HIL_SHARD_DURATIONS": "d.json"} if durations == "env" else {})
        owned = draw(st.lists(st.sampled_from(OWNED + HARMLESS), max_size=2))
        argv += [f"{o}=x" if o in OWNED else o for o in owned]
        if durations and not shard:
            return argv, env, "--shard-durations"
        return argv, env, next((w.option for w in WRAPPER_OWNS["nightly"] if w.option in owned),
                               None)
    extra = draw(st.lists(st.sampled_from(OWNED + HARMLESS), max_size=3))
    head = [cmd] if cmd == "run" else [cmd, "suites/t.py::a"]
    argv = head + [a for o in extra for a in ([o, "x"] if o in OWNED else [o])]
    own = {w.option for w in WRAPPER_OWNS[cmd]}
    # The first owned option in WRAPPER_OWNS order among the arguments is the one named.
    named = next((w.option for w in WRAPPER_OWNS[cmd] if w.option in extra), None)
    return argv, env, named if named in own else None


@FUZZ
@given(line=command_lines())
def test_a_random_hil_command_line_is_refused_exactly_when_a_rule_says(monkeypatch, capsys,
                                                                       line):
    argv, env, names = line
    reached: list[str] = []
    for module, name in ((cli, "cmd_report"), (cli, "cmd_nightly"), (cli, "cmd_run"),
                         (triage_command, "cmd_triage")):
        monkeypatch.setattr(module, name, lambda args, extra, n=name: reached.append(n) or 0)
    for variable in ("HIL_SHARD", "HIL_SHARD_DURATIONS"):
        if variable in env:
            monkeypatch.setenv(variable, env[variable])
        else:
            monkeypatch.delenv(variable, raising=False)
    code = cli.main(argv)
    err = capsys.readouterr().err
    if names is None:
        assert code == 0 and reached, (argv, env, err)
        return
    assert code == 2 and not reached, (argv, env, err)
    assert err.startswith(f"hil {argv[0]}: ") and "Traceback" not in err
    assert names in err, (argv, err)
    if names in {w.option for w in WRAPPER_OWNS.get(argv[0], ())}:
        use = next(w.use for w in WRAPPER_OWNS[argv[0]] if w.option == names)
        assert (f"own {use} instead" if use else f"leave {names} out") in err
    else:
        variable = {"--shard-durations": "HIL_SHARD_DURATIONS"}.get(names)
        by_env = variable in env and names not in argv
        assert (f"env {variable} (option {names})" in err) if by_env else err.startswith(
            f"hil {argv[0]}: {names} ")
