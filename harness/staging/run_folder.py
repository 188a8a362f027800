"""The reports folder as runs see it: one run or report at a time, a run's outputs written
into a fresh folder and published only when the run completed.

``hil run`` writes everything of one run (allure-results, junit*.xml, stats/, devices/,
stacks/, engine-logs/, summary.md, timing.json) into ``REPORTS/.run-<stamp>-<pid>/``. A
completed run is *published*: the previous run's outputs are moved aside, the new ones moved
into REPORTS, and only then the old ones removed. A refused run (no test ran) is discarded:
the previous results stay as they were, byte for byte. An interrupted run is kept as
``REPORTS/interrupted-<stamp>/`` beside the published results.

``hil run``, ``hil nightly`` and ``hil report`` hold a kernel lock on ``REPORTS/.hil-lock``
(fcntl.flock, released by the kernel when the holder dies) while they write; the holder's
pid, host, command and start time are in ``REPORTS/.hil-lock.holder`` so a second command is
refused naming it. A holder file left behind names a command that died holding the lock (the
kernel released it): the next command takes the lock over and says whose it was.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = ".hil-lock"
HOLDER_FILE = ".hil-lock.holder"
STAGING_PREFIX = ".run-"
OLD_PREFIX = ".old-"
INTERRUPTED_PREFIX = "interrupted-"
INCOMPLETE_PREFIX = "incomplete-"
# What one run writes at the top of the reports folder: these are replaced as a set on publish.
RUN_OUTPUTS = ("allure-results", "stats", "devices", "stacks", "engine-logs", "summary.md",
               "timing.json", "calibration")
RUN_OUTPUT_GLOBS = ("junit*.xml",)


class ReportsBusy(RuntimeError):
    """Another hil command holds the reports folder."""


def os_problem(e: OSError, doing: str) -> str:
    """One line for an OSError while writing: the path and what the errno means."""
    path = e.filename or "?"
    meaning = os.strerror(e.errno) if e.errno else str(e)
    hint = {errno.ENOSPC: "free some space", errno.EROFS: "the file system is read-only",
            errno.EACCES: "check the folder's owner and permissions",
            errno.EPERM: "check the folder's owner and permissions",
            errno.EDQUOT: "the disk quota is used up"}.get(e.errno or 0, "")
    return f"cannot {doing}: {path}: {meaning}" + (f" ({hint})" if hint else "")


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


# ------------------------------------------------------------------ the lock


def read_holder(reports: Path) -> dict[str, object]:
    try:
        data = json.loads((Path(reports) / HOLDER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def pid_alive(pid: object) -> bool | None:
    """Whether process ``pid`` of this host runs (None: not a pid, or not ours to tell)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    except OSError:
        return None
    return True


def holder_is_dead(holder: dict[str, object]) -> bool:
    """Whether the holder file names a process of this host that no longer runs."""
    return holder.get("host") == socket.gethostname() and pid_alive(holder.get("pid")) is False


def describe_holder(holder: dict[str, object]) -> str:
    if not holder:
        return "another hil command (no holder file)"
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
            f" (`{holder.get('command', '?')}`, started {holder.get('started', '?')})"
            + (", no longer running" if holder_is_dead(holder) else ""))


def _say_on_stderr(command: str) -> Callable[[str], None]:
    prog = " ".join(command.split()[:2]) or "hil"
    return lambda line: print(f"{prog}: {line}", file=sys.stderr, flush=True)


