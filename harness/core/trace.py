"""The Trace and its records: what one target did with one scenario, as typed data.

Every target returns a ``Trace``, so every check works on every target. A
step-driven run adds one ``StepRecord`` per engine step (scheduler state and the
KV block ledgers as ``KvSnapshot``), the ``initial`` record taken after start-up
(an idle point), and whether the last step is idle too. These are plain
dataclasses; they become dicts only where they cross a process or a file, in
``harness.core.serialise``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# The KvSnapshot source of vLLM's own scheduler pool; a kind names the ledgers its plugin keeps
# itself in its ``ledger_sources`` (harness/targets/kind_hooks.py).
SOURCE_VLLM_SCHEDULER = "vllm-scheduler"

# Id prefixes of warmup requests ("warmup-0" in CB, "warmup_0" in static batching) and dummies.
DUMMY_ID_PREFIXES = ("warmup-", "warmup_", "dummy")


def is_dummy_id(req_id: str) -> bool:
    """True for ids of warmup or batch-padding requests."""
    return req_id.startswith(DUMMY_ID_PREFIXES)


@dataclass(frozen=True)
class TokenStep:
    """One generated position: the chosen token and the top-k alternatives.

    ``top_logprobs`` maps token id -> log-probability over the full vocabulary
    (raw model distribution, before sampling); it always contains ``token_id``.
    ``rank`` is ``token_id``'s 1-based rank in the full distribution when the
    engine reported it (teacher-forced steps: the forced token may be outside
    the top-k); None otherwise.
    """

    token_id: int
    logprob: float
    top_logprobs: dict[int, float]
    rank: int | None = None

    def prob_of(self, token_id: int) -> float | None:
        """Probability of ``token_id`` at this position, if it is in the top-k."""
        lp = self.top_logprobs.get(token_id)
        return None if lp is None else math.exp(lp)

    def rank_of(self, token_id: int) -> int | None:
        """1-based rank of ``token_id`` among the top-k, or None if absent."""
        if token_id not in self.top_logprobs:
            return None
        ranked = sorted(self.top_logprobs.items(), key=lambda kv: (-kv[1], kv[0]))
        return 1 + [t for t, _ in ranked].index(token_id)


@dataclass
class RequestTrace:
    """Everything observed about one request."""

    request_id: str
    prompt_token_ids: list[int]
    steps: list[TokenStep] = field(default_factory=list)
    num_preemptions: int = 0
    finish_reason: str | None = None
    # Prompt tokens served from the prefix cache at admission (vLLM's num_cached_tokens):
    # the executor never runs them.
    num_cached_tokens: int = 0
    # The max_tokens the request was sent with (step-driven runs record it); None where the
    # trace does not say, and the checks that need it say nothing.
    max_tokens: int | None = None
    # The step just before which the harness aborted the request (``Trace.aborted``): its
    # ``steps`` are then the tokens it had been given by then, not a finished output.
    aborted_at: int | None = None

    @property
    def token_ids(self) -> list[int]:
        return [s.token_id for s in self.steps]


@dataclass(frozen=True)
class DeltaView:
    """What the ledger checks need of a delta snapshot's free list (``harness.core.kv_delta``).

    ``free_len`` is the free list's length; ``free_hits`` the blocks among those the step
    touched, those owned before or now, and the pad blocks that are in it (the only
    blocks whose place can have changed since the previous snapshot); ``nowhere`` the
    non-pad blocks neither free nor owned.
    """

    free_len: int
    free_hits: frozenset[int]
    nowhere: frozenset[int]


@dataclass
class KvSnapshot:
    """One KV block ledger at one moment.

    ``num_blocks`` counts every block of the pool, pad blocks included; block ids
    are ``range(num_blocks)``. ``free_blocks`` is the free list in its own order,
    duplicates kept. ``owned`` maps each request id (dummies included) that holds
    at least one block to its blocks in order. ``reserved`` and ``reported_free``
    are None where the stack has no such notion. ``counted_free`` is the count the
    pool keeps beside its free list (vLLM's ``num_free_blocks``). ``ref_counts``
    holds the pool's reference count of every non-pad block that is owned or has a
    nonzero count (absent means 0); ``prefix_caching`` says whether blocks may be shared.
    ``serving`` lists the requests the runner holds in its request table (vllm-spyre 1.x).
    ``promised`` / ``promised_total`` and ``runner_blocks`` are sendnn-inference 2.x's
    scheduler promises and the runner's block table.
    """

    source: str
    num_blocks: int
    pad_blocks: list[int] = field(default_factory=list)
    free_blocks: list[int] = field(default_factory=list)
    owned: dict[str, list[int]] = field(default_factory=dict)
    dummy_ids: list[str] = field(default_factory=list)
    reserved: dict[str, int] | None = None
    reported_free: int | None = None
    tkv: int | None = None
    block_size: int | None = None
    counted_free: int | None = None
    ref_counts: dict[int, int] | None = None
    prefix_caching: bool = False
    # Requests the runner is serving, from its own request table (not its reservations);
    # None where unknown. A reservation of a request not served is a leaked one.
    serving: list[str] | None = None
    # sendnn-inference 2.x: blocks the scheduler still promises each request it admitted
    # (``reserved_blocks``: the reservation minus what was allocated since), and its own
    # running total of them (``total_reserved_blocks``); None where the stack has neither.
    promised: dict[str, int] | None = None
    promised_total: int | None = None
    # The runner's block table per request it holds (its own copy, pad blocks left out),
    # read beside the pool it should agree with; None where the runner keeps no table.
    runner_blocks: dict[str, list[int]] | None = None
    # How many blocks the device's KV cache really holds: the first (block) dimension of the
    # tensors the model runner allocated, read from their shape; None where unreadable. Every
    # block id the pool hands out must exist there (harness.checks.device_blocks).
    device_blocks: int | None = None
    # sendnn-inference 2.x, read from its scheduler (harness.checks.tkv): whether it pauses
    # decoding requests to keep the batch TKV limit (the limit itself is in Trace.info), and
    # its prefill chunk in tokens; None where the stack has neither.
    pausing: bool | None = None
    chunk_size: int | None = None
    # The TKV the scheduler predicts for its next decode step if the requests decoding now
    # (``predicted_batch``) decode together; None where it predicts none.
    predicted_tkv: int | None = None
    predicted_batch: list[str] | None = None
    # Per request the runner holds: the prompt tokens it takes from the prefix cache (it
    # computes the rest); None where the runner does not say (harness.checks.prefix_reuse).
    runner_cached: dict[str, int] | None = None
    # A tensor-parallel engine's ranks, in rank order: what each rank's model runner holds
    # (``fields``: the runner's part of this snapshot, rank 0's set above; ``table``: its
    # request block table) and its ``rank``; None for a one-rank engine (harness.checks.ranks).
    ranks: list[dict[str, Any]] | None = None
    # Set by a delta probe (harness.in_engine.probe_delta): blocks that left and joined the
    # free list since the previous snapshot; free_blocks stays empty (the host gives the
    # snapshot a delta_view, harness.core.kv_delta) and ref_counts holds only the blocks owned
    # now or at the previous snapshot.
    free_taken: list[int] | None = None
    free_returned: list[int] | None = None
    # Set by the host for a delta snapshot (harness.core.kv_delta.expand_deltas), never sent.
    delta_view: DeltaView | None = field(default=None, compare=False, repr=False)

    def is_delta(self) -> bool:
        """A delta probe's snapshot: ``free_blocks`` is empty, see ``delta_view``."""
        return self.free_taken is not None or self.free_returned is not None

    def free_len(self) -> int:
        """Length of the free list, duplicates included."""
        return self.delta_view.free_len if self.delta_view is not None else len(self.free_blocks)

    def free_count(self) -> int:
        """Distinct usable (non-pad) blocks in the free list."""
        if self.delta_view is not None:  # a rebuilt free list has no repeats
            return self.delta_view.free_len - len(self.delta_view.free_hits & set(self.pad_blocks))
        return len(set(self.free_blocks) - set(self.pad_blocks))

    def owned_count(self) -> int:
        """Distinct non-pad blocks some request holds."""
        return len({b for ids in self.owned.values() for b in ids} - set(self.pad_blocks))

    def dummy_blocks(self) -> list[int]:
        """Blocks held by warmup or batch-padding requests, sorted."""
        return sorted(b for d in self.dummy_ids for b in self.owned.get(d, []))

    def summary(self) -> str:
        """One line: source, free count, owners with block counts, pad blocks."""
        owners = " ".join(f"{r}:{len(b)}" for r, b in self.owned.items()) or "-"
        rep = "" if self.reported_free is None else f" reported={self.reported_free}"
        tkv = "" if self.tkv is None else f" tkv={self.tkv}"
        return (
            f"{self.source}: {self.num_blocks} blocks, free={self.free_len()}{rep}"
            f" pad={self.pad_blocks} owned[{owners}]{tkv}"
        )


@dataclass
class StepRecord:
    """One engine step as the scheduler and the KV ledgers saw it after the step.

    ``step`` is -1 for the record taken after start-up. Ids are scenario request
    ids. ``preempted`` and ``delivered_finished`` come from the step's scheduler
    output; ``finished`` are the requests whose final output the step returned;
    ``aborted`` those the harness aborted (as a client that went away) just before
    the step; ``preemptions`` is each live request's preemption count so far.
    """

    step: int
    running: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    delivered_finished: list[str] = field(default_factory=list)
    preemptions: dict[str, int] = field(default_factory=dict)
    # Requests the scheduler has paused after this step (sendnn-inference 2.x): out of the
    # batch, in neither running nor waiting, still holding their blocks.
    paused: list[str] = field(default_factory=list)
    scheduled: bool = False
    num_scheduled_tokens: int = 0
    tkv: int | None = None
    kv: list[KvSnapshot] = field(default_factory=list)
    # Tokens the model executor was given per request in this step (read at the executor,
    # not from the scheduler's preemption bookkeeping): a recompute shows as tokens run twice.
    executed: dict[str, int] = field(default_factory=dict)
    # What admission saw (None: not recorded, and the admission checks say nothing): the
    # requests added just before this step, those whose prompt tokens this step scheduled
    # (a prefill step), and those admitted whose prompt is not all computed after it.
    arrived: list[str] | None = None
    prefilled: list[str] | None = None
    prefilling: list[str] | None = None

    def ledger(self) -> KvSnapshot | None:
        """The snapshot that holds the real blocks: the runner's where there is one
        (with vllm-spyre the scheduler's pool is a stand-in), else the scheduler's."""
        runners = [k for k in self.kv if k.source != SOURCE_VLLM_SCHEDULER]
        if runners:
            return runners[-1]
        return self.kv[0] if self.kv else None


@dataclass
class Trace:
    """The outcome of running one scenario on one target.

    ``steps`` holds one record per engine step when the scenario was step-driven;
    ``initial`` the record after start-up (step -1), and ``idle_at_end`` says the
    last step left the engine idle (the runner heard of every finished request).
    ``metrics`` holds engine counters such as ``vllm:num_preemptions``; ``info``
    what the engine reported about itself and the run's timings. ``forced`` holds,
    per request id, the teacher-forced run (``harness.in_engine.teacher_forcing``): each step's
    token is the reference's, its logprobs the device's own before forcing. ``aborted`` holds
    the requests the harness aborted before they finished (a client that went away): their
    prompt and the tokens they had been given, apart from ``requests`` (the finished ones,
    which the output checks judge), for the checks that reason about what the run computed.
    """

    target: str
    requests: dict[str, RequestTrace] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    initial: StepRecord | None = None
    idle_at_end: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    forced: dict[str, RequestTrace] = field(default_factory=dict)
    aborted: dict[str, RequestTrace] = field(default_factory=dict)

    def ran(self) -> dict[str, RequestTrace]:
        """Every request the run computed tokens for: the finished ones and the aborted ones."""
        return {**self.aborted, **self.requests}

    def ledger_steps(self) -> list[StepRecord]:
        """The initial record, when taken, then every engine step."""
        return ([self.initial] if self.initial is not None else []) + list(self.steps)

    def idle_steps(self) -> set[int]:
        """Step numbers at which every block must be free."""
        idle = {self.initial.step} if self.initial is not None else set()
        if self.idle_at_end and self.steps:
            idle.add(self.steps[-1].step)
        return idle

    def step(self, number: int) -> StepRecord:
        """The record of step ``number``; KeyError naming the range when absent."""
        for s in self.ledger_steps():
            if s.step == number:
                return s
        raise KeyError(f"no step {number} in a trace of {len(self.steps)} steps")

