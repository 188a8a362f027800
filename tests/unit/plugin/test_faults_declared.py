"""Faults are declared, never ambient: every spec is checked before any engine starts (name,
keys, variant, stack), a HIL_FAULTS the run inherited is refused, and every installed fault is
named by the terminal header, summary.md, the Allure environment and a failed verdict's text.
The refusals as a run sees them are rows of test_bad_arguments.py."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.core.devices import InventoryDevice
from harness.core.verdict import Verdict
from harness.in_engine.faults import FAULTS, check_fault_spec, check_fault_specs
from harness.lab.inventory import Inventory
from harness.plugin import engine_setup
from harness.plugin.faults_declared import (
    _STARTED,
    device_faults,
    fail_uninstalled_faults,
    faults_header,
    installed_specs,
    note_run_start,
    remember_device_faults,
    run_faults,
    uninstalled_message,
)
from harness.report.run_config import format_properties
from harness.report.summary import with_faults_line
from harness.session.stats import stats_values
from harness.session.verdicts import SessionVerdicts
from tests.unit.plugin.test_bad_arguments import child_pytest

VARIANTS = ["vllm-cpu", "spyre-eager-cb"]
STACKS = ["default", "spyre-1.10"]


@pytest.mark.parametrize("spec", [
    "forget-free", "forget-free:after=2", "forget-free:variant=vllm-cpu",
    "perturb-logit:position=5,row=0,stack=spyre-1.10",
    "open-other-card:address=0000:3c:00.0,variant=spyre-eager-cb",
])
def test_a_spec_that_installs_as_written_is_accepted(spec):
    check_fault_spec(spec, VARIANTS, STACKS)


@pytest.mark.parametrize(("spec", "message"), [
    ("nope", "unknown fault 'nope'; known: abort-keeps-blocks"),
    ("forget-free:variant=vllm_cpu", "variant='vllm_cpu' is no target variant, so the fault would"
     " be installed nowhere; known: vllm-cpu, spyre-eager-cb"),
    ("forget-free:stack=spyre-9", "stack='spyre-9' is no stack, so the fault would be installed"
     " nowhere; known: default, spyre-1.10"),
    ("forget-free:bogus=1,after=1", "unknown key(s) bogus; forget-free takes: after, variant, stack"),
    ("forget-free-once:after=1", "unknown key(s) after; forget-free-once takes: variant, stack"),
    ("open-other-card:variant=vllm-cpu", "open-other-card needs address=VALUE"),
    ("forget-free:after", "argument 'after' is not key=value"),
])
def test_a_spec_that_would_not_install_as_written_is_refused_naming_the_known(spec, message):
    with pytest.raises(ValueError) as e:
        check_fault_spec(spec, VARIANTS, STACKS)
    assert message in str(e.value)


def test_every_harness_fault_is_accepted_bare_unless_it_needs_an_argument():
    needs = {"open-other-card": "address=0000:3c:00.0"}
    for name in FAULTS:
        check_fault_spec(f"{name}:{needs[name]}" if name in needs else name, VARIANTS, STACKS)


def test_an_inventory_fault_is_checked_for_its_keys_too():
    check_fault_specs("crash-engine:when=start; forget-free")
    check_fault_specs("mylab.faults.flaky_card:x=1", allow_external=True)  # by name only
    with pytest.raises(ValueError, match="unknown key.s. at; crash-engine takes: when"):
        check_fault_specs("forget-free;crash-engine:at=start")


def test_an_inherited_hil_faults_is_refused_naming_the_value_and_the_fix(monkeypatch):
    monkeypatch.setenv("HIL_FAULTS", "forget-free;perturb-logit:position=2")
    with pytest.raises(pytest.UsageError) as e:
        engine_setup.check_no_ambient_faults()
    assert str(e.value) == (
        "env HIL_FAULTS='forget-free;perturb-logit:position=2': a fault from the environment"
        " would be installed in every engine of this run and named in no report; pass it as"
        " --inject-fault 'forget-free' --inject-fault 'perturb-logit:position=2', or unset"
        " HIL_FAULTS")
    with pytest.raises(pytest.UsageError, match="'perturb-logit:position=2', or add"
                       " --allow-external-faults to declare it for this run, or unset"):
        engine_setup.adopt_ambient_faults(SimpleNamespace(), allowed=False)
    monkeypatch.setenv("HIL_FAULTS", " ")
    engine_setup.check_no_ambient_faults()  # blank: nothing would be installed
    monkeypatch.delenv("HIL_FAULTS")
    engine_setup.check_no_ambient_faults()


def _config(*specs: str) -> SimpleNamespace:
    return SimpleNamespace(getoption=lambda name, default=None: list(specs), stash=pytest.Stash())


def test_the_run_faults_are_the_options_then_each_devices_named_by_the_device():
    config = _config("perturb-logit:variant=vllm-cpu")
    assert faults_header(config) == "vllm-hil: faults injected: perturb-logit:variant=vllm-cpu"
    inventory = Inventory([
        InventoryDevice("card0", "spyre", env=(("HIL_FAULTS", "crash-engine:when=start;free-late"),)),
        InventoryDevice("card1", "spyre", env=(("AIU_WORLD_RANK_0", "0000:3b:00.0"),)),
    ])
    remember_device_faults(config, inventory)
    assert device_faults(config) == ["crash-engine:when=start (device card0)",
                                     "free-late (device card0)"]
    assert run_faults(config) == ["perturb-logit:variant=vllm-cpu",
                                  "crash-engine:when=start (device card0)",
                                  "free-late (device card0)"]
    assert faults_header(_config()) is None


def test_summary_md_names_the_faults_after_its_counts(tmp_path: Path):
    text = "# vllm-hil run\n\n**2 tests**: 1 passed, 1 failed\n\n| failure category | tests |\n"
    assert with_faults_line(text, tmp_path) == text  # no environment written
    props = tmp_path / "environment.properties"
    props.write_text(format_properties({"run.faults": "none"}))
    assert with_faults_line(text, tmp_path) == text
    props.write_text(format_properties({"run.faults": "forget-free, free-late (device card0)"}))
    assert with_faults_line(text, tmp_path) == (
        "# vllm-hil run\n\n**2 tests**: 1 passed, 1 failed\n\n"
        "faults injected: forget-free, free-late (device card0)\n\n| failure category | tests |\n")


def test_a_failed_verdict_names_the_faults_of_the_run():
    failed = Verdict.failed("kv_ledger.conservation", "1 of 65 blocks are neither free, owned nor pad")
    desk = SimpleNamespace(opts=SimpleNamespace(faults=("forget-free",),
                                                device_faults=("free-late (device card0)",)))
    named = SessionVerdicts.with_faults(desk, failed)  # type: ignore[arg-type]
    assert named.details.splitlines()[0] == failed.details  # its first line files it, unchanged
    assert named.details.endswith(
        "\n\nfaults injected in this run: forget-free, free-late (device card0)")
    none = SimpleNamespace(opts=SimpleNamespace(faults=(), device_faults=()))
    assert SessionVerdicts.with_faults(none, failed) is failed  # type: ignore[arg-type]


def test_the_terminal_header_names_the_injected_fault(tmp_path: Path):
    run = child_pytest(tmp_path, tmp_path / "reports", [
        "--collect-only", "--model", "tiny-llama", "--target", "vllm-cpu",
        "--inject-fault", "perturb-logit:position=5", "-v"])  # -v undoes -q: the header shows
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "vllm-hil: faults injected: perturb-logit:position=5" in run.stdout, run.stdout[-3000:]


def _finished(tmp_path: Path, logs: dict[str, str], *specs: str, old: bool = False
              ) -> tuple[SimpleNamespace, Path]:
    """A session at its end that asked for ``specs``, whose engines wrote ``logs``
    (``old``: before the run started)."""
    config = _config(*specs)
    log_dir = tmp_path / "reports" / "engine-logs"
    log_dir.mkdir(parents=True)
    for name, text in logs.items():
        (log_dir / name).write_text(text)
        if old:
            os.utime(log_dir / name, (1, 1))
    note_run_start(config)
    config.stash[_STARTED] -= 5  # the logs were written after the run started
    return SimpleNamespace(config=config, exitstatus=pytest.ExitCode.OK), tmp_path / "reports"


def test_a_fault_no_engine_installed_fails_the_run_with_a_warning_for_summary_md(tmp_path):
    logs = {"vllm-cpu-1.log": "[hil] fault not installed (for spyre-eager-cb): forget-free:"
            "variant=spyre-eager-cb\n[hil] fault installed: perturb-logit\nINFO vllm\n"}
    session, reports = _finished(tmp_path, logs, "perturb-logit", "forget-free:variant=spyre-eager-cb")
    fail_uninstalled_faults(session, reports)  # type: ignore[arg-type]
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED
    warnings = stats_values(reports / "stats", "warnings")
    assert warnings == [[uninstalled_message(["forget-free:variant=spyre-eager-cb"])]]
    assert warnings[0][0].startswith("fault(s) asked for and installed in no engine of this run:"
                                      " forget-free:variant=spyre-eager-cb; ")


@pytest.mark.parametrize(("logs", "old"), [
    ({"vllm-cpu-1.log": "[hil] fault installed: perturb-logit\n"}, False),  # installed
    ({}, False),  # no engine ran (a plan, every test skipped): nothing to judge
    ({"vllm-cpu-1.log": "[hil] fault not installed (for x): perturb-logit\n"}, True),  # earlier run
])
def test_a_run_whose_faults_were_installed_or_that_ran_no_engine_keeps_its_exit(tmp_path, logs, old):
    session, reports = _finished(tmp_path, logs, "perturb-logit", old=old)
    fail_uninstalled_faults(session, reports)  # type: ignore[arg-type]
    assert session.exitstatus == pytest.ExitCode.OK
    assert not (reports / "stats").exists()


def test_installed_specs_reads_each_engines_installed_lines(tmp_path):
    (tmp_path / "a.log").write_text("[hil] fault installed: x:variant=vllm-cpu\n")
    (tmp_path / "b.log").write_text("noise [hil] fault installed: y \n")
    assert installed_specs(tmp_path, 0) == {"x:variant=vllm-cpu", "y"}
    assert installed_specs(tmp_path / "none", 0) is None


def test_allowed_an_inherited_hil_faults_is_declared_as_the_runs_faults(monkeypatch):
    """With --allow-external-faults the inherited specs join --inject-fault (checked and named
    as those are) and leave the environment, so no engine installs them a second time."""
    monkeypatch.setenv("HIL_FAULTS", "forget-free; perturb-logit:position=2")
    config = SimpleNamespace(option=SimpleNamespace(inject_fault=["crash-engine:when=start"]))
    engine_setup.adopt_ambient_faults(config, allowed=True)
    assert config.option.inject_fault == ["crash-engine:when=start", "forget-free",
                                          "perturb-logit:position=2"]
    assert "HIL_FAULTS" not in os.environ