@contextmanager
def reports_lock(reports: Path, command: str,
                 say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold ``REPORTS/.hil-lock`` for the block; raises ReportsBusy naming the holder when
    another live command has it (OSError when the folder cannot be made or written). A holder
    file left by a dead command does not block: the kernel released its lock; the lock is
    taken over and ``say`` (default: a line on stderr, prefixed with the command's name) is
    told whose it was."""
    reports = Path(reports)
    reports.mkdir(parents=True, exist_ok=True)
    fd = os.open(reports / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # The kernel frees the lock of a dead holder: only a live one gets here.
            raise ReportsBusy(
                f"{reports} is in use by {describe_holder(read_holder(reports))}; wait for it"
                " to finish or pass another --reports-dir") from None
        holder_path = reports / HOLDER_FILE
        stale = read_holder(reports) if holder_path.exists() else None
        if stale is not None:
            # Every holder removes its file on release: one left names a holder that died.
            (say or _say_on_stderr(command))(
                f"took over the lock of {reports} from"
                f" {describe_holder(stale).removesuffix(', no longer running')}, which is no"
                " longer running (it ended without releasing the lock: killed?)")
        holder_path.write_text(json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(), "command": command,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}), encoding="utf-8")
        try:
            yield
        finally:
            holder_path.unlink(missing_ok=True)
    finally:
        os.close(fd)  # releases the flock


def lock_holder(reports: Path) -> str | None:
    """Who holds ``REPORTS/.hil-lock`` now (``describe_holder``), or None when nobody does:
    the lock is only looked at (taken shared for an instant, never created), so a direct
    pytest run is refused by the lock ``hil run`` holds without holding it itself."""
    try:
        fd = os.open(Path(reports) / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None  # no lock file (or none that can be opened): no command holds it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return describe_holder(read_holder(reports))
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# ------------------------------------------------------------------ staging and publishing


def new_staging(reports: Path) -> Path:
    """A fresh, empty folder for one run's outputs inside ``reports``."""
    folder = Path(reports) / f"{STAGING_PREFIX}{stamp()}-{os.getpid()}"
    folder.mkdir(parents=True)
    return folder


def result_count(results: Path) -> int:
    return len(list(Path(results).glob("*-result.json"))) if Path(results).is_dir() else 0


def run_outputs(folder: Path) -> list[Path]:
    """The run outputs present at the top of ``folder``."""
    folder = Path(folder)
    found = [folder / name for name in RUN_OUTPUTS if (folder / name).exists()]
    for pattern in RUN_OUTPUT_GLOBS:
        found += sorted(p for p in folder.glob(pattern) if p.is_file())
    return found


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def publish(staging: Path, reports: Path) -> None:
    """Replace the previous run's outputs in ``reports`` by those of ``staging``: the old ones
    are moved aside, the new ones moved in, and the old ones removed last. On an OSError the
    old ones are moved back and the error raised (``staging`` then keeps what is left)."""
    staging, reports = Path(staging), Path(reports)
    old = reports / f"{OLD_PREFIX}{stamp()}-{os.getpid()}"
    old.mkdir()
    moved_old: list[Path] = []
    moved_new: list[Path] = []
    try:
        for path in run_outputs(reports):
            path.rename(old / path.name)
            moved_old.append(path)
        for path in run_outputs(staging):
            path.rename(reports / path.name)
            moved_new.append(path)
    except OSError:
        for path in moved_new:
            (reports / path.name).rename(path)
        for path in moved_old:
            (old / path.name).rename(path)
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(staging, ignore_errors=True)


def partial_folder(reports: Path, prefix: str = INTERRUPTED_PREFIX) -> Path:
    """A new visible name for an unfinished run's folder (not created)."""
    target = Path(reports) / f"{prefix}{stamp()}"
    n = 1
    while target.exists():
        n += 1
        target = Path(reports) / f"{prefix}{stamp()}-{n}"
    return target


def keep_partial(staging: Path, reports: Path, prefix: str = INTERRUPTED_PREFIX) -> Path:
    """Keep an unfinished run's folder under a visible name; returns it."""
    target = partial_folder(reports, prefix)
    Path(staging).rename(target)
    return target


def tidy_leftovers(reports: Path) -> list[str]:
    """Under the lock: the staging folders of runs that were killed (SIGKILL, a power cut)
    are kept as interrupted runs when they hold results, else removed; half-removed previous
    outputs are removed. Returns a line per folder kept."""
    kept = []
    for path in sorted(Path(reports).glob(f"{STAGING_PREFIX}*")):
        if path.is_dir() and result_count(path / "allure-results"):
            kept.append(f"an earlier run was killed: its partial results are kept in"
                        f" {keep_partial(path, reports)}")
        else:
            _remove(path)
    for path in Path(reports).glob(f"{OLD_PREFIX}*"):
        _remove(path)
    return kept


def discard(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)
