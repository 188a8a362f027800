"""Running a pytest child so that Ctrl-C, SIGTERM, SIGHUP and the parent's death end it cleanly.

The child runs in its own process group (a new session), so a Ctrl-C at the terminal reaches
only ``hil``. On SIGINT, SIGTERM or SIGHUP (a closed terminal, a dropped ssh session),
``hil`` sends SIGINT to the child's group: pytest ends its session as after a Ctrl-C (junit
and results written, engines stopped), and gets GRACE_SECONDS for it; then the group is
killed. A second signal kills the group at once. The caller learns which signal stopped the
run, writes its summary marked interrupted and exits 128 + the signal number (130, 143, 129),
without a traceback.

A child pytest runs by QUIET_PYTEST (``pytest_command``): it starts with SIGINT blocked, so
a signal forwarded while the interpreter starts or pytest imports its plugins stays pending
instead of raising a KeyboardInterrupt in the middle of an import (a traceback of 150 lines
and more); it unblocks it under its own handler and ends quietly (exit 2, pytest's
"interrupted") when it comes before pytest's session began.

When ``hil`` itself dies without handling anything (SIGKILL, an OOM kill), the child is told
by the kernel: on Linux it is started with PR_SET_PDEATHSIG = SIGTERM, which the harness's
pytest plugin turns into the same session end as a Ctrl-C (its engines stop with it). Off
Linux there is no such call: a child whose ``hil`` was killed outright runs on to its end.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Self

from harness.core.parent_death import die_with_parent

GRACE_SECONDS = 60.0
POLL_SECONDS = 0.2
# The signals that stop a run, each the same way.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SIGNAL_NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM",
                signal.SIGHUP: "SIGHUP"}


@dataclass
class ChildOutcome:
    """How a child ended: its exit code, and the signal that stopped the run (or None)."""

    code: int
    signal: int | None = None
    killed: bool = False  # did not end within the grace period: SIGKILLed
    timed_out: bool = False  # ran past the caller's timeout: its group SIGKILLed

    @property
    def exit_code(self) -> int:
        """``hil``'s exit code for an interrupted run: 128 + the signal (130, 143, 129)."""
        return 128 + self.signal if self.signal else self.code


def signal_name(signum: int | None) -> str:
    return SIGNAL_NAMES.get(signal.Signals(signum), signal.Signals(signum).name) if signum else ""


class Stopped(KeyboardInterrupt):
    """A stop signal ending a command, raised in its main thread: ``signum``, and ``kept``,
    one line saying what became of the command's report (``StagedReport``; "" before one)."""

    def __init__(self, signum: int = signal.SIGINT, kept: str = "") -> None:
        super().__init__(signal_name(signum))
        self.signum = signum
        self.kept = kept


def signal_of(exc: BaseException | None) -> int:
    """The signal a KeyboardInterrupt stands for: its own, else SIGINT (Python's Ctrl-C)."""
    return getattr(exc, "signum", signal.SIGINT)


def stopped_line(command: str, exc: BaseException) -> str:
    """The one line of ``command`` ended by a stop signal: the signal, and what became of
    its report (``Stopped.kept``; a command with none published nothing)."""
    kept = getattr(exc, "kept", "") or "nothing of this run was published"
    return f"{command}: stopped by {signal_name(signal_of(exc))}; {kept}"


def say_stopped(command: str, exc: BaseException) -> int:
    """Print ``command``'s one line for a stop (``stopped_line``) on stderr; returns its exit
    code, 128 + the signal."""
    print(stopped_line(command, exc), file=sys.stderr, flush=True)
    return 128 + signal_of(exc)


# A child pytest: ``python -m pytest ARGS`` run by the lines of QUIET_PYTEST (``python -c``:
# nothing of the harness is imported before pytest, which rewrites its modules' asserts).
# ChildRunner starts it with SIGINT blocked: a SIGINT forwarded while the interpreter starts
# stays pending. Python's handler is installed and SIGINT unblocked before pytest is
# imported: a pending one is raised at once, inside the ``try``. A KeyboardInterrupt that
# leaves pytest came before its session began (in a session pytest ends the run itself,
# writing its results): it ends the child quietly with pytest's exit code for an interrupted
# run (2), and ``hil`` prints the one line of what it kept.
QUIET_HEAD = "\n".join([
    "import signal, sys",
    "signal.signal(signal.SIGINT, signal.default_int_handler)",
    "try:",
    "    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})",
    "    import runpy",
])


def _quiet(run: str) -> str:
    return "\n".join([QUIET_HEAD, f"    {run}", "except KeyboardInterrupt:", "    sys.exit(2)"])


QUIET_PYTEST = _quiet("runpy.run_module('pytest', run_name='__main__', alter_sys=True)")


def is_quiet_child(cmd: list[str]) -> bool:
    """Whether ``cmd`` runs as a quiet child (``pytest_command``, ``script_command``)."""
    return cmd[1:2] == ["-c"] and len(cmd) > 2 and cmd[2].startswith(QUIET_HEAD)


