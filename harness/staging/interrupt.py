"""Running a pytest child so that Ctrl-C and SIGTERM end it cleanly.

The child runs in its own process group (a new session), so a Ctrl-C at the terminal reaches
only ``hil``. On SIGINT or SIGTERM, ``hil`` sends SIGINT to the child's group: pytest ends
its session as after a Ctrl-C (junit and results written, engines stopped), and gets
GRACE_SECONDS for it; then the group is killed. A second signal kills the group at once.
The caller learns which signal stopped the run, writes its summary marked interrupted and
exits 128 + the signal number, without a traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

GRACE_SECONDS = 60.0
POLL_SECONDS = 0.2
SIGNAL_NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}


@dataclass
class ChildOutcome:
    """How a child ended: its exit code, and the signal that stopped the run (or None)."""

    code: int
    signal: int | None = None
    killed: bool = False  # did not end within the grace period: SIGKILLed

    @property
    def exit_code(self) -> int:
        """``hil``'s exit code for an interrupted run: 128 + the signal (130, 143)."""
        return 128 + self.signal if self.signal else self.code


def signal_name(signum: int | None) -> str:
    return SIGNAL_NAMES.get(signal.Signals(signum), signal.Signals(signum).name) if signum else ""


class ChildRunner:
    """While open (``with ChildRunner() as runner``), SIGINT and SIGTERM of this process stop
    the child that ``runner.run`` started, and no later child starts; ``runner.signal`` is the
    first signal received (None when none). Handlers are installed in the main thread only."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.signal: int | None = None
        self.deadline: float | None = None
        self.killed = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> ChildRunner:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
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

    def run(self, cmd: list[str], cwd: Path) -> ChildOutcome:
        """Run ``cmd`` in its own process group until it ends (not at all once a signal
        stopped the run: exit code 2, pytest's for an interrupted session)."""
        if self.signal is not None:
            return ChildOutcome(code=2, signal=self.signal, killed=self.killed)
        self.proc = subprocess.Popen(cmd, cwd=cwd, start_new_session=True)
        try:
            while True:
                try:
                    code = self.proc.wait(timeout=POLL_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    if self.deadline is not None and time.monotonic() > self.deadline:
                        self._kill()
        finally:
            if self.proc.poll() is None:  # an exception here: never leave the group running
                self._kill()
                self.proc.wait()
        return ChildOutcome(code=code, signal=self.signal, killed=self.killed)
