"""Processes a test started, seen from outside: which of them are still running."""

from __future__ import annotations

import psutil


def alive(pids: set[int]) -> list[str]:
    """The processes of ``pids`` still running (a zombie has ended), as pid and command."""
    left = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {' '.join(p.cmdline())[:200]}")
        except psutil.NoSuchProcess:
            continue
    return left
