"""A command's report, written into a staging folder and published only when the command
completed, as ``hil run`` publishes its results (``run_folder``).

``hil explore`` (findings.md and its regression tests), ``hil registry`` (registry.md,
registry.json), ``hil calibrate`` (calibration.md), ``hil selftest`` (selftest.md) and
``hil bench`` (latest.json) write their report through one ``StagedReport``::

    with StagedReport(reports / "registry", "registry", "registry.md") as out:
        (out.staging / "registry.md").write_text(table)
        out.complete()                  # or out.incomplete("the table has no row")
    print(out.line)

A completed report's files replace the earlier ones of the same names (each by a rename:
a reader sees the old file or the new one, never half of one). A run that searched
nothing, refused its input or was stopped publishes nothing: the earlier report stays
byte for byte, its partial output (when it wrote any) is kept beside it in
``FOLDER/<name>-incomplete-<stamp>/`` (``<name>-interrupted-<stamp>/`` after a signal),
and ``line`` says both where the earlier report is and where this run's output went. A stop
signal (KeyboardInterrupt) leaving the block comes out as ``Stopped`` carrying that line, so
the command's one line on the way out can say what was kept.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import TracebackType
from typing import Self

from harness.staging.interrupt import Stopped, signal_of
from harness.staging.run_folder import partial_folder, pid_alive, stamp

STAGING_MARK = "-staging-"  # FOLDER/.<name>-staging-<stamp>-<pid>/


class StagedReport:
    """The staging of one command's report published into ``folder`` (see the module).
    ``primary``: the report's main file, the one the lines name (findings.md)."""

    def __init__(self, folder: Path, name: str, primary: str) -> None:
        self.folder = Path(folder)
        self.name = name
        self.primary = primary
        self.staging = self.folder / f".{name}{STAGING_MARK}{stamp()}-{os.getpid()}"
        self.published = False
        self.kept: Path | None = None  # this run's unpublished output, when it wrote any
        self.line = ""  # what became of the report, one line (no command prefix)
        self._complete = False
        self._why = "the run did not complete"
        self._stopped = False

    @property
    def earlier(self) -> Path:
        return self.folder / self.primary

    def final(self, name: str) -> Path:
        """Where a staged file ``name`` is published (what the report's text may cite)."""
        return self.folder / name

    def complete(self) -> None:
        """The run completed: its report replaces the earlier one at the block's end."""
        self._complete = True

    def incomplete(self, why: str, stopped: bool = False) -> None:
        """The run did not complete (``why``: "nothing was searched"; ``stopped``: by a
        signal the command handled itself): nothing published."""
        self._complete = False
        self._why = why
        self._stopped = stopped

    def __enter__(self) -> Self:
        self.folder.mkdir(parents=True, exist_ok=True)
        tidy_stagings(self.folder, self.name)
        self.staging.mkdir()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        stopped = isinstance(exc, KeyboardInterrupt)
        if exc is None and self._complete:
            self._publish()
            return
        if stopped:
            self._why = "stopped"
        self._keep_partial("interrupted" if stopped or self._stopped else "incomplete")
        if stopped:
            raise Stopped(signal_of(exc), self.line) from exc

    def _publish(self) -> None:
        for path in sorted(self.staging.iterdir()):
            target = self.folder / path.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)  # a folder output (none today) replaced whole
            path.replace(target)
        shutil.rmtree(self.staging, ignore_errors=True)
        self.published = True
        self.line = f"{self.primary} written: {self.earlier}"

    def _keep_partial(self, state: str) -> None:
        wrote = self.staging.is_dir() and any(self.staging.iterdir())
        if wrote:
            try:
                self.kept = partial_folder(self.folder, f"{self.name}-{state}-")
                self.staging.rename(self.kept)
            except OSError:
                self.kept = self.staging
        else:
            shutil.rmtree(self.staging, ignore_errors=True)
        earlier = (f"kept the earlier {self.primary} at {self.earlier}" if self.earlier.exists()
                   else f"no earlier {self.primary} in {self.folder}")
        mine = (f"this run's partial output ({self._why}) at {self.kept}" if self.kept else
                f"this run wrote none ({self._why})")
        self.line = f"{earlier}; {mine}"


def tidy_stagings(folder: Path, name: str) -> None:
    """The staging folders of ``name`` runs that died (SIGKILL, a power cut): kept as
    interrupted when they hold output, else removed. Those of live runs stay."""
    for path in Path(folder).glob(f".{name}{STAGING_MARK}*"):
        pid = path.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or pid_alive(int(pid)) is not False:
            continue
        if path.is_dir() and any(path.iterdir()):
            try:
                path.rename(partial_folder(folder, f"{name}-interrupted-"))
                continue
            except OSError:
                pass
        shutil.rmtree(path, ignore_errors=True)
