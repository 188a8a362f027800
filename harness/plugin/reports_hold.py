"""A direct pytest run holds its reports folder for its session, as ``hil run``, ``hil
nightly``, ``hil report`` and ``hil explore`` do: the same kernel lock on ``REPORTS/.hil-lock``
(harness/staging/run_folder.py, ``reports_lock``), its holder file naming the run. A second
run into the same folder, a direct pytest or a ``hil`` command, is then refused at its start
naming the holder, instead of mixing its results into the first's or replacing its summary;
a run into another folder goes ahead. The kernel releases the lock when the run ends, or dies.

Only the process that writes the run's outputs takes it: the xdist controller (never a
worker), in a run that runs tests (``--collect-only``, ``--help``... write nothing, so they
neither take the lock nor are refused by it), and not the child pytest ``hil run`` starts
into a staging folder of the reports folder it holds (that folder is its parent's)."""

from __future__ import annotations

import shlex
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from harness.plugin.invocation import is_worker, writes_nothing
from harness.staging.run_folder import (
    STAGING_PREFIX,
    ReportsBusy,
    describe_holder,
    lock_holder,
    os_problem,
    read_holder,
    reports_lock,
)

# The holder file names the run by its command line, shortened to stay on one screen.
COMMAND_CHARS = 160


def run_command(config: pytest.Config) -> str:
    """The run's command line as its holder file names it: ``pytest ARGS``."""
    args = getattr(getattr(config, "invocation_params", None), "args", ())
    line = shlex.join(["pytest", *map(str, args)])
    return line if len(line) <= COMMAND_CHARS else line[:COMMAND_CHARS - 3] + "..."


def is_staging_of_held_folder(folder: Path) -> bool:
    """Whether ``folder`` is a run's staging folder (``REPORTS/.run-*``) inside a reports folder
    a ``hil`` command holds: the child pytest that command started writes there."""
    return folder.name.startswith(STAGING_PREFIX) and lock_holder(folder.parent) is not None


def hold_reports(config: pytest.Config) -> None:
    """Take the lock of the run's ``--hil-reports-dir`` until the session ends, or refuse the
    run (pytest.UsageError, exit 4) naming the run or command that holds it and the fix."""
    reports = config.getoption("--hil-reports-dir", None)
    if not isinstance(reports, str) or not reports or is_worker(config) or writes_nothing(config):
        return
    folder = Path(reports)
    if is_staging_of_held_folder(folder):
        return
    hold = ExitStack()
    try:
        hold.enter_context(reports_lock(
            folder, run_command(config),
            say=lambda line: print(f"vllm-hil: {line}", file=sys.stderr, flush=True)))
    except ReportsBusy:
        raise pytest.UsageError(
            f"--hil-reports-dir {reports}: in use by {describe_holder(read_holder(folder))}; a"
            " run into it would mix its results into that run's: wait for it to finish, or"
            " pass another --hil-reports-dir") from None
    except OSError as e:
        raise pytest.UsageError(
            f"--hil-reports-dir {reports}: {os_problem(e, 'take the lock of the reports folder')}"
        ) from None
    config.add_cleanup(hold.close)
