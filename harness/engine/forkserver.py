"""Engine processes forked from a preloaded parent: the imports are paid once per stack.

A fresh engine process spends most of its start importing torch, transformers and
vLLM. A fork server is a parent process (one per interpreter and start-up
environment) that imports those once and forks one engine process per engine
configuration. The forked child then behaves as a fresh ``python -m
harness.in_engine.process`` would:

- vLLM's platform and plugins are not resolved in the parent:
  ``vllm.platforms.current_platform`` is guarded while preloading, so any module
  whose import would resolve it is left for the child (which resolves it from its
  own ``VLLM_PLUGINS``) or for a platform parent (on vLLM 0.28, ``import vllm``
  itself); a parent whose platform got resolved anyway is not used.
- The child's environment is exactly the one a fresh process gets (the caller's,
  PYTHONPATH included, with the target's variables on top). Variables read at import
  time are fixed in the parent, so every variable but the late ones (``VLLM_*``,
  ``HIL_*``, ...; read when the engine is built) is part of the parent's key: a
  target that sets another one (``TORCH_COMPILE_DISABLE``) gets a parent of its own.
  The parent records which variables its imports read; a child whose late variables
  differ in one of them is started fresh instead.
- Faults are installed in the child (``harness.in_engine.process`` as before), after
  the fork, so they patch the child's copy of vLLM only.
- The parent imports nothing from the kind registry by itself: every kind's plugin preload
  map, and the modules engines import from the kinds by name, come in its environment
  (``harness.engine.start_config.fork_parent_env``), as an engine's come in its configuration.
- Isolation: the child is its own process with its own log on stdout and stderr;
  killing it leaves the parent alone; it dies with the parent (PR_SET_PDEATHSIG),
  and a parent that died is seen as the child's death.

``HIL_ENGINE_START=fresh`` starts every engine as a fresh process (for comparison,
or where fork is unwanted); any failure of the fork server falls back to that.

A run of many pytest processes (a test session starting child pytest runs, ``hil selftest``)
pays those imports once for all of them when ``HIL_FORKSERVER_SHARE`` names a folder of its own
(``share_folder``): there each interpreter and environment gets one shared platform parent
(``harness.in_engine.fork_parent.shared_main``), started by the first process that needs it and
found by the others through its record in the folder. Each process that connects gets a
parent of its own forked from it, whose children its engines are: they die with that parent,
which ends when the process's connection closes, as a per-process parent does. The shared
parents stop when the folder's owner ends or the folder goes; any failure falls back to the
per-process parent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import IO, Any

from harness.core.parent_death import die_with_parent, pid_alive
from harness.engine.start_config import fork_parent_env
from harness.targets import late_env_prefixes, per_engine_env_prefixes

log = logging.getLogger("harness.engine")

START_ENV = "HIL_ENGINE_START"  # "platform" (default), "preload" or "fresh"
MODES = ("platform", "preload", "fresh")
READY_TIMEOUT = 300.0

# Read when the engine is built (after the fork), not when modules are imported; the
# parent's record of what its imports read backs this up. Each kind adds its stack's own
# (``TargetKind.late_env_prefixes``: a plugin's and its runtime's variables).
# PYTEST_CURRENT_TEST changes with every test: it must not make a parent per test.
LATE_PREFIXES = ("VLLM_", "HIL_", "MASTER_", "PYTEST_", *late_env_prefixes())
MAX_PARENTS = 3  # live platform-free parents per process; the least recently used is stopped
# Read by native libraries when loaded (OpenMP, allocators, loader): always in the key.
NATIVE_PREFIXES = ("OMP_", "KMP_", "MKL_", "GOMP_", "LD_", "MALLOC_", "PYTHON")

def late(name: str) -> bool:
    return name.startswith(LATE_PREFIXES)


# Per engine, never read while preloading: not part of a platform parent's key, nor of its
# environment (given at the fork). Each kind adds the variables that place an engine on its
# device (``TargetKind.per_engine_env_prefixes``).
PER_ENGINE_PREFIXES = ("HIL_", "MASTER_", "PYTEST_", *per_engine_env_prefixes())
# A shell's record of its own state (the folder it is in): no import reads it, so it keys no
# shared parent and makes no conflict unless a parent's imports did read it.
SHELL_STATE = ("PWD", "OLDPWD", "SHLVL", "_")

def start_mode() -> str:
    """``platform``: fork engines from a parent that resolved their platform (itself forked
    from the platform-free parent); ``preload``: from the platform-free parent;
    ``fresh``: no fork server."""
    mode = os.environ.get(START_ENV, "platform").strip() or "platform"
    if mode not in MODES:
        raise ValueError(f"{START_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def platform_key(child_env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables that decide a platform parent: every late one but the per-engine ones."""
    return tuple(sorted((k, v) for k, v in child_env.items()
                        if late(k) and not k.startswith(PER_ENGINE_PREFIXES)))


