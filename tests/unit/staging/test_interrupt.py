"""Every stop signal (SIGINT, SIGTERM, SIGHUP) and the parent's death reach the whole process
group of a child that ``ChildRunner`` started, and no process of it survives. The child is a
fake: a small script that records the signals it gets, starts a grandchild (as pytest starts
engines, each dying with its parent) and stops it on a signal, as pytest ends its session."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from harness.core.parent_death import parent_death_supported
from harness.core.paths import REPO_ROOT
from harness.staging.interrupt import quiet_hung_up_terminal, signal_name
from harness.staging.run_folder import HOLDER_FILE, describe_holder, reports_lock

linux_only = pytest.mark.skipif(not parent_death_supported(),
                                reason="PR_SET_PDEATHSIG exists on Linux only")

# argv: MARKS ROLE MODE. ROLE child starts a grandchild; MODE stubborn ignores SIGINT (a hung
# session), so only a SIGKILL of the group ends it.
FAKE_CHILD = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from pathlib import Path

    from harness.core.parent_death import die_with_parent

    marks, role, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    grandchild = None

    def record(signum, frame):
        with open(marks / f"{role}.signals", "a") as f:
            f.write(signal.Signals(signum).name + "\\n")
        if mode == "stubborn" and signum == signal.SIGINT:
            return
        if grandchild is not None:  # as pytest closes its engines
            grandchild.terminate()
            grandchild.wait()
        sys.exit(3)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, record)
    # Started as a child pytest (interrupt.pytest_command), SIGINT comes
    # blocked: unblocked under the handler, as QUIET_PYTEST does.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if role == "child":
        grandchild = subprocess.Popen([sys.executable, __file__, str(marks), "grandchild", mode],
                                      preexec_fn=die_with_parent(signal.SIGKILL))
        while not (marks / "grandchild.pid").exists():
            time.sleep(0.05)
    (marks / f"{role}.pid").write_text(str(os.getpid()))
    while True:
        time.sleep(0.1)
""")

# The hil side: a ChildRunner running the fake child; prints the outcome as JSON.
PARENT = textwrap.dedent("""
    import json, sys
    from pathlib import Path

    from harness.staging import interrupt

    marks, mode, grace, timeout = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
    interrupt.GRACE_SECONDS = grace
    with interrupt.ChildRunner() as runner:
        o = runner.run([sys.executable, str(marks / "fake_child.py"), str(marks), "child", mode],
                       marks, timeout=float(timeout) if timeout else None)
        later = runner.run([sys.executable, "-c", "print('a later child ran')"], marks)
    print(json.dumps({"code": o.code, "signal": o.signal, "killed": o.killed,
                      "timed_out": o.timed_out, "exit_code": o.exit_code,
                      "later": later.code}))
    sys.exit(o.exit_code)
""")


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO_ROOT))


