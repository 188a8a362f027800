"""A child process that ends when the process that started it dies (Linux: PR_SET_PDEATHSIG).

``hil`` runs pytest as a child, pytest runs engines as children: when a parent is killed
outright (SIGKILL, an OOM kill) nothing of it runs to stop its children, so the kernel is asked
to signal them instead. The call exists on Linux only; elsewhere ``die_with_parent`` returns
None and a child outlives a parent killed outright (its parent's ordinary exits still stop it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from functools import cache

PR_SET_PDEATHSIG = 1  # linux/prctl.h


@cache
def _libc() -> ctypes.CDLL | None:
    """The C library, loaded in the parent: a child between fork and exec must not dlopen."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def parent_death_supported() -> bool:
    """Whether this platform can have a child signalled when its parent dies."""
    return _libc() is not None


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child receives ``sig`` when the thread
    that started it ends (so start it from a thread that outlives it: the main thread), and at
    once when that parent died before the call took effect; kept across exec. None where there
    is no such call (not Linux)."""
    libc = _libc()
    if libc is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os.kill(os.getpid(), sig)

    return preexec


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (one of another user's counts; a zombie still counts
    until its parent reaps it)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
