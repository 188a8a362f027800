"""Block timing: a finished request's blocks go back to the pool at the step it finishes.

vLLM's scheduler frees a request's blocks in the step whose output says it finished, so in
the ``vllm-scheduler`` snapshot taken after that step the request owns nothing. A runner
that keeps a pool of its own (vllm-spyre 1.x and 0.x) hears of a finish one step later, in
the next scheduler output (``StepRecord.delivered_finished``), and frees the blocks in that
step. A free done one step late leaks nothing at idle and keeps every block owned (so
conservation holds): only this timing shows it. A request aborted before a step
(``StepRecord.aborted``: its client went away) is finished by the scheduler then: its blocks
are free in the snapshot after that step, and a runner hears of it in that step's output.

Preempted and paused requests are not finished and keep or drop their blocks by their own
rules; warmup and padding requests (``is_dummy_id``) are left to the dummy checks. A request
that still holds its blocks at an idle point is a leak, which ``idle_all_free`` reports
there; this rule reports the blocks a finished request holds and later gives back.
The sendnn-inference 2.x runner's own table (``KvSnapshot.runner_blocks``) hears of a finish
one step later too; ``runner_table`` checks it against the pool at every step.
"""

from __future__ import annotations

from harness.core.trace import SOURCE_VLLM_SCHEDULER, KvSnapshot, StepRecord, is_dummy_id
from harness.core.verdict import Violation

NAME = "freed_on_finish"


def _finished_here(record: StepRecord, s: KvSnapshot) -> list[str]:
    """The requests whose blocks ``s``'s pool must have freed by the end of ``record``'s step."""
    ids = ([*record.finished, *record.aborted] if s.source == SOURCE_VLLM_SCHEDULER
           else record.delivered_finished)
    dummies = set(s.dummy_ids)
    return [r for r in dict.fromkeys(ids) if not is_dummy_id(r) and r not in dummies]


def _later(records: list[StepRecord], i: int, source: str, req_id: str) -> tuple[int, bool]:
    """The first step after ``records[i]`` at which ``req_id`` owns nothing in ``source``'s
    pool, and False; or the last step it was seen holding blocks, and True."""
    last = records[i].step
    for record in records[i + 1:]:
        for s in record.kv:
            if s.source != source:
                continue
            if not s.owned.get(req_id):
                return record.step, False
            last = record.step
    return last, True


def check_freed_on_finish(records: list[StepRecord], idle: set[int] | None = None) -> list[Violation]:
    """Each request that finished at a step owns no blocks in the snapshot after that step.

    ``records`` are the trace's ledger steps in order; ``idle`` the step numbers that are
    idle points (blocks still held there are left to ``idle_all_free``).
    """
    idle = idle or set()
    out: list[Violation] = []
    for i, record in enumerate(records):
        for s in record.kv:
            for req_id in _finished_here(record, s):
                held = s.owned.get(req_id)
                if not held:
                    continue
                until, kept = _later(records, i, s.source, req_id)
                if kept and until in idle:
                    continue  # a leak: idle_all_free says so at the idle point
                late = (f"still held at step {until}, the last recorded" if kept
                        else f"given back at step {until}")
                blocks = "[" + ", ".join(str(b) for b in held) + "]"
                ended = "was aborted" if req_id in record.aborted else "finished"
                when = (ended if s.source == SOURCE_VLLM_SCHEDULER
                        else f"{ended} and its runner heard of it")
                out.append(Violation(
                    NAME,
                    f"block timing: request {req_id} {when} at step {record.step} but still"
                    f" owns blocks {blocks} after that step (freed late: {late})",
                    record.step,
                    s.source,
                ))
    return out
