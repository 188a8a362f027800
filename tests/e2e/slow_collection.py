"""A pytest plugin for the signal tests (``-p tests.e2e.slow_collection``): collection writes
the marker file named by SLOW_COLLECTION_MARKER (its pid) and then waits, so that a signal
sent once the marker exists lands in collection on a machine of any speed."""

from __future__ import annotations

import os
import time
from pathlib import Path

MARKER_ENV = "SLOW_COLLECTION_MARKER"
WAIT_SECONDS = 120.0


def pytest_collection(session: object) -> None:
    marker = os.environ.get(MARKER_ENV)
    if marker:
        Path(marker).write_text(str(os.getpid()))
    time.sleep(WAIT_SECONDS)  # a stop ends it (KeyboardInterrupt)
