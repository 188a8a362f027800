"""A fault for the side-by-side proof (installed with ``--allow-external-faults``): the port the
engine is about to bind is taken just before vLLM is built, as another run on the host can take
it. Once per pytest process (the pool's fault state folder), so that a restarted engine, with
another port, starts.

The port taken is the one ``MASTER_PORT`` holds as ``vllm.LLM`` is constructed: the one the
engine process picked (``harness.core.ports``), or, where the harness picks it ahead, the one
the harness picked when it configured the engine.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from harness.in_engine.faults import FAULT_STATE_ENV

_held: list[socket.socket] = []  # open for the engine process's life


def _first_in_run() -> bool:
    try:
        os.close(os.open(Path(os.environ[FAULT_STATE_ENV]) / "port-taken",
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def take(port: int) -> socket.socket:
    """A socket listening on ``port`` on every address, as another process's server would."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("", port))
    s.listen()
    return s


def occupy_master_port(config: dict[str, Any]) -> None:
    """Take ``MASTER_PORT`` as the first engine of this pytest process builds vLLM."""
    from vllm.entrypoints.llm import LLM

    original = LLM.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if _first_in_run():
            port = int(os.environ["MASTER_PORT"])
            _held.append(take(port))
            print(f"[hil] test fault: port {port} taken before vLLM binds it", flush=True)
        original(self, *args, **kwargs)

    LLM.__init__ = init  # type: ignore[method-assign]
