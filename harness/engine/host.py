"""EngineHost: one real vLLM engine in its own process, driven over a socket.

Why a process per engine configuration: vLLM picks its platform (CPU or a
plugin such as vllm-spyre) once per process from the environment, so the
vllm-cpu and spyre targets cannot share a process. A process also isolates a
crashed or hung engine from the pytest session, and lets the harness set the
engine's environment before vLLM is imported, without touching its own.

The engine process inherits the caller's environment (PYTHONPATH included, so
a lab's instrumentation wrapper stays in force) with the target's variables
laid on top. Its stdout and stderr go to a log file whose tail is attached to
every error.
"""

from __future__ import annotations

import logging
import os
import secrets
import select
import sys
import tempfile
import time
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from harness.core.config import EngineConfig
from harness.core.errors import (
    EngineCrashed,
    EngineRefused,
    EngineRequestError,
    EngineStartError,
    EngineTimeout,
)
from harness.core.paths import REPO_ROOT
from harness.engine import forkserver
from harness.engine.start_config import engine_config

log = logging.getLogger("harness.engine")

LOG_TAIL_LINES = 60
CALL_TIMEOUT = 900.0  # seconds one engine call may take (--engine-timeout's default)
# Seconds an engine may take to start where its kind asks no longer (VllmTarget.start_timeout;
# a card compiles every graph at start); the CPU targets start in seconds.
START_TIMEOUT = 600.0


def read_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' when absent)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def log_since(path: Path, offset: int) -> str:
    """The engine log from ``offset`` on (this start's part of a log shared by restarts)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def engine_log_path(log_dir: Path, cfg: EngineConfig) -> Path:
    """The log of this process's engines of ``cfg`` (each start appends to it)."""
    return log_dir / f"{cfg.key.replace(':', '-')}-{os.getpid()}.log"