def parent_env(child_env: dict[str, str], caller: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the parent that may fork ``child_env``'s engine: the child's,
    except that late variables are the caller's (the target's own come at the fork)."""
    caller = dict(os.environ) if caller is None else caller
    env = {k: v for k, v in child_env.items() if not late(k) and not k.startswith(PER_ENGINE_PREFIXES)}
    env.update({k: v for k, v in caller.items() if late(k) and not k.startswith(PER_ENGINE_PREFIXES)})
    return env


# ---------------------------------------------------------------------------
# The host side
# ---------------------------------------------------------------------------


class ForkServerError(RuntimeError):
    """The fork server could not start or fork; the engine is started fresh instead."""


@dataclass
class ForkServer:
    """One preloaded parent process and the control connection to it."""

    python: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    conn: Connection
    report: dict[str, Any]
    log_path: Path
    exits: dict[int, int] = field(default_factory=dict)
    _sockdir: Any = None
    platforms: dict[Any, ForkServer] = field(default_factory=dict)
    broken: dict[Any, str] = field(default_factory=dict)

    def platform_server(self, child_env: dict[str, str], cwd: str) -> ForkServer:
        """The parent forked from this one for the platform ``child_env`` resolves."""
        key = platform_key(child_env)
        if key in self.broken:
            raise ForkServerError(self.broken[key])
        srv = self.platforms.get(key)
        if srv is not None and srv.alive:
            return srv
        env = {k: v for k, v in child_env.items() if not k.startswith(PER_ENGINE_PREFIXES)}
        env = {**env, **{k: v for k, v in self.env.items() if k.startswith(PER_ENGINE_PREFIXES)}}
        log_path = self.log_path.with_name(f"{self.log_path.stem}-p{len(self.platforms)}.log")
        try:
            srv = ForkServer.start(self.python, env, cwd, log_path, parent=self)
        except (ForkServerError, OSError) as e:
            self.broken[key] = str(e)
            raise ForkServerError(str(e)) from None
        self.platforms[key] = srv
        return srv

    @classmethod
    def start(cls, python: str, env: dict[str, str], cwd: str, log_path: Path,
              parent: ForkServer | None = None) -> ForkServer:
        """A fresh parent process, or (``parent``) one forked from ``parent`` that resolves
        its platform from ``env``."""
        sockdir = tempfile.TemporaryDirectory(prefix="hil-fork-")
        address = os.path.join(sockdir.name, "fork.sock")
        authkey = secrets.token_bytes(16)
        listener = Listener(address, family="AF_UNIX", authkey=authkey)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        proc: Any
        if parent is None:
            logf: IO[bytes] = open(log_path, "ab")
            proc = subprocess.Popen(
                [python, "-m", "harness.in_engine.fork_parent", address],
                env={**env, **fork_parent_env(), "HIL_FORKSERVER_AUTHKEY": authkey.hex()},
                cwd=cwd, preexec_fn=die_with_parent(signal.SIGKILL),  # as its forked engines
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT)
            logf.close()
        else:
            try:
                proc = parent.fork({"role": "platform", "env": env, "cwd": cwd, "log": str(Path(log_path).absolute()),
                                    "address": address, "authkey": authkey.hex()})
            except BaseException:
                listener.close()
                sockdir.cleanup()
                raise
        try:
            conn = _accept(listener, proc, READY_TIMEOUT)
            deadline = time.monotonic() + READY_TIMEOUT
            while not conn.poll(0.5):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ForkServerError(f"fork server exited ({proc.poll()}) before it was ready")
            status, report = conn.recv()
        except BaseException:
            listener.close()  # before its folder goes: its unlink error would replace a stop
            proc.kill()
            proc.wait()
            sockdir.cleanup()
            raise
        finally:
            listener.close()
        if status != "ready":
            proc.kill()
            proc.wait()
            sockdir.cleanup()
            raise ForkServerError(f"fork server unfit: {unfit_reason(report)}")
        log.info("fork server %s ready in %.1f s (skipped: %s; warmed: %s)", proc.pid,
                 report.get("seconds", 0), skipped_summary(report),
                 ", ".join(report.get("warmed") or ()) or "nothing")
        return cls(python, env, proc, conn, report, log_path, _sockdir=sockdir)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def conflicts(self, child_env: dict[str, str]) -> list[str]:
        """Variables the parent's imports read whose value the child wants different (a
        shell's record of its own state, PWD and the like, counts only where read)."""
        read = set(self.report.get("read", ()))
        names = {k for k in set(child_env) | set(self.env) if child_env.get(k) != self.env.get(k)}
        return sorted(n for n in names if n in read or not (
            late(n) or n.startswith(PER_ENGINE_PREFIXES) or n in SHELL_STATE))

    def pump(self, timeout: float = 0.0) -> Any:
        """Read one message (exit notices are filed); None when nothing came."""
        if not self.conn.poll(timeout):
            return None
        msg = self.conn.recv()
        if msg[0] == "exit":
            self.exits[msg[1]["pid"]] = msg[1]["code"]
            return None
        return msg

    def fork(self, spec: dict[str, Any], timeout: float = 30.0) -> ForkedProcess:
        self.conn.send(("fork", spec))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.pump(0.2)
            if msg is None:
                if not self.alive:
                    raise ForkServerError(f"fork server died ({self.proc.returncode})")
                continue
            if msg[0] == "forked":
                return ForkedProcess(self, int(msg[1]))
            raise ForkServerError(f"fork server refused: {msg[1]}")
        raise ForkServerError("fork server gave no answer")

    def close(self) -> None:
        for srv in self.platforms.values():
            srv.close()
        self.platforms.clear()
        try:
            self.conn.close()
        finally:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
            if self._sockdir is not None:
                self._sockdir.cleanup()


