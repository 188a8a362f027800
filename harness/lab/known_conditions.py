"""The conditions of an example that a known failure of the explorer may need (quarantine.toml
``when``): the closed set of names an entry may use, each implemented once here, beside the
file's reader (harness.lab.quarantine), which refuses any other name.

A condition is given the failed verdict and the explorer's example (harness.explore.example:
its ``requests``, each with ``abort_after``, and its ``geometry``); it reads nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from harness.core.verdict import Verdict

_REQUEST = re.compile(r"\brequest (r\d+)\b")


def _aborted(example: Any) -> set[str]:
    return {f"r{i}" for i, r in enumerate(example.requests) if r.abort_after is not None}


def aborts(verdict: Verdict, example: Any) -> bool:
    """The example aborts a request."""
    return bool(_aborted(example))


def names_an_aborted_request(verdict: Verdict, example: Any) -> bool:
    """The verdict's first line names a request the example aborts (the first it names)."""
    named = _REQUEST.findall(verdict.why)
    return bool(named) and named[0] in _aborted(example)


_POOL_VS_DEVICE = re.compile(r"the pool has (\d+) blocks but the device's KV cache holds (\d+)")


def override_rounded_down(verdict: Verdict, example: Any) -> bool:
    """The device's KV cache is the pool rounded down to a multiple of max_num_seqs, and the
    pool is not one (the verdict's first line gives both counts)."""
    found = _POOL_VS_DEVICE.search(verdict.why)
    if not found:
        return False
    pool, device = int(found.group(1)), int(found.group(2))
    batch = example.geometry.max_num_seqs
    return pool % batch != 0 and device == pool - pool % batch


_OUT_OF_BOUNDS = re.compile(r"IndexError: index (\d+) is out of bounds for dimension 0 with"
                            r" size (\d+)")


def block_past_the_rounded_cache(verdict: Verdict, example: Any) -> bool:
    """The runner indexed its KV cache, whose size is a multiple of max_num_seqs blocks, less
    than a batch past its end (the verdict's first line gives the index and the size)."""
    found = _OUT_OF_BOUNDS.search(verdict.why)
    if not found:
        return False
    index, size = int(found.group(1)), int(found.group(2))
    batch = example.geometry.max_num_seqs
    return size % batch == 0 and size <= index < size + batch


# The conditions an entry's ``when`` may name (a name not here is refused when the file is read).
CONDITIONS: dict[str, Callable[[Verdict, Any], bool]] = {
    "aborts": aborts,
    "names_an_aborted_request": names_an_aborted_request,
    "override_rounded_down": override_rounded_down,
    "block_past_the_rounded_cache": block_past_the_rounded_cache,
}
