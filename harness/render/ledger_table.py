"""The per-step table of a step-driven run, as text, with the first broken step marked."""

from __future__ import annotations

from collections.abc import Iterable

from harness.core.trace import StepRecord

HEADER = ["", "step", "run", "wait", "preempted", "finished", "tkv", "src", "free", "rep",
          "pad", "owned"]


def _ids(ids: Iterable[object]) -> str:
    return ",".join(str(i) for i in ids) or "-"


def _row(record: StepRecord, marked: bool) -> list[str]:
    s = record.ledger()
    if s is None:
        src = free = rep = pad = owned = "-"
    else:
        src, free = s.source, str(s.free_len())
        rep = "-" if s.reported_free is None else str(s.reported_free)
        pad = _ids(s.pad_blocks)
        owned = " ".join(f"{r}:{len(b)}" for r, b in s.owned.items() if b) or "-"
    return [
        ">>" if marked else "",
        str(record.step),
        str(len(record.running)),
        str(len(record.waiting)),
        _ids(record.preempted),
        _ids(record.finished),
        "-" if record.tkv is None else str(record.tkv),
        src, free, rep, pad, owned,
    ]


def format_step_table(steps: list[StepRecord], first_bad: int, context: int = 3) -> str:
    """A text table of the steps within ``context`` of the step numbered ``first_bad``.

    ``first_bad`` is a step number; its row is marked ``>>``. KV columns come from
    the runner's snapshot when there is one, else the scheduler's. Raises
    ValueError when no step has that number.
    """
    index = next((i for i, r in enumerate(steps) if r.step == first_bad), None)
    if index is None:
        raise ValueError(f"no step numbered {first_bad} among {len(steps)} steps")
    lo, hi = max(0, index - context), min(len(steps), index + context + 1)
    rows = [HEADER] + [_row(steps[i], i == index) for i in range(lo, hi)]
    widths = [max(len(r[c]) for r in rows) for c in range(len(HEADER))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