def unfit_reason(report: dict[str, Any]) -> str:
    """Why a parent will not fork, in one line (its report lists every variable read)."""
    if report.get("error"):
        return str(report["error"])
    if report.get("platform_resolved"):
        return "its imports resolved vLLM's platform (skipped: " + skipped_summary(report) + ")"
    return f"{report.get('threads')} threads after its imports"


def skipped_summary(report: dict[str, Any]) -> str:
    """The modules a parent left to its children; those of a skipped package by count."""
    skipped: dict[str, str] = report.get("skipped") or {}
    inner = {n for n in skipped if n.split(".")[0] != n and n.split(".")[0] in skipped}
    parts = []
    for name, why in skipped.items():
        if name in inner:
            continue
        n = sum(1 for m in inner if m.split(".")[0] == name)
        parts.append(f"{name} ({why}{f'; and {n} of its modules' if n else ''})")
    return ", ".join(parts) or "none"


def _accept(listener: Listener, proc: subprocess.Popen[bytes], timeout: float) -> Connection:
    sock = listener._listener._socket  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([sock], [], [], 0.5)
        if ready:
            return listener.accept()
        if proc.poll() is not None:
            raise ForkServerError(f"fork server exited with code {proc.returncode} before connecting")
        if time.monotonic() > deadline:
            raise ForkServerError(f"fork server did not connect within {timeout:.0f} s")


class _NotOurChild:
    """The part of ``subprocess.Popen`` the harness uses, for a process that is not this
    process's child (its exit is learned by ``poll``, which each subclass defines)."""

    pid: int
    returncode: int | None
    what = "process"

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"{self.what} pid {self.pid}", timeout or 0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ForkedProcess(_NotOurChild):
    """A forked engine process, with the part of ``subprocess.Popen`` EngineHost uses."""

    what = "engine"

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            while self.server.pump() is not None:
                pass
        except (EOFError, OSError):
            pass
        if self.pid in self.server.exits:
            self.returncode = self.server.exits.pop(self.pid)
        elif not self.server.alive:
            # The parent died: PR_SET_PDEATHSIG killed the child with it.
            self.returncode = -signal.SIGKILL
        return self.returncode


