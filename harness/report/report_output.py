"""Where `hil report` may write its HTML report: only a new folder, or one holding a report
it wrote before (marked with MARKER), and never over its own inputs.

The report replaces its output folder whole, so an ``--output`` naming the reports folder,
the results folder or a shard source would delete them; so would an unmarked folder of the
user's files. Such an output is refused before anything is touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

MARKER = ".hil-report"
DEFAULT_REPORT = "allure-report"


def _resolved(path: Path) -> Path:
    return Path(path).expanduser().resolve()


def _is_earlier_report(output: Path, reports: Path) -> bool:
    """A report at the default place written before the marker existed."""
    return (_resolved(output) == _resolved(Path(reports) / DEFAULT_REPORT)
            and (Path(output) / "index.html").is_file())


def output_problem(output: Path, reports: Path, inputs: Sequence[tuple[str, Path]]) -> str | None:
    """Why the report may not be written to ``output`` (None when it may). ``inputs``:
    (what, path) of every folder the report is made from (results, sources)."""
    out = _resolved(output)
    suggestion = f"pass a new folder (default {Path(reports) / DEFAULT_REPORT})"
    guarded = [("the reports folder", Path(reports)), *inputs]
    for what, path in guarded:
        p = _resolved(path)
        if out == p or p.is_relative_to(out):
            return (f"--output {output} is or contains {what} {path}, which the report would"
                    f" replace; {suggestion}. Nothing was changed")
        if what != "the reports folder" and out.is_relative_to(p):
            return (f"--output {output} is inside {what} {path}; the report would be mixed into"
                    f" it; {suggestion}. Nothing was changed")
    if Path(output).exists() and not Path(output).is_dir():
        return f"--output {output} is a file, not a folder; {suggestion}. Nothing was changed"
    if Path(output).is_dir() and not (Path(output) / MARKER).is_file():
        try:
            empty = not any(Path(output).iterdir())
        except OSError as e:
            return f"--output {output}: cannot read it ({e.strerror}). Nothing was changed"
        if not empty and not _is_earlier_report(output, reports):
            return (f"--output {output} holds files that are not a report of `hil report` (no"
                    f" {MARKER} marker), and the report replaces the whole folder; {suggestion}"
                    " or empty it yourself. Nothing was changed")
    return None


def mark_report(folder: Path) -> None:
    """Mark a folder `hil report` wrote, so a later report may replace it."""
    (Path(folder) / MARKER).write_text("written by `hil report`; replaced by the next one\n")


def swap_in(fresh: Path, dest: Path, old: Path) -> None:
    """Put the folder ``fresh`` in ``dest``'s place. The previous ``dest`` is moved to ``old``
    (the caller removes it once the new one serves) and comes back when the rename fails, so
    a failed write never leaves ``dest`` missing."""
    if dest.exists():
        dest.rename(old)
    try:
        fresh.rename(dest)
    except OSError:
        if old.exists() and not dest.exists():
            old.rename(dest)
        raise
