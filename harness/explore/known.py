"""Failures of the stacks themselves that are already known: the explorer meets them, counts
them and goes on, as the suites report a quarantined test as known.

The list is data: the entries of ``quarantine.toml`` that name an explorer verdict (``check``;
``harness.lab.quarantine``), beside the suites' entries, so a failure fixed upstream is lifted
in one place. An example has no test id, so an entry tells its failure by the verdict: the
check that failed, the target variants and stacks it is known on, a regular expression of the
verdict's first line (``why``), and the conditions of the example it needs (``when``): each a
name of ``CONDITIONS``, the closed set of conditions implemented once, in
``harness.lab.known_conditions`` (the quarantine file's reader checks the names there).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from harness.core.verdict import Verdict
from harness.explore.example import Example
from harness.lab.known_conditions import CONDITIONS
from harness.lab.quarantine import KnownFailure, load_known_verdicts

# The check an engine's crash, hang or failed call during a run is filed as (by the runner).
ENGINE_ERROR = "engine_error"


def default_file() -> Path:
    """The quarantine file the explorer reads: the one the suites read by default
    (``quarantine.toml`` in the folder the command runs in)."""
    from harness.plugin.options import DEFAULT_QUARANTINE

    return DEFAULT_QUARANTINE


def load_known(path: Path | None = None) -> tuple[KnownFailure, ...]:
    """The entries of explorer verdicts of ``path`` (None: ``default_file()``), checked as the
    suites check the file (stack names too); ValueError names the file, entry and fix."""
    from harness.stacks.spec import list_stacks

    path = default_file() if path is None else path
    return tuple(load_known_verdicts(path, stacks=list_stacks()))


@lru_cache(maxsize=4)
def _known_of(path: Path, stamp: tuple[int, int]) -> tuple[KnownFailure, ...]:
    return load_known(path)


def default_known() -> tuple[KnownFailure, ...]:
    """``load_known()`` of the default file, read again only when the file changes."""
    path = default_file()
    try:
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        stamp = (0, 0)
    return _known_of(path, stamp)


def known_failure(verdict: Verdict, example: Example, variant: str, stack: str,
                  known: Sequence[KnownFailure] | None = None) -> KnownFailure | None:
    """The known failure ``verdict`` is (the first entry of ``known`` that holds for it; None:
    ``default_known()``), or None."""
    if verdict.ok:
        return None
    entries = default_known() if known is None else known
    return next((k for k in entries
                 if k.holds_for_verdict(verdict.check, verdict.why, variant, stack)
                 and all(CONDITIONS[c](verdict, example) for c in k.when)), None)
