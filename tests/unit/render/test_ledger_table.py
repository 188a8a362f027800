"""The KV ledger step table of a failed verdict: the first bad step marked, a few steps
around it, the runner's ledger preferred to the scheduler's."""

from __future__ import annotations

from typing import Any

import pytest

from harness.core.trace import SOURCE_VLLM_SCHEDULER, KvSnapshot, StepRecord
from harness.render.ledger_table import format_step_table
from tests.unit.kv_snapshots import healthy


def step_record(n: int, snaps: list[KvSnapshot], **kw: Any) -> StepRecord:
    return StepRecord(step=n, kv=list(snaps), **kw)


def test_format_step_table_marks_first_bad_and_prefers_runner() -> None:
    sched = KvSnapshot(
        source=SOURCE_VLLM_SCHEDULER,
        num_blocks=4,
        pad_blocks=[0],
        free_blocks=[3],
        owned={"r0": [1], "r1": [2]},
    )
    steps = [
        step_record(
            i,
            [sched, healthy()],
            running=["r0", "r1"],
            waiting=["r2"] if i < 3 else [],
            preempted=["r1"] if i == 4 else [],
            tkv=100 + i,
        )
        for i in range(10)
    ]
    table = format_step_table(steps, first_bad=4, context=2)
    lines = table.splitlines()
    assert len(lines) == 1 + 5
    assert lines[0].split()[:4] == ["step", "run", "wait", "preempted"]
    bad = [ln for ln in lines if ln.startswith(">>")]
    assert len(bad) == 1 and bad[0].split()[1] == "4"
    assert "r0:3 warmup-0:1" in bad[0] and "spyre-runner" in bad[0] and " r1 " in bad[0]
    assert [ln.split()[0] for ln in lines[1:] if not ln.startswith(">>")] == ["2", "3", "5", "6"]
    with pytest.raises(ValueError):
        format_step_table(steps, first_bad=99)


def test_format_step_table_without_runner_uses_scheduler() -> None:
    sched = KvSnapshot(
        source=SOURCE_VLLM_SCHEDULER,
        num_blocks=4,
        pad_blocks=[0],
        free_blocks=[3],
        owned={"r0": [1, 2]},
    )
    table = format_step_table([step_record(0, [sched]), step_record(1, [])], first_bad=0)
    assert "vllm-scheduler" in table and "r0:2" in table
