"""warmup_mode: the context vllm-spyre wraps its warmup in (the card compiles on leaving it)."""

from __future__ import annotations

from torch_sendnn.log import dtlog


class warmup_mode:  # noqa: N801 - the vendor's name
    """A class, not a generator context: vllm-spyre replaces ``warmup_mode.__exit__``."""

    active = False

    def __enter__(self) -> warmup_mode:
        type(self).active = True
        dtlog("INFO", "torch_sendnn warmup mode: enter")
        return self

    def __exit__(self, *exc: object) -> None:
        type(self).active = False
        dtlog("INFO", "torch_sendnn warmup mode: exit (graphs compiled)")
