"""``hil``'s stop signals from its first instant, before its command has handlers of its own.

``quiet_start`` is called at the top of ``harness.cli``, before its heavy imports, when that
module is the ``hil`` command (the ``hil`` script or ``python -m harness.cli``; never when a
test imports it). Until ``harness.cli.main`` installs the command's own handlers, SIGINT,
SIGTERM or SIGHUP ends ``hil`` at once with one line and exit 128 + the signal: nothing has
run and nothing was written yet, so nothing needs stopping, and a traceback of an import
(SIGINT) or a silent death (SIGTERM, SIGHUP) is avoided. Only this module's own imports
(signal, os, sys) come before it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SCRIPT = "hil"  # the console script's name (pyproject.toml [project.scripts])


def _stop_while_starting(signum: int, frame: FrameType | None) -> None:
    name = "SIGINT (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name
    line = f"hil: stopped by {name} while starting: nothing ran, nothing was changed\n"
    try:
        os.write(2, line.encode())
    except OSError:  # a hung-up terminal (SIGHUP): the exit code says it
        pass
    os._exit(128 + signum)


def is_hil_command(module_name: str) -> bool:
    """Whether the module named ``module_name`` runs as the ``hil`` command."""
    return module_name == "__main__" or os.path.basename(sys.argv[0] if sys.argv else "") == SCRIPT


def quiet_start(module_name: str) -> bool:
    """Where ``module_name`` runs as the ``hil`` command (in the main thread): a stop signal
    ends the process with one line until the command installs its own handlers. Returns
    whether the handlers were installed."""
    if not is_hil_command(module_name) or threading.current_thread() is not threading.main_thread():
        return False
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop_while_starting)
    return True
