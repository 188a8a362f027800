"""Hand-built KV snapshots for the ledger tests: a healthy pool mid-run, an idle one, and a
check's lone violation."""

from __future__ import annotations

from typing import Any

from harness.checks.ledger import Violation
from harness.core.trace import KvSnapshot
from harness.targets.spyre.ledger_sources import SOURCE_SPYRE_RUNNER


def healthy(**overrides: Any) -> KvSnapshot:
    """Ten blocks: pad 0, r0 holds 1-3, warmup-0 holds 4, the rest free."""
    fields: dict[str, Any] = dict(
        source=SOURCE_SPYRE_RUNNER,
        num_blocks=10,
        pad_blocks=[0],
        free_blocks=[5, 6, 7, 8, 9],
        owned={"r0": [1, 2, 3], "warmup-0": [4]},
        dummy_ids=["warmup-0"],
        reserved={"r0": 4, "warmup-0": 1},
        reported_free=4,
        tkv=130,
        block_size=64,
        counted_free=5,
        ref_counts={1: 1, 2: 1, 3: 1, 4: 1},
    )
    fields.update(overrides)
    return KvSnapshot(**fields)


def idle(**overrides: Any) -> KvSnapshot:
    fields: dict[str, Any] = dict(
        source=SOURCE_SPYRE_RUNNER,
        num_blocks=6,
        pad_blocks=[0],
        free_blocks=[1, 2, 3, 4, 5],
        reserved={},
        reported_free=5,
        counted_free=5,
        ref_counts={},
    )
    fields.update(overrides)
    return KvSnapshot(**fields)


def only(violations: list[Violation], invariant: str) -> Violation:
    assert len(violations) == 1, violations
    assert violations[0].invariant == invariant
    return violations[0]
