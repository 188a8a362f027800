"""`hil` commands refuse bad input with one message and an exit code, and keep the previous
results, summary and report."""

import sys

import pytest

from harness import cli
from harness.report.generate import ReportToolMissing, find_tool
from harness.staging.staged_run import durations_args
from tests.bad_input import INV, assert_nothing_lost, earlier_run, write


def test_hil_run_with_an_empty_stack_list_is_refused(tmp_path, capsys):
    earlier = earlier_run(tmp_path)
    assert cli.main(["run", "--reports-dir", str(tmp_path), "--stacks", ","]) == 2
    assert "hil run: --stacks ',' names no stack; name one or more of: ['default'" in capsys.readouterr().err
    assert cli.main(["run", "--reports-dir", str(tmp_path), "--stacks", "default,nope"]) == 2
    assert "hil run: --stacks: no stack 'nope'" in capsys.readouterr().err
    assert_nothing_lost(earlier)


def test_hil_run_refused_by_pytest_keeps_the_previous_results(tmp_path, capfd):
    earlier = earlier_run(tmp_path)
    rc = cli.main(["run", "--reports-dir", str(tmp_path), "--target", "bogus"])
    err = capfd.readouterr().err
    assert rc == 4
    assert "--target: unknown target 'bogus'" in err
    assert "pytest refused the arguments (exit 4); the previous results" in err
    assert_nothing_lost(earlier)


def test_hil_nightly_with_a_bad_inventory_keeps_the_previous_results(tmp_path, capsys):
    earlier = earlier_run(tmp_path)
    inv = write(tmp_path, "inv.toml", INV + "address = 59\n")
    assert cli.main(["nightly", "--reports-dir", str(tmp_path), "--inventory", str(inv)]) == 2
    assert "address 59 is a number, expected a string" in capsys.readouterr().err
    assert cli.main(["devices", "--inventory", str(inv)]) == 2
    assert "inv.toml: device #1 ('card0'): address 59" in capsys.readouterr().err
    assert_nothing_lost(earlier)


def test_hil_report_from_a_missing_folder_keeps_the_report(tmp_path, capsys):
    earlier = earlier_run(tmp_path)
    typo = tmp_path / "allure-resluts"
    assert cli.main(["report", "--reports-dir", str(tmp_path), "--results", str(typo)]) == 2
    err = capsys.readouterr().err
    assert f"hil report: --results {typo}: no such results folder" in err
    assert "Nothing was changed" in err
    assert_nothing_lost(earlier)
    assert not typo.exists()


def test_java_home_pointing_nowhere_gets_its_own_message(tmp_path, monkeypatch, capsys):
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    env = {"HIL_ALLURE": sys.executable, "JAVA_HOME": str(tmp_path / "no-jdk"),
           "PATH": str(java.parent)}
    with pytest.raises(ReportToolMissing) as e:
        find_tool(env)
    assert str(e.value) == (f"JAVA_HOME={tmp_path / 'no-jdk'} has no executable bin/java, and"
                            f" Allure 2 runs java from there; unset JAVA_HOME to use {java}"
                            " (java on PATH)")
    assert "Java is not installed" not in str(e.value)
    # Through `hil report`: exit 2, and the previous report stays.
    earlier = earlier_run(tmp_path / "reports")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli.main(["report", "--reports-dir", str(tmp_path / "reports")]) == 2
    assert "JAVA_HOME=" in capsys.readouterr().err
    earlier.pop(tmp_path / "reports" / "summary.md")  # remade from the same results
    assert_nothing_lost(earlier)


def test_hil_run_plans_shards_by_the_published_durations(tmp_path, capsys, monkeypatch):
    """pytest's reports dir under `hil run` is the run's staging folder: the published
    durations.json is named to it; an unreadable one is a warning (the plan goes by count)."""
    import argparse

    monkeypatch.delenv("HIL_SHARD_DURATIONS", raising=False)
    args = argparse.Namespace(shard_durations="")
    durations = write(tmp_path, "durations.json", '{"tests": {"t.py::a": 1.5}}')
    assert durations_args(tmp_path, args, []) == [f"--shard-durations={durations}"]
    assert durations_args(tmp_path, args, ["--shard-durations=d.json"]) == []
    durations.write_text("{not json")
    assert durations_args(tmp_path, args, []) == []
    assert "hil run: warning: " in capsys.readouterr().err