def engine_process_env(env: dict[str, str]) -> dict[str, str]:
    """The environment an engine process starts with: this process's (the lab's
    instrumentation included), ``env`` on top, the checkout first on PYTHONPATH."""
    child_env = dict(os.environ)
    child_env.update(env)
    # Prepend, never replace: the lab's PYTHONPATH must survive.
    parts = [str(REPO_ROOT)] + [
        p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    child_env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return child_env


class EngineHost:
    """A live engine process for one EngineConfig.

    ``call(op, payload)`` sends one command and returns its result, raising an
    EngineError subclass on refusal, crash or timeout.
    """

    def __init__(
        self,
        cfg: EngineConfig,
        env: dict[str, str],
        llm_kwargs: dict[str, Any],
        log_dir: Path,
        start_timeout: float = START_TIMEOUT,
        python: str | None = None,
        work_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = engine_log_path(log_dir, cfg)
        self._sockdir = tempfile.TemporaryDirectory(prefix="hil-eng-")
        # The engine's working directory: its own scratch folder (the card runtime writes
        # relative files), never the installed package's folder.
        if work_dir is None:
            self.work_dir = Path(self._sockdir.name) / "work"
        else:
            self.work_dir = work_dir / self.log_path.stem
        self.work_dir.mkdir(parents=True, exist_ok=True)
        address = os.path.join(self._sockdir.name, "engine.sock")
        authkey = secrets.token_bytes(16)
        self._listener = Listener(address, family="AF_UNIX", authkey=authkey)

        child_env = engine_process_env(env)
        child_env["HIL_ENGINE_AUTHKEY"] = authkey.hex()

        # Where this start's part of the log begins (restarts of a configuration append).
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._logfile = open(self.log_path, "ab")
        started = time.monotonic()
        # Forked from a preloaded parent where one fits, else a fresh process.
        try:
            self.proc = forkserver.spawn_engine(python or sys.executable, address, child_env,
                                                str(self.work_dir), self.log_path, self._logfile)
        except BaseException:  # no process (an interpreter that cannot run): nothing left open
            self._release()
            raise
        self.conn: Connection | None = None
        try:
            self.conn = self._accept(start_timeout)
            self.conn.send(
                ("start", {"config": engine_config(cfg), "llm_kwargs": llm_kwargs})
            )
            self.info: dict[str, Any] = self._receive(start_timeout, starting=True)
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.monotonic() - started
        log.info(
            "engine started: %s in %.1f s (log %s)",
            cfg.label,
            self.start_seconds,
            self.log_path,
        )

    def _accept(self, timeout: float) -> Connection:
        # Listener.accept has no timeout; poll the child while waiting.

        sock = self._listener._listener._socket  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select([sock], [], [], 0.5)
            if ready:
                return self._listener.accept()
            if self.proc.poll() is not None:
                raise EngineStartError(
                    f"engine process for {self.cfg.label} exited with code {self.proc.returncode}"
                    " before connecting",
                    read_tail(self.log_path),
                )
            if time.monotonic() > deadline:
                raise EngineTimeout(
                    f"engine process for {self.cfg.label} did not connect within {timeout:.0f} s",
                    read_tail(self.log_path),
                )

    def _receive(self, timeout: float, starting: bool = False) -> Any:
        assert self.conn is not None
        deadline = time.monotonic() + timeout
        while not self.conn.poll(0.5):
            if self.proc.poll() is not None:
                cls = EngineStartError if starting else EngineCrashed
                raise cls(
                    f"engine {self.cfg.label} died with exit code {self.proc.returncode}"
                    f" {'while starting' if starting else 'during a call'}",
                    read_tail(self.log_path),
                )
            if time.monotonic() > deadline:
                self.kill()
                raise EngineTimeout(
                    f"engine {self.cfg.label} gave no answer within {timeout:.0f} s; killed it",
                    read_tail(self.log_path),
                )
        try:
            status, result = self.conn.recv()
        except (EOFError, ConnectionError) as e:
            self.proc.wait(timeout=30)
            cls = EngineStartError if starting else EngineCrashed
            raise cls(
                f"engine {self.cfg.label} died with exit code {self.proc.returncode}"
                f" {'while starting' if starting else 'during a call'}"
                f" (its connection closed: {e!r})",
                read_tail(self.log_path),
            ) from None
        if status == "ok":
            return result
        if starting:
            raise EngineRefused(
                f"engine {self.cfg.label} failed to start with model {self.cfg.model}:"
                f" {result['type']}: {result['message']} (check that the folder loads with"
                f" transformers and that {self.cfg.target} supports its architecture)",
                result.get("traceback", ""), error_type=str(result.get("type", "")),
            )
        raise EngineRequestError(
            f"engine {self.cfg.label} raised {result['type']}: {result['message']}",
            result.get("traceback", ""),
        )

    @property
    def alive(self) -> bool:
        return self.conn is not None and self.proc.poll() is None

    def call(self, op: str, payload: Any = None, timeout: float = CALL_TIMEOUT) -> Any:
        """Run one command in the engine process and return its result."""
        if not self.alive:
            raise EngineCrashed(
                f"engine {self.cfg.label} is not running (exit code {self.proc.returncode})",
                read_tail(self.log_path),
            )
        assert self.conn is not None
        try:
            self.conn.send((op, payload))
        except (BrokenPipeError, ConnectionError, OSError) as e:
            raise EngineCrashed(
                f"engine {self.cfg.label} connection broken ({e!r})",
                read_tail(self.log_path),
            ) from None
        return self._receive(timeout)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return read_tail(self.log_path, lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def close(self) -> None:
        """Stop the engine process (politely first) and release its resources."""
        if self.conn is not None and self.proc.poll() is None:
            try:
                self.conn.send(("shutdown", None))
                self.proc.wait(timeout=20)
            except Exception:
                pass
        self.kill()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self._release()

    def _release(self) -> None:
        """Close the listener and the log, remove the socket folder and an empty scratch one."""
        self._listener.close()
        self._logfile.close()
        self._sockdir.cleanup()
        try:  # an empty scratch folder goes; what the engine wrote stays beside its log
            self.work_dir.rmdir()
        except OSError:
            pass
