"""cpu-ref as a kind: it runs on the shared CPU, with no engine and no test variants of its own."""

from __future__ import annotations

from harness.reference.runner import NAME
from harness.targets.base import CPU_DEVICE, TargetKind


class CpuReference(TargetKind):
    """The reference kind: runs on the shared CPU, no engine and no test variants of its own
    (every variant is compared against it)."""

    name = NAME
    order = 0
    device = CPU_DEVICE


KIND = CpuReference
