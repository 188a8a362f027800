"""Runtime log lines on stderr, gated by DTLOG_LEVEL like the vendor runtime's."""

from __future__ import annotations

import os
import sys

_LEVELS = {"TRACE": 0, "DEBUG": 1, "INFO": 2, "WARNING": 3, "ERROR": 4}


def dtlog(level: str, message: str) -> None:
    """Print ``message`` when DTLOG_LEVEL (default WARNING) lets ``level`` through."""
    threshold = _LEVELS.get(os.environ.get("DTLOG_LEVEL", "WARNING").upper(), 3)
    if _LEVELS[level] >= threshold:
        print(f"[DT {level}] {message}", file=sys.stderr, flush=True)
