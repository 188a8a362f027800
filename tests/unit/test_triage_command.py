"""`hil triage NODEID`: the test re-run alone with triage on, in a folder of its own, with the
previous run's stack and options; the triage tables printed, or why there are none."""

from __future__ import annotations

import json
from pathlib import Path

from harness import cli
from harness import triage_command as command
from harness.staging.interrupt import ChildOutcome
from harness.triage_command import carried_args, previous_run, report_outcome, triage_command
from tests.allure_results import allure_result
from tests.bad_input import earlier_run, write
from tests.unit.report.test_triage_report import BATCH_VERDICT, batching_result

NODE = "suites/t.py::b"  # allure_result's node id for the test "b"
RECORDED = ("/lab/vllm-hil/suites --alluredir=/r/.run-1/allure-results --junitxml=/r/.run-1/junit.xml"
            " --hil-reports-dir=/r/.run-1 --stack=default --shard-durations=/r/durations.json"
            " --model tiny-llama --target=vllm-cpu --inject-fault perturb-logit:position=5"
            " -m cpu and not slow -k single or pair --no-triage --triage-max 3 -x"
            " --allow-emulated-card --inventory /lab/inv.toml --engine-timeout 60"
            " --some-plugin-option its-value suites/test_x.py")


def test_the_previous_run_s_options_are_carried_without_its_selection_and_outputs():
    assert carried_args(RECORDED.split()) == [
        "--model", "tiny-llama", "--target=vllm-cpu", "--inject-fault", "perturb-logit:position=5",
        "--allow-emulated-card", "--inventory", "/lab/inv.toml", "--engine-timeout", "60",
        "--some-plugin-option", "its-value"]


def previous_results(reports: Path, stack: str = "spyre-1.10") -> Path:
    results = reports / "allure-results"
    results.mkdir(parents=True)
    t = allure_result("b", "failed", "VerdictFailed: [check token_equality] x")
    t["parameters"].append({"name": "stack", "value": f"'{stack}'"})
    (results / "u1-result.json").write_text(json.dumps(t))
    (results / "u1-a-attachment.html").write_text("<html></html>")
    (results / "environment.properties").write_text(
        "run.args=" + RECORDED.replace(":", "\\:") + "\n")
    return results


def test_the_test_s_stack_and_the_run_s_options_come_from_the_previous_results(tmp_path):
    prev = previous_run(previous_results(tmp_path), NODE)
    assert prev.stack == "spyre-1.10" and "--inject-fault" in prev.args and not prev.notes
    cmd = triage_command(NODE, tmp_path / "f", 900.0, prev.args, prev.stack, ["-v"])
    assert cmd[3:9] == [NODE, f"--alluredir={tmp_path / 'f' / 'allure-results'}",
                        f"--junitxml={tmp_path / 'f' / 'junit.xml'}",
                        f"--hil-reports-dir={tmp_path / 'f'}", "--stack=spyre-1.10", "--model"]
    assert cmd[-3:] == ["--triage-max=1", "--triage-budget=900", "-v"]
    # A stack given on the command line wins over the recorded one.
    assert "--stack=spyre-1.10" not in triage_command(NODE, tmp_path, 9.0, [], "spyre-1.10",
                                                      ["--stack", "default"])
    missing = previous_run(tmp_path / "nothing", NODE)
    assert missing.stack == "" and not missing.args and "no previous results" in missing.notes[0]
    other = previous_run(tmp_path / "allure-results", "suites/t.py::zz")
    assert other.stack == "" and "not in the previous results" in other.notes[0]


def test_a_triage_prints_its_table_in_a_folder_of_its_own(tmp_path, monkeypatch, capsys):
    earlier = earlier_run(tmp_path)
    ran: list[list[str]] = []

    def child(self, cmd, cwd):
        ran.append(cmd)
        folder = Path(next(a for a in cmd if a.startswith("--hil-reports-dir=")).split("=", 1)[1])
        (folder / "stats").mkdir(parents=True)
        write(folder / "stats", "main.json",
              json.dumps({"engines": [], "triage": [batching_result(NODE).to_dict()]}))
        return ChildOutcome(code=1)

    monkeypatch.setattr(command.ChildRunner, "run", child)
    assert cli.main(["triage", NODE, "--reports-dir", str(tmp_path), "--budget", "99",
                     "--model", "tiny-llama"]) == 0
    out = capsys.readouterr().out
    assert f"triage of token_equality: {BATCH_VERDICT}" in out
    assert "| batching | alone (r0) |" in out
    (cmd,) = ran
    folder = Path(cmd[4].split("=", 1)[1]).parent  # python -c QUIET_PYTEST NODEID --alluredir=
    assert folder.parent == tmp_path / "triage" and folder.name.endswith("-t.py-b")
    assert "--triage-budget=99" in cmd and cmd[-2:] == ["--model", "tiny-llama"]
    for path, data in earlier.items():  # the published run is left as it was
        assert path.read_bytes() == data


def junit(folder: Path, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write(folder, "junit.xml", f'<testsuites><testsuite><testcase classname="t" name="b">{body}'
          "</testcase></testsuite></testsuites>")


def test_without_a_triage_the_outcome_says_why(tmp_path, capsys):
    junit(tmp_path / "p", "")
    assert report_outcome(NODE, tmp_path / "p", 0) == 1
    assert capsys.readouterr().out.strip() == f"{NODE} passed: nothing to triage"
    junit(tmp_path / "s", '<skipped message="no Spyre device found"/>')
    assert report_outcome(NODE, tmp_path / "s", 0) == 1
    assert "was skipped: nothing to triage (no Spyre device found)" in capsys.readouterr().out
    junit(tmp_path / "f", '<failure message="EngineCrashed: engine died with exit code 9"/>')
    assert report_outcome(NODE, tmp_path / "f", 1) == 1
    assert ("failed and was not triaged: only a failed token-equality or KV-ledger verdict is;"
            " it failed with: EngineCrashed") in capsys.readouterr().out
    junit(tmp_path / "b", '<failure message="VerdictFailed: [check token_equality] x&#10;&#10;'
          'triage: not triaged: the triage budget of 5 s is spent (--triage-budget)"/>')
    assert report_outcome(NODE, tmp_path / "b", 1) == 1
    out = capsys.readouterr().out
    assert "failed and was not triaged: the triage budget of 5 s is spent" in out
    assert "not triaged: not triaged" not in out


def test_a_node_id_pytest_does_not_know_is_bad_input(tmp_path, capsys):
    assert report_outcome(NODE, tmp_path, 4) == 2
    assert "pytest refused it (pytest exit 4" in capsys.readouterr().err
    assert report_outcome(NODE, tmp_path, 5) == 2
    assert "no test was collected (pytest exit 5" in capsys.readouterr().err
    assert cli.main(["triage", "suites/test_token_equality.py", "--reports-dir",
                     str(tmp_path)]) == 2
    assert "is not a test's node id" in capsys.readouterr().err
    assert cli.main(["triage", "--model", "m", NODE, "--reports-dir", str(tmp_path)]) == 2
    assert f"give it first: hil triage {NODE}" in capsys.readouterr().err
    assert not (tmp_path / "triage").exists()


def test_a_test_that_is_not_in_the_suites_is_refused_by_the_real_pytest(tmp_path, capfd):
    assert cli.main(["triage", "suites/test_nope.py::test_x", "--reports-dir",
                     str(tmp_path)]) == 2
    assert "suites/test_nope.py::test_x: pytest refused it (pytest exit 4" in capfd.readouterr().err
