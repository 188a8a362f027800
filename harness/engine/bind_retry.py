"""An engine whose start found an address in use is started again, with other ports.

The ports an engine binds are picked in its process as it starts (``harness.core.ports``), but
another process on the host (another run's engines, their connections) may still take one
between the pick and the bind. That start's failure (torch.distributed's ``DistNetworkError ...
EADDRINUSE``, or a rank's, in the log) says nothing about the stack: the engine is started
again, at most ``BIND_ATTEMPTS`` times, each start told the ports the earlier ones found taken,
and each restart logged. Any other failure is the start's own, raised at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from harness.core.errors import EngineError
from harness.core.ports import AVOID_ENV, address_in_use, ports_picked
from harness.engine.host import log_since

log = logging.getLogger("harness.engine")

BIND_ATTEMPTS = 3  # starts of one engine, the first included, while an address is in use
RESTART_LINE = "[hil] engine restarted:"  # the engine log's note of each restart

T = TypeVar("T")


def _note(path: Path, line: str) -> None:
    """Append ``line`` to the engine log, where the restart's reader looks (never fails)."""
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError:
        pass


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def start_with_free_ports(start: Callable[[dict[str, str]], T], log_path: Path, label: str,
                          attempts: int = BIND_ATTEMPTS) -> T:
    """``start(env)`` (an engine start appending to ``log_path``; ``env`` the variables to add
    to the engine's) until it returns, or fails for a reason other than an address in use (in
    its error or its part of the log), or ``attempts`` starts found one in use: that start's
    error is raised."""
    avoid: list[int] = []
    for attempt in range(1, attempts + 1):
        offset = _size(log_path)
        try:
            return start({AVOID_ENV: ",".join(map(str, avoid))} if avoid else {})
        except EngineError as e:
            text = f"{e}\n{log_since(log_path, offset)}"
            if not address_in_use(text):
                raise
            taken = ports_picked(log_since(log_path, offset))
            avoid.extend(p for p in taken if p not in avoid)
            if attempt == attempts:
                log.error("engine %s: an address it binds was in use at each of %d starts"
                          " (ports picked: %s); giving up", label, attempts,
                          ", ".join(map(str, avoid)) or "none logged")
                raise
            line = (f"start refused, an address it binds was in use (ports picked:"
                    f" {', '.join(map(str, taken)) or 'none logged'}); starting it again with"
                    f" other ports (start {attempt + 1} of {attempts})")
            log.warning("engine %s: %s", label, line)
            _note(log_path, f"{RESTART_LINE} {line}")
    raise AssertionError("unreachable")  # the loop returns or raises