def _start(marks: Path, mode: str = "obedient", grace: float = 30.0,
           timeout: str = "") -> subprocess.Popen[str]:
    marks.mkdir(exist_ok=True)
    (marks / "fake_child.py").write_text(FAKE_CHILD)
    (marks / "parent.py").write_text(PARENT)
    proc = subprocess.Popen([sys.executable, str(marks / "parent.py"), str(marks), mode,
                             str(grace), timeout], cwd=marks, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not all((marks / f"{r}.pid").exists() for r in ("child", "grandchild")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


def _pids(marks: Path) -> dict[str, int]:
    return {r: int((marks / f"{r}.pid").read_text()) for r in ("child", "grandchild")}


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _assert_all_gone(pids: dict[str, int], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while any(_running(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [r for r, p in pids.items() if _running(p)], "a process of the child survived"


def _signals(marks: Path, role: str) -> list[str]:
    path = marks / f"{role}.signals"
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_each_stop_signal_reaches_the_childs_group_and_nothing_survives(tmp_path, sig):
    marks = tmp_path / "marks"
    proc = _start(marks)
    pids = _pids(marks)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, out + err
    outcome = json.loads(out.splitlines()[-1])
    assert outcome["signal"] == sig and not outcome["killed"]
    assert outcome["later"] == 2  # no child starts once a signal stopped the run
    # The child got SIGINT, as a Ctrl-C at a terminal would give its group; the grandchild
    # got it too or, when its parent's SIGTERM (sent while closing) is handled first on a
    # busy machine, that one: either way a stop signal it handles, never a kill.
    assert _signals(marks, "child") == ["SIGINT"]
    assert _signals(marks, "grandchild") and set(_signals(marks, "grandchild")) <= {
        "SIGINT", "SIGTERM"}
    _assert_all_gone(pids)


def test_sighup_is_named_as_sigterm_is():
    assert signal_name(signal.SIGHUP) == "SIGHUP"
    assert signal_name(signal.SIGTERM) == "SIGTERM"


@linux_only
def test_the_parents_death_stops_the_child_as_sigterm_does(tmp_path):
    """``hil`` killed outright: the kernel sends the child SIGTERM (it ends as on SIGTERM,
    stopping its grandchild), and nothing of it survives."""
    marks = tmp_path / "marks"
    proc = _start(marks)
    pids = _pids(marks)
    proc.kill()
    proc.communicate(timeout=30)
    _assert_all_gone(pids)
    assert _signals(marks, "child") == ["SIGTERM"]


@linux_only
def test_a_grandchild_dies_with_a_child_killed_outright(tmp_path):
    marks = tmp_path / "marks"
    proc = _start(marks)
    pids = _pids(marks)
    os.kill(pids["child"], signal.SIGKILL)
    _assert_all_gone(pids)  # the grandchild got its SIGKILL from the kernel
    proc.communicate(timeout=30)


def test_a_second_signal_kills_a_child_that_does_not_end(tmp_path):
    marks = tmp_path / "marks"
    proc = _start(marks, mode="stubborn")
    pids = _pids(marks)
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "SIGINT" not in _signals(marks, "child"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 129, out + err  # the first signal names the stop
    assert json.loads(out.splitlines()[-1])["killed"]
    _assert_all_gone(pids)


def test_a_child_past_its_grace_is_killed_with_its_group(tmp_path):
    marks = tmp_path / "marks"
    proc = _start(marks, mode="stubborn", grace=1.0)
    pids = _pids(marks)
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 129, out + err
    assert json.loads(out.splitlines()[-1])["killed"]
    _assert_all_gone(pids)


def test_a_child_past_its_timeout_is_killed_with_its_group(tmp_path):
    marks = tmp_path / "marks"
    # Long enough for the child and its grandchild to start on a loaded machine (the test
    # waits for both before it looks): 1 s failed under a busy CI worker.
    proc = _start(marks, mode="stubborn", timeout="6")
    pids = _pids(marks)
    out, err = proc.communicate(timeout=60)
    outcome = json.loads(out.splitlines()[-1])
    assert outcome["timed_out"] and outcome["signal"] is None, out + err
    assert outcome["code"] == -signal.SIGKILL
    _assert_all_gone(pids)


STOPPED_IN_PROCESS = textwrap.dedent("""
    import sys, time
    from harness.staging.interrupt import StopSignals

    stop = StopSignals()
    try:
        with stop:
            print("ready", flush=True)
            time.sleep(60)
    except KeyboardInterrupt:
        sys.exit(stop.exit_code)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_command_with_its_engines_in_process_ends_on_each_signal_as_on_ctrl_c(sig):
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_IN_PROCESS], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig and "Traceback" not in err, err


HUNG_UP = textwrap.dedent("""
    import os, sys
    from harness.staging.interrupt import quiet_hung_up_terminal

    result = sys.argv[1]
    master, slave = os.openpty()
    os.dup2(slave, 1)
    os.dup2(slave, 2)
    os.close(master)  # the terminal goes away: its slave side is hung up
    quieted = quiet_hung_up_terminal()
    print("written after the hang-up", flush=True)
    with open(result, "w") as f:
        f.write(repr(quieted))
""")


def test_a_hung_up_terminal_is_quieted_so_the_end_can_be_written(tmp_path):
    result = tmp_path / "result"
    run = subprocess.run([sys.executable, "-c", HUNG_UP, str(result)], env=_env(),
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert result.read_text() == "[1, 2]"


def test_a_file_or_pipe_is_not_a_hung_up_terminal():
    assert quiet_hung_up_terminal() == []  # pytest's own stdout/stderr: pipes or files


# ---------------------------------------------------------------- the reports folder's lock

HOLDS_THE_LOCK = textwrap.dedent("""
    import sys, time
    from harness.staging.run_folder import reports_lock

    with reports_lock(sys.argv[1], "hil run -m cpu"):
        print("held", flush=True)
        time.sleep(120)
""")


def test_a_lock_whose_holder_was_killed_is_taken_over_saying_whose_it_was(tmp_path):
    reports = tmp_path / "reports"
    holder = subprocess.Popen([sys.executable, "-c", HOLDS_THE_LOCK, str(reports)], env=_env(),
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    left = json.loads((reports / HOLDER_FILE).read_text())
    assert left["pid"] == holder.pid  # the holder file names the dead pid ...
    assert describe_holder(left).endswith(", no longer running")  # ... recognisably stale
    said: list[str] = []
    with reports_lock(reports, "hil run", say=said.append):
        assert json.loads((reports / HOLDER_FILE).read_text())["pid"] == os.getpid()
    assert len(said) == 1 and said[0].startswith(
        f"took over the lock of {reports} from pid {holder.pid} on ")
    assert "(`hil run -m cpu`, started " in said[0]
    assert said[0].endswith("which is no longer running (it ended without releasing the lock:"
                            " killed?)")
    assert not (reports / HOLDER_FILE).exists()  # released


def test_a_released_lock_is_taken_without_a_word(tmp_path):
    said: list[str] = []
    with reports_lock(tmp_path, "hil run", say=said.append):
        pass
    with reports_lock(tmp_path, "hil run", say=said.append):
        pass
    assert said == []


def test_a_live_holder_is_not_called_stale():
    me = {"pid": os.getpid(), "host": os.uname().nodename, "command": "hil run"}
    assert "no longer running" not in describe_holder(me)
    elsewhere = {"pid": 999999999, "host": "another-host", "command": "hil run"}
    assert "no longer running" not in describe_holder(elsewhere)  # not ours to tell


# ---------------------------------------------------------------- hil selftest's children

SELFTEST = textwrap.dedent("""
    import argparse, sys
    from harness import selftest
    from harness.targets.selftest_case import Case

    marks, reports = sys.argv[1], sys.argv[2]
    cases = [Case("forget-free", "vllm-cpu", "suites/test_block_freeing.py", "x", "block leak"),
             Case("crash-engine", "vllm-cpu", "suites/test_token_equality.py", "x", "crash")]
    selftest.cases_for = lambda kinds, only=None: cases
    selftest.host_kinds = lambda inventory: []
    sys.executable = marks + "/python"  # each case's child pytest is the fake child
    sys.exit(selftest.selftest_command(argparse.Namespace(
        root=marks, reports_dir=reports, inventory="", fault=[], lease_dir="", results=""), []))
""")


def test_a_stopped_selftest_stops_its_child_and_marks_its_table(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    reports = tmp_path / "reports"
    (marks / "fake_child.py").write_text(FAKE_CHILD)
    wrapper = marks / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {marks / 'fake_child.py'} {marks}"
                       " child obedient\n")
    wrapper.chmod(0o755)
    earlier = reports / "selftest" / "selftest.md"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"# hil selftest\n\nthe earlier, complete table\n")
    proc = subprocess.Popen([sys.executable, "-c", SELFTEST, str(marks), str(reports)],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not all((marks / f"{r}.pid").exists() for r in ("child", "grandchild")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    pids = _pids(marks)
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 129, out + err
    assert "hil selftest: stopped by SIGHUP after 0 of 2 case(s)" in err and "Traceback" not in err
    _assert_all_gone(pids)
    assert _signals(marks, "child") == ["SIGINT"]
    # The earlier table stays; the stopped run's is kept apart, marked, and the line says so.
    assert earlier.read_bytes() == b"# hil selftest\n\nthe earlier, complete table\n"
    (kept,) = (reports / "selftest").glob("selftest-interrupted-*/selftest.md")
    table = kept.read_text()
    assert table.startswith("**INTERRUPTED**: stopped by SIGHUP after 0 of 2 case(s)")
    (line,) = [ln for ln in err.splitlines() if ln.startswith("hil selftest: stopped by")]
    assert f"kept the earlier selftest.md at {earlier}" in line and str(kept.parent) in line
    assert not (reports / "allure-results").exists()  # no verdict on faults not run


def test_a_selftest_case_keeps_its_childs_output_and_its_timeout(tmp_path, monkeypatch):
    from harness import selftest
    from harness.targets.selftest_case import Case

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho out\necho err >&2\n[ -n \"$SLEEP\" ] && sleep 30\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(selftest.sys, "executable", str(fake))
    case = Case("forget-free", "vllm-cpu", "suites/test_block_freeing.py", "x", "block leak")
    o = selftest.run_case(case, tmp_path / "work", tmp_path)
    assert (o.verdict, o.output) == ("not run", "out\nerr\n")
    assert o.message == "the selection ran no test (pytest exit 1)"
    monkeypatch.setenv("SLEEP", "1")
    o = selftest.run_case(case, tmp_path / "work", tmp_path, timeout=1.0)
    assert o.output == "out\nerr\n\nselftest: killed after 1 s" and o.seconds < 20
    assert o.message == "the selection ran no test (pytest exit -1)"


# ---------------------------------------------------------------- hil run, and a direct pytest


def test_sighup_to_hil_run_keeps_what_the_run_recorded_as_sigterm_does(tmp_path, monkeypatch):
    """`hil run` on a small suite (no engine): exit 129, the partial results kept apart and
    marked interrupted by SIGHUP, the previous results kept, no pytest of the run left."""
    from tests.bad_input import assert_nothing_lost
    from tests.unit.report.test_results_kept import SUITE, _hil_run, _wait_for_results, earlier

    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "conftest.py").write_text((REPO_ROOT / "conftest.py").read_text())
    (suites / "test_small.py").write_text(SUITE)
    reports = tmp_path / "reports"
    files = earlier(reports)
    proc = _hil_run(reports, suites, "-k", "passes or waits")
    _wait_for_results(reports, proc, 1)
    children = {c.pid: c for c in psutil.Process(proc.pid).children(recursive=True)}
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 129, out + err
    assert "Traceback" not in out + err
    assert_nothing_lost(files)
    kept = [p for p in reports.iterdir() if p.name.startswith("interrupted-")]
    assert len(kept) == 1 and not list(reports.glob(".run-*"))
    assert "hil run: stopped by SIGHUP after 2 test result(s); the partial results are kept in" \
           f" {kept[0]} (summary.md marked INTERRUPTED)" in err
    summary = (kept[0] / "summary.md").read_text()
    assert summary.startswith("**INTERRUPTED**: stopped by SIGHUP after 2 test result(s)")
    props = (kept[0] / "allure-results" / "environment.properties").read_text()
    assert "run.interrupted=stopped by SIGHUP" in props
    assert children and not [p for p in children if _running(p)]


def test_sighup_ends_a_direct_pytest_run_as_a_ctrl_c_does(tmp_path):
    from tests.suite_runner import CHECKOUT_PLUGINS
    from tests.unit.plugin.test_results_folder import KILLED_SUITE

    (tmp_path / "test_killed.py").write_text(KILLED_SUITE)
    results = tmp_path / "allure-results"
    junit = tmp_path / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
           *CHECKOUT_PLUGINS, f"--alluredir={results}", f"--junitxml={junit}",
           f"--hil-reports-dir={tmp_path / 'reports'}", str(tmp_path / "test_killed.py")]
    # A run started under nohup keeps SIGHUP ignored, on purpose (the plugin handles it only
    # where nothing else does); this child is a terminal's, whatever runs this test.
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(results.glob("*-result.json")):
        assert proc.poll() is None and time.monotonic() < deadline, "the run never got going"
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGHUP)
    # A bound on a hang, not a timing: beside a tensor-parallel engine on the other worker
    # (its ranks poll their queues between steps on both cores) 60 s ran out.
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 2, out
    assert "KeyboardInterrupt" in out and "INTERNALERROR" not in out
    assert "signal 1 (SIGHUP)" in out
    assert "1 passed" in out and junit.is_file()


# ---------------------------------------------------------------- a stop is never lost


def test_a_stop_while_a_fork_server_starts_is_not_turned_into_its_failure(tmp_path):
    """A stop signal while hil explore's session waits for its fork server used to come out
    as an OSError (the listener's socket unlinked after its folder was removed), which the
    session took for a broken fork server: it started the engine fresh and the search ran on,
    the Ctrl-C lost. The stop must leave the start as what it is."""
    import threading

    from harness.engine.forkserver import ForkServer
    from harness.staging.interrupt import Stopped, StopSignals

    never_ready = tmp_path / "python"  # a fork server that never connects
    never_ready.write_text("#!/bin/sh\nexec sleep 60\n")
    never_ready.chmod(0o755)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    with StopSignals(), pytest.raises(Stopped) as stop:
        timer.start()
        ForkServer.start(str(never_ready), dict(os.environ), str(tmp_path), tmp_path / "fs.log")
    timer.cancel()
    assert stop.value.signum == signal.SIGTERM
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(never_ready) in " ".join(p.info["cmdline"] or [])]