_servers: dict[tuple[str, tuple[tuple[str, str], ...]], ForkServer] = {}
_broken: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}


def server_for(python: str, child_env: dict[str, str], cwd: str, log_dir: Path) -> ForkServer:
    """The live fork server for this interpreter and start-up environment (started once)."""
    env = parent_env(child_env)
    key = (python, tuple(sorted(env.items())))
    if key in _broken:
        raise ForkServerError(_broken[key])
    srv = _servers.get(key)
    if srv is not None and srv.alive:
        _servers[key] = _servers.pop(key)  # most recently used last
        return srv
    if srv is not None:
        _servers.pop(key).close()
    while len(_servers) >= MAX_PARENTS:
        _servers.pop(next(iter(_servers))).close()
    try:
        srv = ForkServer.start(python, env, cwd, log_dir / f"forkserver-{os.getpid()}-{len(_servers)}.log")
    except (ForkServerError, OSError) as e:
        _broken[key] = str(e)
        raise ForkServerError(str(e)) from None
    _servers[key] = srv
    return srv


def close_all() -> None:
    for srv in [*_servers.values(), *_shared.values()]:
        srv.close()
    _servers.clear()
    _shared.clear()


# ---------------------------------------------------------------------------
# Shared parents: one per interpreter and environment for every process of a run
# ---------------------------------------------------------------------------

SHARE_ENV = "HIL_FORKSERVER_SHARE"  # the run's folder of shared parents (mode 0700)
# Live shared parents per folder (each holds torch and vLLM, 0.65-0.85 GiB): starting one more
# stops the least recently used (its clients keep the parents it forked for them) when
# MAX_SHARED live, or when the machine's available memory would fall below SHARED_MEMORY_FLOOR
# with one more: a test session's 30-odd environments (stacks, targets, cards, a lab's
# PYTHONPATH) each restart their parent, 10-20 s of imports, every time one was stopped.
MAX_SHARED = 16
SHARED_PARENT_BYTES = 1 << 30  # one more parent, with room to spare
SHARED_MEMORY_FLOOR = 6 << 30  # left for the engines, the workers and their children
SHARED_WITHOUT_MEMINFO = 6  # the cap where the available memory cannot be read
OWNER_ENV = "HIL_FORKSERVER_OWNER"  # the process they serve: they stop when it ends


class _SharedClientParent(_NotOurChild):
    """The parent a shared parent forked for this process (the shared parent's child: its
    exit code is not ours to read; it has ended when its pid is gone)."""

    what = "fork parent"

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not pid_alive(self.pid):
            self.returncode = 0
        return self.returncode


_shared: dict[str, ForkServer] = {}


def open_share() -> str | None:
    """Make this process the owner of a new folder of shared parents and name it in the
    environment its child processes inherit (``SHARE_ENV``, ``OWNER_ENV``); None (nothing
    done) where one is named already (a child of a shared run shares its owner's)."""
    if os.environ.get(SHARE_ENV):
        return None
    folder = tempfile.mkdtemp(prefix="hil-share-")  # mode 0700
    os.environ[SHARE_ENV] = folder
    os.environ[OWNER_ENV] = str(os.getpid())
    return folder


def close_share(folder: str) -> str:
    """Stop the shared parents of ``folder`` (they also stop on their own once it is gone);
    returns what they did, in a line: how many started and how many processes they served."""
    from harness.in_engine.fork_parent import READY_LINE

    texts = [p.read_text(errors="replace") for p in Path(folder).glob("*.log")]
    served = sum(t.count("[hil] shared parent ") - t.count(READY_LINE) for t in texts)
    started = sum(t.count(READY_LINE) for t in texts)
    _stop_least_used(Path(folder), keep=0)
    shutil.rmtree(folder, ignore_errors=True)
    if os.environ.get(SHARE_ENV) == folder:
        os.environ.pop(SHARE_ENV, None)
        os.environ.pop(OWNER_ENV, None)
    return (f"shared fork parents: {started} started for {len(texts)} environments,"
            f" {served} pytest processes served")


