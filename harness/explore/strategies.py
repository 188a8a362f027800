"""The hypothesis strategies of ``hil explore``: geometries, and workloads within one.

Values where schedulers break are drawn as often as all others together: prompt lengths on
and beside KV block and prefill chunk edges (k*64-1, k*64, k*64+1), prompt + max_tokens on those
edges, shared prefixes ending on and beside block edges; and the geometries are made of such
values only: KV pools of a full batch, of fewer requests than the batch, of a block count one
below, at and one above what one full-length request needs (too small: the engine must refuse
it) and around what a full batch needs, batch TKV limits that bind. Hypothesis shrinks a
failing example toward the first of each choice: fewer requests, shorter prompts, max_tokens 1,
arrival at step 0, no abort, no shared prefix (a value that fails only on an edge shrinks to
that edge); a geometry toward context 128, batch 1, the suites' 128-token chunk, a full-batch
pool, no TKV limit and no prefix caching.

What a kind takes (its block size, whether it has a batch TKV limit, the longest request it
admits) is given by the caller: this module knows no kind.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from harness.explore.example import FAMILIES, RequestShape, geometry_of
from harness.geometry.catalog import DEVICE_POOL, FULL_BATCH_POOL, Geometry

CONTEXT_STEP = 64  # max_model_len and chunk sizes are multiples of this (a Spyre block)
CONTEXT_LENGTHS = tuple(range(128, 512 + 1, CONTEXT_STEP))  # small: this machine's engines
CHUNK_SIZES = (128, 64, 256, 512)  # the suites' chunk first: a geometry shrinks toward it
MAX_NUM_SEQS = 4
# A workload: up to two requests more than the batch (some wait), arriving within 16 steps,
# each asking for at most a block's worth of tokens and two beyond its prompt: every prompt
# can reach the next block edge and pass it, and an example stays a few seconds long (a
# longer output crosses no edge a shorter one does not).
EXTRA_REQUESTS = 2
MAX_REQUESTS = 6
MAX_ARRIVAL = 16
MAX_TOKENS_BLOCKS = 1


@dataclass(frozen=True)
class GeometrySpace:
    """Where geometries are drawn from: ``block_size`` and ``pad_blocks`` are the KV block of
    the pools the kind sizes (block counts are drawn around what requests need of them; None:
    one block per sequence); ``tkv_limit``: the kind has a batch TKV limit;
    ``prefix_caching``: draw it on and off; ``tensor_parallel``: the ranks per engine drawn
    (the first the simplest, where a finding shrinks to); ``batch_sizes``: the batches drawn
    (None: 1 to ``max_num_seqs``; a device that compiles some only, those)."""

    block_size: int | None
    pad_blocks: int = 1
    tkv_limit: bool = False
    prefix_caching: bool = True
    context_lengths: tuple[int, ...] = CONTEXT_LENGTHS
    chunk_sizes: tuple[int, ...] = CHUNK_SIZES
    max_num_seqs: int = MAX_NUM_SEQS
    tensor_parallel: tuple[int, ...] = (1,)
    batch_sizes: tuple[int, ...] | None = None


def edges(steps: Iterable[int], lo: int, hi: int) -> list[int]:
    """Every k*step - 1, k*step and k*step + 1 (k >= 1) from ``lo`` to ``hi``, sorted."""
    out: set[int] = set()
    for step in set(steps):
        for k in range(1, hi // step + 2):
            out.update(v for v in (k * step - 1, k * step, k * step + 1) if lo <= v <= hi)
    return sorted(out)


def pool_options(space: GeometrySpace, max_model_len: int, max_num_seqs: int
                 ) -> list[dict[str, Any]]:
    """The pools of a geometry, simplest first: a full batch; room for fewer full-length
    requests than the batch; block counts around one full-length request's need (one below
    it: too small, the engine must refuse it) and around a full batch's; the device's own."""
    per_request = math.ceil(max_model_len / (space.block_size or max_model_len))
    one = per_request + space.pad_blocks
    full = max_num_seqs * per_request + space.pad_blocks
    counts = sorted({n for n in (one - 1, one, one + 1, full - 1, full, full + 1) if n >= 1})
    return [{"pool": FULL_BATCH_POOL},
            *({"pool_requests": k} for k in range(1, max_num_seqs)),
            *({"num_blocks": n} for n in counts),
            {"pool": DEVICE_POOL}]


def tkv_limits(max_model_len: int, max_num_seqs: int) -> list[int]:
    """Batch TKV limits that bind (below a full batch of full-length requests) and still let
    one full-length request run, smallest first."""
    full = max_model_len * max_num_seqs
    half = max(max_model_len, (full // 2) // CONTEXT_STEP * CONTEXT_STEP)
    return sorted({v for v in (max_model_len, max_model_len + CONTEXT_STEP, half,
                               full - CONTEXT_STEP) if max_model_len <= v < full})


@st.composite
def geometries(draw: st.DrawFn, space: GeometrySpace) -> Geometry:
    """A geometry of ``space`` (see the module docstring for what is drawn)."""
    max_model_len = draw(st.sampled_from(space.context_lengths))
    max_num_seqs = draw(st.integers(1, space.max_num_seqs) if space.batch_sizes is None
                        else st.sampled_from(space.batch_sizes))
    chunk = draw(st.sampled_from([c for c in space.chunk_sizes if c <= max_model_len]))
    values: dict[str, Any] = {"max_model_len": max_model_len, "max_num_seqs": max_num_seqs,
                              "chunk_size": chunk}
    values.update(draw(st.sampled_from(pool_options(space, max_model_len, max_num_seqs))))
    limits = tkv_limits(max_model_len, max_num_seqs) if space.tkv_limit else []
    if limits:
        limit = draw(st.none() | st.sampled_from(limits))
        if limit is not None:
            values["batch_tkv_limit"] = limit
    values["prefix_caching"] = draw(st.booleans()) if space.prefix_caching else False
    if len(space.tensor_parallel) > 1:
        values["tensor_parallel_size"] = draw(st.sampled_from(space.tensor_parallel))
    return geometry_of(values)


@dataclass(frozen=True)
class WorkloadBounds:
    """What a workload in one geometry may hold: ``room[p]`` is the most max_tokens the engine
    admits with a prompt of ``p`` tokens (0: none), from the kind's own request check."""

    block_size: int
    chunk_size: int
    max_num_seqs: int
    room: tuple[int, ...]
    max_requests: int = MAX_REQUESTS
    max_arrival: int = MAX_ARRIVAL

    @classmethod
    def of(cls, geometry: Geometry, block_size: int,
           admits: Callable[[int, int], bool]) -> WorkloadBounds:
        """The bounds of ``geometry``; ``admits(prompt_len, max_tokens)`` says whether the
        engine takes such a request (more max_tokens never fits where fewer does not)."""
        mml = geometry.max_model_len
        room = [0]
        for p in range(1, mml):
            lo, hi = 0, mml - p
            while lo < hi:  # the largest m in [1, mml - p] it admits, 0 when none
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if admits(p, mid) else (lo, mid - 1)
            room.append(lo)
        return cls(block_size, geometry.chunk_size, geometry.max_num_seqs, tuple(room),
                   max_requests=min(MAX_REQUESTS, geometry.max_num_seqs + EXTRA_REQUESTS))

    @property
    def prompt_lengths(self) -> list[int]:
        """Every prompt length a request may have (room for at least one token)."""
        return [p for p in range(1, len(self.room)) if self.room[p] >= 1]

    def max_tokens_cap(self, prompt_len: int) -> int:
        return min(self.room[prompt_len], MAX_TOKENS_BLOCKS * self.block_size + 2)

    @property
    def steps(self) -> tuple[int, int]:
        return (self.block_size, self.chunk_size)


