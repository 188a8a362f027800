"""The runs a triage makes: the failed scenario again on fresh engines, one condition varied
per run against the run as it was (``Probe``s; ``harness.triage.runner`` makes them).

- repeat: the scenario as it ran, on three fresh engines (determinism);
- batching: the failing request alone (without the other requests, and without its
  teacher-forced twin unless the check judges the forced run);
- chunked: prefill chunked the other way (a chunk larger than every prompt where the run
  chunked; a small chunk where it did not), where the target chunks prefills at all;
- prefix: prefix caching on and off, each engine running the scenario twice and judged on the
  second run (the first puts its prompts in the cache);
- recycled: on one engine with a pool it can fill, the scenario on fresh blocks, then filler
  requests that use every block once, then the scenario again on recycled blocks;
- stack: the scenario on the previous stack (``previous`` in the stack file), where installed.

Every arm differs from the repeats in its one condition; only the prefix arms run twice (both
of them, so the pair differs in prefix caching alone). A failure that needs a cached prefix one
request of the batch gives another (a teacher-forced twin) reads as depending on batching, with
prefix caching named too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.core.config import ConfigError, EngineConfig
from harness.core.trace import Trace
from harness.core.verdict import FORCED_LOGPROBS, FORCED_TOKENS
from harness.scenario.prompts import Scenario

# The version of what a triage runs and how it decides. Recorded triages of known failures
# (harness.triage.record) hold while it is unchanged (and the harness's source too): bump it
# when a change outside the harness's source (a prompt set, a built model's recipe) changes
# what a triage would find.
PLAN_VERSION = 1
REPEATS = 3
SMALL_CHUNKS = (64, 32)  # the small chunks tried, largest first (64: Spyre's block multiple)
ONE_CHUNK_MULTIPLE = 64  # a chunk larger than every prompt is rounded up to this

REPEAT, BATCHING, CHUNKED, PREFIX, RECYCLED, STACK = (
    "repeat", "batching", "chunked", "prefix", "recycled", "stack")
FACTORS = (REPEAT, BATCHING, CHUNKED, PREFIX, RECYCLED, STACK)
PREFIX_ON, PREFIX_OFF = "prefix caching on", "prefix caching off"
FRESH, RECYCLED_ARM = "fresh blocks", "recycled blocks"


@dataclass(frozen=True)
class FailedRun:
    """What the failed verdict judged: the engine, the scenario and how it was run."""

    cfg: EngineConfig
    scenario: Scenario
    op: str  # "generate" or "run_steps"
    check: str  # the failed verdict's check
    request_id: str  # the request the failure names first (the batching arm runs it alone)
    teacher: Trace | None = None  # the reference it was teacher-forced with, if it was
    reference: Trace | None = None  # the CPU reference of the scenario (token checks)


@dataclass(frozen=True)
class Judge:
    """Run ``scenario`` and judge the triaged check on its trace: one row of the table."""

    arm: str
    scenario: Scenario
    teacher: bool


@dataclass(frozen=True)
class Warm:
    """Run ``scenario`` unjudged (to fill the prefix cache)."""

    scenario: Scenario


@dataclass(frozen=True)
class Cycle:
    """Filler requests that use every block of the engine's pool once."""


Step = Judge | Warm | Cycle


@dataclass(frozen=True)
class Probe:
    """One fresh engine of ``cfg`` and what runs on it, in order; ``skip`` says why the probe
    is not made (a row of its own, ``not run``)."""

    factor: str
    cfg: EngineConfig
    steps: tuple[Step, ...]
    skip: str = ""

    def arms(self) -> list[str]:
        return [s.arm for s in self.steps if isinstance(s, Judge)]


@dataclass(frozen=True)
class Facts:
    """What the plan needs to know about the engine beyond the failed run."""

    prefix_on: bool  # the failed run's engine caches prefixes
    chunks_prefill: bool  # its target can chunk prefills (a chunked variant, or vllm-cpu)
    sized_pool: dict[str, int]  # overrides for a pool of exactly a full batch ({}: the device's)
    previous: str | None = None  # the previous stack, when it can run this variant
    previous_missing: str = ""  # why not, when it cannot