def share_folder() -> Path | None:
    """The run's folder of shared parents, where ``HIL_FORKSERVER_SHARE`` names one that is
    this user's own and private (else None: per-process parents)."""
    value = os.environ.get(SHARE_ENV, "")
    if not value:
        return None
    path = Path(value)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        log.warning("%s=%s is not a private folder of this user: not shared", SHARE_ENV, value)
        return None
    return path


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _start_shared(python: str, env: dict[str, str], folder: Path, key: str) -> dict[str, Any]:
    """Start the shared parent of ``key`` and wait for its record (its address and key)."""
    record = folder / f"{key}.json"
    record.unlink(missing_ok=True)
    _stop_least_used(folder, shared_room(folder))
    authkey = secrets.token_bytes(16)
    address = str(folder / f"{key}.sock")
    Path(address).unlink(missing_ok=True)  # a stopped parent's socket
    log_path = folder / f"{key}.log"
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            [python, "-m", "harness.in_engine.fork_parent", "--shared", address, str(record)],
            env={**env, **fork_parent_env(), "HIL_FORKSERVER_AUTHKEY": authkey.hex(),
                 OWNER_ENV: os.environ.get(OWNER_ENV, "")},
            cwd=str(folder), stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
            start_new_session=True)  # it outlives the process that started it
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        rec = _read_record(record)
        if rec is not None:
            if "error" in rec:
                raise ForkServerError(f"shared fork parent unfit: {rec['error']} (see {log_path})")
            return rec
        if proc.poll() is not None:
            raise ForkServerError(f"shared fork parent exited ({proc.returncode}) before it was"
                                  f" ready (see {log_path})")
        if time.monotonic() > deadline:
            proc.kill()
            raise ForkServerError(f"shared fork parent not ready within {READY_TIMEOUT:.0f} s")
        time.sleep(0.2)