def script_command(script: Path, *args: str) -> list[str]:
    """``python SCRIPT ARGS`` as a quiet child: stopped before its main runs, it ends with
    exit 2 and no output."""
    return [sys.executable, "-c", _quiet(f"runpy.run_path({str(script)!r}, run_name='__main__')"),
            *args]


def pytest_command(*args: str) -> list[str]:
    """The command line of a child pytest: ``python -m pytest ARGS`` as QUIET_PYTEST runs it
    (the same arguments, folder and exit codes)."""
    return [sys.executable, "-c", QUIET_PYTEST, *args]


def quiet_hung_up_terminal() -> list[int]:
    """Point stdout and stderr at /dev/null where their terminal hung up (every write to it
    now fails with EIO), so that a run stopped by SIGHUP still writes its summary and exits
    with its code instead of a traceback. A terminal still there keeps its output. Returns
    the file descriptors redirected."""
    try:
        import termios
    except ImportError:
        return []
    quieted = []
    for fd in (1, 2):
        try:
            termios.tcgetattr(fd)
        except termios.error as e:
            if e.args and e.args[0] == errno.EIO:  # ENOTTY: a file or pipe, written as before
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, fd)
                os.close(null)
                quieted.append(fd)
        except (OSError, ValueError):
            continue
    return quieted


class _StopHandlers:
    """While open, this process's stop signals (SIGINT, SIGTERM, SIGHUP) go to ``_handle``;
    the previous handlers come back at exit. Installed in the main thread only."""

    _previous: dict[int, object]

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        raise NotImplementedError


class ChildRunner(_StopHandlers):
    """While open (``with ChildRunner() as runner``), SIGINT, SIGTERM and SIGHUP of this
    process stop the child that ``runner.run`` started, and no later child starts;
    ``runner.signal`` is the first signal received (None when none). Handlers are installed
    in the main thread only."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.signal: int | None = None
        self.deadline: float | None = None
        self.killed = False
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            quiet_hung_up_terminal()
        if self.signal is None:
            self.signal = signum
            self.deadline = time.monotonic() + GRACE_SECONDS
            self._send(signal.SIGINT)
        else:
            self._kill()

    def _send(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _kill(self) -> None:
        self.killed = True
        self._send(signal.SIGKILL)

    def run(self, cmd: list[str], cwd: Path, stdout: IO[bytes] | None = None,
            stderr: IO[bytes] | None = None, timeout: float | None = None,
            env: dict[str, str] | None = None) -> ChildOutcome:
        """Run ``cmd`` in its own process group until it ends (not at all once a signal
        stopped the run: exit code 2, pytest's for an interrupted session). The child gets
        SIGTERM when this thread ends (``die_with_parent``). ``stdout``/``stderr``: files for
        its output (default this process's); ``env`` its environment (default this one's);
        past ``timeout`` seconds its group is killed (``timed_out``)."""
        if self.signal is not None:
            return ChildOutcome(code=2, signal=self.signal, killed=self.killed)
        self.proc = subprocess.Popen(cmd, cwd=cwd, start_new_session=True, stdout=stdout,
                                     stderr=stderr, env=env,
                                     preexec_fn=_child_setup(is_quiet_child(cmd)))
        if self.signal is not None:  # it came while the child started: not yet forwarded
            self._send(signal.SIGINT)
        ends = None if timeout is None else time.monotonic() + timeout
        timed_out = False
        try:
            while True:
                try:
                    code = self.proc.wait(timeout=POLL_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    now = time.monotonic()
                    if self.deadline is not None and now > self.deadline:
                        self._kill()
                    elif ends is not None and now > ends and not timed_out:
                        timed_out = True
                        self._send(signal.SIGKILL)
        finally:
            if self.proc.poll() is None:  # an exception here: never leave the group running
                self._kill()
                self.proc.wait()
        return ChildOutcome(code=code, signal=self.signal, killed=self.killed,
                            timed_out=timed_out)


def _child_setup(quiet: bool) -> Callable[[], None] | None:
    """The child's set-up between fork and exec: die with this thread (``die_with_parent``),
    and for a quiet child SIGINT blocked (pending, not lost) until it unblocks it."""
    dies = die_with_parent()
    if not quiet:
        return dies

    def setup() -> None:
        if dies is not None:
            dies()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    return setup


class StopSignals(_StopHandlers):
    """For a command that runs its engines in its own process (``hil explore``): while open,
    SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread as SIGINT does, so every
    stop signal ends the command the same way (its ``finally`` blocks close the engines);
    ``signal`` is the first one received. Handlers are installed in the main thread only."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def exit_code(self) -> int:
        """128 + the signal received (130, 143, 129); 130 when none was (a KeyboardInterrupt
        raised otherwise is a Ctrl-C)."""
        return 128 + (self.signal or signal.SIGINT)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            quiet_hung_up_terminal()
        if self.signal is None:
            self.signal = signum
        raise Stopped(signum)