def judges_forced(check: str) -> bool:
    return check in (FORCED_TOKENS, FORCED_LOGPROBS)


def alone(scenario: Scenario, request_id: str) -> Scenario:
    (req,) = [r for r in scenario.requests if r.request_id == request_id]
    return replace(scenario, name=f"{scenario.name}-alone-{request_id}",
                   requests=[replace(req, arrival_step=0)])


def _try(factor: str, cfg: EngineConfig, changes: dict, steps: tuple[Step, ...]) -> Probe:
    try:
        return Probe(factor, cfg.with_(**changes), steps)
    except ConfigError as e:
        return Probe(factor, cfg, (), skip=f"the target refuses the condition: {e}")


def chunk_probe(run: FailedRun, facts: Facts, teacher: bool) -> Probe:
    cfg, s = run.cfg, run.scenario
    longest = max(len(r.prompt_token_ids) for r in s.requests)
    if not facts.chunks_prefill:
        return Probe(CHUNKED, cfg, (), skip=f"{cfg.label} prefills without chunks")
    chunk = cfg.max_num_batched_tokens
    if chunk is not None and chunk < longest:
        whole = -(-max(cfg.max_model_len, longest) // ONE_CHUNK_MULTIPLE) * ONE_CHUNK_MULTIPLE
        arm = f"one chunk of {whole} tokens (no prompt split; the run chunked at {chunk})"
        return _try(CHUNKED, cfg, {"max_num_batched_tokens": whole}, (Judge(arm, s, teacher),))
    for small in SMALL_CHUNKS:
        if small < longest:
            arm = f"chunks of {small} tokens (the run split no prompt)"
            probe = _try(CHUNKED, cfg, {"max_num_batched_tokens": small}, (Judge(arm, s, teacher),))
            if not probe.skip:
                return probe
    return Probe(CHUNKED, cfg, (), skip=f"no prompt is longer than {SMALL_CHUNKS[-1]} tokens:"
                 " nothing to chunk")


def plan(run: FailedRun, facts: Facts) -> list[Probe]:
    """The probes of one triage, in the order they run."""
    cfg, s = run.cfg, run.scenario
    teacher = run.teacher is not None
    probes = [Probe(REPEAT, cfg, (Judge(f"as run #{i + 1}", s, teacher),)) for i in range(REPEATS)]

    forced = judges_forced(run.check)
    if len(s.requests) > 1 or (teacher and not forced):
        one = alone(s, run.request_id)
        probes.append(Probe(BATCHING, cfg, (Judge(f"alone ({run.request_id})", one, forced),)))
    else:
        probes.append(Probe(BATCHING, cfg, (), skip="one request, judged with its teacher-forced"
                            " twin: it ran alone already"))

    probes.append(chunk_probe(run, facts, teacher))

    if run.op == "run_steps" and not facts.prefix_on:
        probes.append(Probe(PREFIX, cfg, (), skip="the KV ledger checks need prefix caching off"
                            " on this target (shared prefix blocks)"))
    else:
        for on in (True, False):
            arm = f"{PREFIX_ON if on else PREFIX_OFF} (second of two runs)"
            probes.append(_try(PREFIX, cfg, {"prefix_caching": on}, (Warm(s), Judge(arm, s, teacher))))

    recycled = (Judge(FRESH, s, teacher), Cycle(), Judge(RECYCLED_ARM, s, teacher))
    sized = facts.sized_pool if cfg.num_blocks_override is None else {}
    probes.append(_try(RECYCLED, cfg, sized, recycled))

    if facts.previous:
        probes.append(_try(STACK, cfg, {"stack": facts.previous},
                           (Judge(f"on {facts.previous}", s, teacher),)))
    else:
        probes.append(Probe(STACK, cfg, (), skip=facts.previous_missing or "no previous stack"))
    return probes