def memory_available() -> int | None:
    """The machine's available memory in bytes (``MemAvailable`` of /proc/meminfo), or None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def shared_room(folder: Path, available: int | None = None) -> int:
    """How many live shared parents of ``folder`` may stay as one more starts: MAX_SHARED - 1,
    fewer where the machine's available memory would fall below SHARED_MEMORY_FLOOR (one
    parent's worth stopped per SHARED_PARENT_BYTES short), SHARED_WITHOUT_MEMINFO - 1 where it
    is unknown."""
    available = memory_available() if available is None else available
    if available is None:
        return SHARED_WITHOUT_MEMINFO - 1
    short = SHARED_MEMORY_FLOOR + SHARED_PARENT_BYTES - available
    if short <= 0:
        return MAX_SHARED - 1
    live = len(_live_parents(folder))
    return max(0, min(MAX_SHARED - 1, live - math.ceil(short / SHARED_PARENT_BYTES)))


def _live_parents(folder: Path) -> list[tuple[float, int, Path]]:
    """(last use, pid, record) of each live shared parent of ``folder``, least recently used
    first (a record's time is its parent's last client's)."""
    live = []
    for record in folder.glob("*.json"):
        rec = _read_record(record)
        pid = int(rec.get("pid", 0)) if rec else 0
        if pid_alive(pid):
            live.append((record.stat().st_mtime, pid, record))
    return sorted(live)


def _stop_least_used(folder: Path, keep: int) -> None:
    """Stop the shared parents of ``folder`` beyond the ``keep`` most recently used; their
    clients keep their own parents."""
    live = _live_parents(folder)
    for _, pid, record in live[:max(0, len(live) - keep)]:
        record.unlink(missing_ok=True)  # it stops itself too, seeing its record gone
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def shared_key(python: str, child_env: dict[str, str]) -> tuple[dict[str, str], str]:
    """The environment of the shared parent that forks ``child_env``'s engines, and its key."""
    env = {k: v for k, v in child_env.items() if not k.startswith(PER_ENGINE_PREFIXES)}
    keyed = sorted((k, v) for k, v in env.items() if k not in SHELL_STATE)
    return env, hashlib.sha256(json.dumps([python, keyed]).encode()).hexdigest()[:16]


def ensure_shared(python: str, child_env: dict[str, str], folder: Path) -> bool:
    """Start the run's shared parent for this interpreter and environment where none is live
    (the first engine that needs it then only connects); True where this call started it.
    Safe beside ``shared_server`` in any thread or process: both take the parent's lock."""
    from filelock import FileLock  # deferred: only a shared run needs it

    env, key = shared_key(python, child_env)
    with FileLock(str(folder / f"{key}.lock"), timeout=READY_TIMEOUT):
        rec = _read_record(folder / f"{key}.json")
        # Live, or unfit (an engine's own start says why, and falls back): nothing to start.
        if rec is not None and ("error" in rec or pid_alive(int(rec.get("pid", 0)))):
            return False
        _start_shared(python, env, folder, key)
        return True


def shared_server(python: str, child_env: dict[str, str], folder: Path) -> ForkServer:
    """This process's parent forked from the run's shared parent for this interpreter and
    environment (the shared parent started first where there is none)."""
    from filelock import FileLock  # deferred: only a shared run needs it

    env, key = shared_key(python, child_env)
    srv = _shared.get(key)
    if srv is not None and srv.alive:
        return srv
    if srv is not None:
        _shared.pop(key).close()
    for attempt in (1, 2):
        with FileLock(str(folder / f"{key}.lock"), timeout=READY_TIMEOUT):
            rec = _read_record(folder / f"{key}.json")
            if rec is None or "error" in rec or not pid_alive(int(rec.get("pid", 0))):
                rec = _start_shared(python, env, folder, key)
        try:
            conn = Client(rec["address"], family="AF_UNIX", authkey=bytes.fromhex(rec["authkey"]))
            os.utime(folder / f"{key}.json")  # used now: the last to be stopped
            break
        except (OSError, EOFError) as e:  # it stopped (idle) as this process came: start anew
            (folder / f"{key}.json").unlink(missing_ok=True)
            if attempt == 2:
                raise ForkServerError(f"shared fork parent unreachable: {e!r}") from None
    if not conn.poll(READY_TIMEOUT):
        conn.close()
        raise ForkServerError("shared fork parent gave no parent of this process's own")
    status, report = conn.recv()
    if status != "ready":
        conn.close()
        raise ForkServerError(f"shared fork parent refused: {report}")
    srv = ForkServer(python, env, _SharedClientParent(int(report["pid"])),  # type: ignore[arg-type]
                     conn, report, folder / f"{key}.log")
    _shared[key] = srv
    return srv


def spawn_engine(python: str, address: str, child_env: dict[str, str], cwd: str,
                 log_path: Path, logfile: IO[bytes]) -> Any:
    """The engine process for ``address``: forked from a fork server where one fits,
    else a fresh ``python -m harness.in_engine.process``. Returns a Popen-like object."""
    mode = start_mode()
    if mode != "fresh":
        spec = {"env": child_env, "cwd": cwd, "argv": [address],
                "log": str(Path(log_path).absolute())}  # the fork parent runs elsewhere
        folder = share_folder() if mode == "platform" else None
        if folder is not None:
            try:
                srv = shared_server(python, child_env, folder)
                conflicts = srv.conflicts(child_env)
                if conflicts:
                    raise ForkServerError(
                        f"variables read at import differ: {', '.join(conflicts)}")
                return srv.fork(spec)
            except (ForkServerError, OSError) as e:
                log.warning("engine not forked from the run's shared parent: %s", e)
        try:
            srv = server_for(python, child_env, cwd, log_path.parent)
            conflicts = srv.conflicts(child_env)
            if conflicts:
                raise ForkServerError(f"variables read at import differ: {', '.join(conflicts)}")
            if mode == "platform":
                try:
                    plat = srv.platform_server(child_env, cwd)
                    conflicts = plat.conflicts(child_env)
                    if conflicts:
                        raise ForkServerError(
                            f"variables read at import differ: {', '.join(conflicts)}")
                    return plat.fork(spec)
                except ForkServerError as e:
                    log.warning("engine forked before its platform was resolved: %s", e)
            return srv.fork(spec)
        except ForkServerError as e:
            log.warning("engine started as a fresh process: %s", e)
    return subprocess.Popen(
        [python, "-m", "harness.in_engine.process", address],
        env=child_env, stdin=subprocess.DEVNULL, stdout=logfile, stderr=subprocess.STDOUT, cwd=cwd,
        preexec_fn=die_with_parent(signal.SIGKILL))  # dies with pytest as a forked engine does