def _edged(edge_values: list[int], lo: int, hi: int) -> st.SearchStrategy[int]:
    """Any value in [lo, hi] or, as often, an edge value. Both shrink toward the smallest
    (the first branch is the simpler one to hypothesis: a value that fails only on an edge
    shrinks to that edge)."""
    anywhere = st.integers(lo, hi)
    return st.one_of(anywhere, st.sampled_from(edge_values)) if edge_values else anywhere


@st.composite
def request_shapes(draw: st.DrawFn, bounds: WorkloadBounds) -> RequestShape:
    """One request within ``bounds``."""
    lengths = bounds.prompt_lengths
    longest = lengths[-1]
    valid = set(lengths)
    prompt_len = draw(_edged(edges(bounds.steps, 1, longest), 1, longest)
                      .filter(lambda p: p in valid))
    cap = bounds.max_tokens_cap(prompt_len)
    # prompt + max_tokens on and beside an edge too: where the last block is taken.
    ends = [e - prompt_len for e in edges(bounds.steps, prompt_len + 1, prompt_len + cap)]
    max_tokens = draw(_edged(sorted({1, 2, cap, *ends} & set(range(1, cap + 1))), 1, cap))
    arrival = draw(st.integers(0, bounds.max_arrival))
    abort_after = draw(st.none() | st.integers(1, max_tokens - 1)) if max_tokens >= 2 else None
    family = draw(st.integers(0, FAMILIES - 1))
    shared = draw(_edged(sorted({0, prompt_len, *edges(bounds.steps, 1, prompt_len)}),
                         0, prompt_len))
    return RequestShape(prompt_len=prompt_len, max_tokens=max_tokens, arrival=arrival,
                        abort_after=abort_after, family=family, shared=shared)


def workloads(bounds: WorkloadBounds) -> st.SearchStrategy[tuple[RequestShape, ...]]:
    """One to ``bounds.max_requests`` requests (up to two more than the batch)."""
    return st.lists(request_shapes(bounds), min_size=1,
                     max_size=bounds.max_requests).map(tuple)
