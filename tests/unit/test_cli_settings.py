"""The `hil` commands take their shared arguments from the pytest options' declarations: the
same HIL_* variables (HIL_INVENTORY, HIL_REPORTS_DIR, HIL_DEVICE_ROOT, HIL_SHARD,
HIL_CACHE_DIR, HIL_STACK...), the same types and ranges; a bad value is refused with exit 2
before the command does anything."""

import pytest

from harness import cli, selftest
from tests.bad_input import INV, assert_nothing_lost, earlier_run, write


def _called(monkeypatch, module, name):
    """Replace a command's body: main() then hands it the parsed arguments."""
    seen = {}

    def fake(args, extra):
        seen["args"], seen["extra"] = args, extra
        return 0

    monkeypatch.setattr(module, name, fake)
    return seen


def test_hil_nightly_uses_hil_inventory_and_passes_it_on(monkeypatch, tmp_path, capsys):
    inv = write(tmp_path, "inv.toml", INV)
    monkeypatch.setenv("HIL_INVENTORY", str(inv))
    run = _called(monkeypatch, cli, "cmd_run")
    assert cli.main(["nightly", "--reports-dir", str(tmp_path / "r")]) == 0
    assert f"--inventory={inv}" in run["extra"]
    assert f"devices from {inv}: card0" in capsys.readouterr().out  # not discovery's


def test_hil_nightly_with_a_missing_hil_inventory_is_refused(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HIL_INVENTORY", str(tmp_path / "nope.toml"))
    assert cli.main(["nightly", "--reports-dir", str(tmp_path / "r")]) == 2
    assert "hil nightly: inventory file not found:" in capsys.readouterr().err


@pytest.mark.parametrize("variable, value, argv, attr", [
    ("HIL_REPORTS_DIR", "{tmp}/reports", ["report"], "reports_dir"),
    ("HIL_DEVICE_ROOT", "{tmp}", ["devices"], "root"),
    ("HIL_SHARD", "2/3", ["nightly"], "shard"),
    ("HIL_SHARD_DURATIONS", "{tmp}/d.json", ["nightly", "--shard", "1/2"], "shard_durations"),
    ("HIL_CACHE_DIR", "{tmp}/cache", ["models"], "cache_dir"),
    ("HIL_STACK", "default", ["run"], "stacks"),
    ("HIL_INVENTORY", "{tmp}/inv.toml", ["devices"], "inventory"),
])
def test_a_hil_command_takes_its_arguments_variable(monkeypatch, tmp_path, variable, value,
                                                     argv, attr):
    value = value.format(tmp=tmp_path)
    monkeypatch.setenv(variable, value)
    name = {"report": "cmd_report", "devices": "cmd_devices", "nightly": "cmd_nightly",
            "models": "cmd_models", "run": "cmd_run"}[argv[0]]
    seen = _called(monkeypatch, cli, name)
    assert cli.main(argv) == 0
    assert getattr(seen["args"], attr) == value
    assert not (tmp_path / "reports").exists() and not (tmp_path / "cache").exists()


def test_hil_selftest_takes_hil_inventory_and_hil_reports_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HIL_INVENTORY", str(tmp_path / "inv.toml"))
    monkeypatch.setenv("HIL_REPORTS_DIR", str(tmp_path))
    seen = _called(monkeypatch, selftest, "selftest_command")
    assert cli.main(["selftest"]) == 0
    assert (seen["args"].inventory, seen["args"].reports_dir) == (str(tmp_path / "inv.toml"),
                                                                 str(tmp_path))
    assert seen["args"].lease_dir == ""  # none given: the child pytest's own


@pytest.mark.parametrize("variable, value, argv, message", [
    ("HIL_SHARD", "3/2", ["nightly"], "hil nightly: env HIL_SHARD (option --shard): '3/2' is out"
     " of range"),
    ("HIL_REPORTS_DIR", "{tmp}/afile", ["report"], "hil report: env HIL_REPORTS_DIR (option"
     " --reports-dir): "),
    ("HIL_DEVICE_ROOT", "{tmp}/nope", ["devices"], "hil devices: env HIL_DEVICE_ROOT (option"
     " --root): "),
    ("HIL_CACHE_DIR", "{tmp}/afile", ["models"], "is a file, not a folder"),
])
def test_a_bad_variable_refuses_the_command_naming_it(monkeypatch, tmp_path, capsys, variable,
                                                       value, argv, message):
    earlier = earlier_run(tmp_path / "r")
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv(variable, value.format(tmp=tmp_path))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert_nothing_lost(earlier)


@pytest.mark.parametrize("argv, message", [
    (["report", "--serve", "--port", "99999"], "argument --port: '99999' is out of range;"
     " expected a port, a whole number from 0 to 65535"),
    (["report", "--port", "http"], "argument --port: 'http' is not a whole number"),
    (["nightly", "--shard", "0/2"], "argument --shard: '0/2' is out of range"),
    (["report", "--reports-dir", "{tmp}/afile"], "argument --reports-dir: '"),
    (["run", "--reports-dir", "/proc"], "is a folder this user cannot write in"),
])
def test_a_bad_argument_is_refused_at_parse(tmp_path, capsys, argv, message):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as e:
        cli.main([a.format(tmp=tmp_path) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_a_flag_variable_is_strict_for_pytest_and_hil(monkeypatch):
    from harness.plugin.options import BY_NAME, EnvProblem, env_default

    monkeypatch.setenv("HIL_REQUIRE_DEVICE", "false")
    assert env_default(BY_NAME["--require-device"]) is False
    monkeypatch.setenv("HIL_REQUIRE_DEVICE", "yes please")
    assert isinstance(env_default(BY_NAME["--require-device"]), EnvProblem)


def test_hil_stacks_refuses_a_path(tmp_path, capsys):
    assert cli.main(["run", "--reports-dir", str(tmp_path), "--stacks", "stacks/default.toml"]) == 2
    assert "hil run: --stacks: 'stacks/default.toml' is not a stack name" in capsys.readouterr().err


@pytest.mark.parametrize("faults, message", [
    (["open-simulator"], "--fault open-simulator: no selftest case on this host"),
    (["perturb-logit", "open-other-card"], "--fault open-other-card: no selftest case"),
    (["nope"], "--fault: unknown fault(s) nope; known: "),
])
def test_a_selftest_filter_that_selects_nothing_is_refused(monkeypatch, tmp_path, capsys,
                                                           faults, message):
    monkeypatch.setattr(selftest, "run_case", lambda *a, **k: pytest.fail("a case ran"))
    argv = ["selftest", "--reports-dir", str(tmp_path)]
    for f in faults:
        argv += ["--fault", f]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hil selftest: {message}"), err
    assert "perturb-logit" in err  # the faults that do have a case here are named
    assert not (tmp_path / "selftest").exists()
