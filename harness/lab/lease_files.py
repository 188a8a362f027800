"""The files behind device leases, made safe to use in a folder others can see.

The lease folder must be the harness's own: a real directory (not a symlink) owned by
this user and writable by nobody else; the per-user default is created with mode 0700.
Lock and holder files are opened with O_NOFOLLOW, and holder records are written to a
new file (O_EXCL) and renamed into place, so a planted symlink cannot redirect a write.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from harness.core.parent_death import pid_alive


class LeaseDirError(RuntimeError):
    """The lease folder or a lock path in it cannot be used; the message says why and what to do."""


def default_lease_dir() -> Path:
    """Per user: ``$XDG_RUNTIME_DIR/vllm-hil-leases`` or ``<tmp>/vllm-hil-leases-<uid>``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "vllm-hil-leases"
    return Path(tempfile.gettempdir()) / f"vllm-hil-leases-{os.getuid()}"


def ensure_lease_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) or check an existing one is ours and private."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        pass
    except OSError as e:
        raise LeaseDirError(f"--lease-dir {path}: cannot create it ({e.strerror}); pass"
                            " --lease-dir a folder you can write") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise LeaseDirError(f"--lease-dir {path} is a symlink; pass --lease-dir a real folder"
                            " you own (mode 0700)")
    if not stat.S_ISDIR(st.st_mode):
        raise LeaseDirError(f"--lease-dir {path} is not a folder; remove it or pass --lease-dir"
                            " another path")
    if st.st_uid != os.getuid():
        raise LeaseDirError(f"--lease-dir {path} is owned by uid {st.st_uid}, not by you (uid"
                            f" {os.getuid()}); pass --lease-dir a folder you own (mode 0700)")
    if st.st_mode & 0o022:
        raise LeaseDirError(f"--lease-dir {path} has mode {stat.S_IMODE(st.st_mode):04o}, writable"
                            f" by others; run `chmod 700 {path}` or pass another --lease-dir")
    return path


class LockFile:
    """An exclusive kernel lock (flock) on a file; the kernel drops it when the holder dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def is_locked(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock without waiting; False when another process holds it."""
        if self._fd is not None:
            return True
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EMLINK):
                raise LeaseDirError(f"lock path {self.path} is a symlink; remove it") from None
            if e.errno == errno.EISDIR:
                raise LeaseDirError(f"lock path {self.path} is a directory; remove it") from None
            raise LeaseDirError(f"lock path {self.path}: {e.strerror}; check --lease-dir") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LeaseDirError(f"lock path {self.path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def write_holder(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` without following a symlink there: a new file, renamed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)  # replaces a symlink itself, never its target
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def clean_stale_holders(folder: Path) -> list[str]:
    """Remove holder records of processes that no longer run (and leftover temp files);
    returns the device ids cleaned."""
    cleaned = []
    for path in folder.glob("*.holder"):
        try:
            pid = int(json.loads(path.read_text()).get("pid", 0))
        except (OSError, ValueError, AttributeError, TypeError):
            pid = 0  # unreadable or of another shape: a holder of nobody, cleaned
        if pid <= 0 or not pid_alive(pid):
            path.unlink(missing_ok=True)
            cleaned.append(path.stem)
    for tmp in folder.glob(".*.holder.*.tmp"):
        try:
            pid = int(tmp.name.rsplit(".", 2)[-2])
        except ValueError:
            pid = 0
        if pid <= 0 or not pid_alive(pid):
            tmp.unlink(missing_ok=True)
    return cleaned
