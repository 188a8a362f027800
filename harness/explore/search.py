"""The search: geometries one at a time, a hypothesis search over workloads in each.

An engine serves one geometry, so the search keeps to a geometry while it looks for workloads
that break it: hypothesis draws ``EXAMPLES_PER_GEOMETRY`` workloads for each (``workloads``),
all run on that geometry's one engine, and then moves on to the next geometry. The geometries
come from a hypothesis strategy too (``geometries``), drawn from the run's seed: the simplest
first (context 128, batch 1, a full-batch pool), then others, edge values as often as any.

A failed example stops the search. Hypothesis shrinks its workload in its geometry (each
check's failure is its own bug to hypothesis, so a shrink never trades the failed check for
another), each candidate on a fresh engine, as a regression test runs it; each request the
failure does not need is then dropped (hypothesis may leave one), and the geometry is
made simpler one value at a time (no TKV limit, no prefix caching, a full-batch pool, the
128-token chunk, a smaller batch, a shorter context), each kept where the same check still
fails with the shrunk workload. Shrinking has its own time (``shrink_budget``): the budget is
for finding.

Hypothesis keeps every failing workload in its example database (the harness cache's
``explore/db``), under a key of the geometry, target, model, stack and faults; ``cells.json``
beside it lists the geometries that failed, so the next run with the same target, model,
stack and faults replays them first.

A finding is then replayed on fresh engines before it is reported (``confirm.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Flaky, Unsatisfiable

from harness.explore.confirm import CONFIRM_REPLAYS, Finding, confirm
from harness.explore.example import FORMAT, Example, Identity, RequestShape, geometry_of
from harness.explore.runner import FAILED, REJECTED, ExampleRunner, Outcome
from harness.explore.strategies import (
    CHUNK_SIZES,
    CONTEXT_LENGTHS,
    CONTEXT_STEP,
    GeometrySpace,
    geometries,
    workloads,
)
from harness.geometry.catalog import FULL_BATCH_POOL, Geometry, GeometryError

EXAMPLES_PER_GEOMETRY = 8  # workloads per geometry: its engine starts once for them all
GEOMETRY_DRAWS = 400  # geometries drawn from the seed (more than any budget gets through)
CELLS_FILE = "cells.json"
DB_FOLDER = "db"


class OutOfBudget(BaseException):
    """The budget (or the shrink budget) is spent: hypothesis lets it through, unsaved."""


class WholeGeometryRefused(BaseException):
    """Every example of the geometry would be refused (its engine refused to start)."""


class ExampleFailed(Exception):
    """A failed example, raised to hypothesis; one subclass per check (``failure_type``), so
    hypothesis shrinks each check's failure as a bug of its own."""


_FAILURE_TYPES: dict[str, type[ExampleFailed]] = {}


def _leaves(error: BaseException) -> Iterator[BaseException]:
    """The errors of ``error``: itself, or every error of its (nested) group (hypothesis's
    flaky failure, a group itself, counts as one)."""
    if isinstance(error, BaseExceptionGroup) and not isinstance(error, Flaky):
        for e in error.exceptions:
            yield from _leaves(e)
    else:
        yield error


def failure_type(check: str) -> type[ExampleFailed]:
    """The exception class of a failure of ``check``."""
    if check not in _FAILURE_TYPES:
        name = "Failed_" + "".join(c if c.isalnum() else "_" for c in check)
        _FAILURE_TYPES[check] = type(name, (ExampleFailed,), {"check": check})
    return _FAILURE_TYPES[check]


def cell_key(identity: Identity, geometry: Geometry | dict[str, Any]) -> str:
    """The example database key of one geometry's workloads."""
    values = geometry if isinstance(geometry, dict) else Example.of(geometry, ()).values
    blob = json.dumps({"format": FORMAT, "geometry": values, **identity.to_dict()},
                      sort_keys=True)
    return "hil-explore-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def draw_geometries(space: GeometrySpace, seed: int, count: int = GEOMETRY_DRAWS
                    ) -> list[Geometry]:
    """Up to ``count`` distinct geometries of ``space``, drawn by hypothesis from ``seed``:
    the simplest first."""
    drawn: dict[Geometry, None] = {}

    @settings(database=None, max_examples=count, phases=(Phase.generate,), deadline=None,
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
    @hypothesis_seed(seed)
    @given(geometries(space))
    def collect(g: Geometry) -> None:
        drawn.setdefault(g)

    collect()
    return list(drawn)


def simpler_geometries(values: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The geometries one step simpler than ``values``, the biggest simplification first: no
    TKV limit, no prefix caching, a full-batch pool, the 128-token chunk, each smaller batch,
    each shorter context (its chunk cut to fit). Each is a valid geometry."""
    mml, chunk = values["max_model_len"], values["chunk_size"]
    candidates: list[dict[str, Any]] = []
    if "batch_tkv_limit" in values:
        candidates.append({k: v for k, v in values.items() if k != "batch_tkv_limit"})
    if values.get("prefix_caching"):
        candidates.append({**values, "prefix_caching": False})
    if values.get("pool") != FULL_BATCH_POOL:
        pool = {k: v for k, v in values.items() if k not in ("pool_requests", "num_blocks")}
        candidates.append({**pool, "pool": FULL_BATCH_POOL})
    if chunk != CHUNK_SIZES[0] and CHUNK_SIZES[0] <= mml:
        candidates.append({**values, "chunk_size": CHUNK_SIZES[0]})
    candidates += [{**values, "max_num_seqs": n} for n in range(1, values["max_num_seqs"])]
    candidates += [{**values, "max_model_len": m, "chunk_size": min(chunk, m)}
                   for m in CONTEXT_LENGTHS if m < mml and m % CONTEXT_STEP == 0]
    for c in candidates:
        try:
            geometry_of(c)
        except GeometryError:
            continue
        yield c


@dataclass
class Tally:
    """What the search did: examples run and their outcomes, the rejections by reason, the
    geometries explored and refused, and the seconds the runs took."""

    examples: int = 0
    passed: int = 0
    failed: int = 0
    known: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    geometries: int = 0
    geometries_refused: Counter[str] = field(default_factory=Counter)
    run_seconds: float = 0.0
    flaky: int = 0

    def add(self, outcome: Outcome) -> None:
        if outcome.status == REJECTED:
            if not outcome.whole_geometry:  # a refused geometry is counted as one
                self.rejected[outcome.reason] += 1
            return
        self.examples += 1
        self.run_seconds += outcome.seconds
        if outcome.status == FAILED:
            self.failed += 1
        else:
            self.passed += 1
        for k in outcome.known:
            self.known[k.reason] += 1

    @property
    def seconds_per_example(self) -> float | None:
        return self.run_seconds / self.examples if self.examples else None


@dataclass
class SearchResult:
    """What one target's search found and did: its findings, its tally, how long it took and
    why it ended, the engines its session started (and their seconds) and where the session's
    time went (``HilSession.timers``: engine_start, engine_calls, reference, checks...)."""

    findings: list[Finding]
    tally: Tally
    seconds: float
    stopped: str  # why the search ended
    engine_starts: int = 0
    engine_start_seconds: float = 0.0
    timers: dict[str, float] = field(default_factory=dict)


@dataclass
class _Cell:
    """One geometry's search state: the latest (most shrunk) failing example of each check."""

    found: dict[str, tuple[Example, Outcome]] = field(default_factory=dict)
    first: str | None = None
    first_example: Example | None = None
    found_after: float = 0.0
    examples_before: int = 0
    shrink_started: float = 0.0
    shrink_deadline: float = 0.0
    shrink_runs: int = 0
    flaky: bool = False


class Explorer:
    """The search of one target variant, model and stack (``runner``) for ``budget`` seconds."""

    def __init__(self, runner: ExampleRunner, explore_dir: Path, identity: Identity, seed: int,
                 budget: float, shrink_budget: float,
                 per_geometry: int = EXAMPLES_PER_GEOMETRY,
                 geometry_draws: int = GEOMETRY_DRAWS, confirm: int = CONFIRM_REPLAYS,
                 log: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.runner = runner
        self.dir = explore_dir
        self.identity = identity
        self.seed = seed
        self.budget = budget
        self.shrink_budget = shrink_budget
        self.per_geometry = per_geometry
        self.geometry_draws = geometry_draws
        self.confirm = confirm  # replays of a finding on fresh engines before it is reported
        self.log = log
        self.clock = clock
        self.db = DirectoryBasedExampleDatabase(str(explore_dir / DB_FOLDER))
        self.tally = Tally()
        self._start = 0.0
        self._deadline = 0.0

    # -- the geometries, those that failed before first ---------------------------------
    def _cells(self) -> dict[str, dict[str, Any]]:
        path = self.dir / CELLS_FILE
        try:
            cells = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return cells if isinstance(cells, dict) else {}

    def _remember(self, geometry: Geometry) -> None:
        """List ``geometry`` among those whose failing workloads the database keeps."""
        cells = self._cells()
        cells[cell_key(self.identity, geometry)] = {
            "geometry": Example.of(geometry, ()).values, **self.identity.to_dict()}
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{CELLS_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(cells, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(self.dir / CELLS_FILE)

    def replay_geometries(self) -> list[Geometry]:
        """The geometries of this identity whose failing workloads the database still keeps."""
        out = []
        mine = self.identity.to_dict()
        for key, cell in self._cells().items():
            if not isinstance(cell, dict) or {k: cell.get(k) for k in mine} != mine:
                continue
            if not any(True for _ in self.db.fetch(key.encode())):
                continue
            try:
                out.append(geometry_of(cell["geometry"]))
            except (GeometryError, KeyError, TypeError):
                continue
        return out

    def geometries(self) -> Iterator[tuple[Geometry, bool]]:
        """(geometry, replayed) in the order the search takes them."""
        replayed = self.replay_geometries()
        for g in replayed:
            yield g, True
        seen = set(replayed)
        for g in draw_geometries(self.runner.space(), self.seed, self.geometry_draws):
            if g not in seen:
                yield g, False

    # -- the search ------------------------------------------------------------------------
    def run(self) -> SearchResult:
        """Search until a finding or the budget's end."""
        before = self.runner.hil.stats()  # the session may have searched another target
        self._start = self.clock()
        self._deadline = self._start + self.budget
        stopped = "every geometry drawn was explored"
        findings: list[Finding] = []
        for n, (geometry, replayed) in enumerate(self.geometries(), 1):
            if self.clock() >= self._deadline:
                stopped = "the budget was spent"
                break
            finding = self._explore(n, geometry, replayed)
            if finding is not None:
                findings.append(confirm(finding, self.runner, self.confirm, self.log, self.clock))
                stopped = "a finding"
                break
        stats = self.runner.hil.stats()
        started = stats.engines[len(before.engines):]
        timers = {k: round(v - before.timers.get(k, 0.0), 3) for k, v in stats.timers.items()}
        return SearchResult(findings, self.tally, round(self.clock() - self._start, 1), stopped,
                            engine_starts=len(started),
                            engine_start_seconds=round(sum(e["seconds"] for e in started), 1),
                            timers=timers)

    def _explore(self, n: int, geometry: Geometry, replayed: bool) -> Finding | None:
        """Search the workloads of one geometry; the shrunk finding, or None."""
        what = geometry.describe().split(": ", 1)[1]
        refusal = self.runner.geometry_refusal(geometry)
        if refusal:
            self.tally.geometries_refused[refusal] += 1
            return None
        before = self.tally.examples
        t0 = self.clock()
        cell = _Cell()
        refused = self._search(geometry, cell)
        if refused:
            self.tally.geometries_refused[refused] += 1
            return None
        self.tally.geometries += 1
        self.log(f"hil explore: geometry {n}{' (replayed)' if replayed else ''}: {what}:"
                 f" {self.tally.examples - before} example(s) in {self.clock() - t0:.0f} s"
                 + (f"; failed: {cell.first}" if cell.first else ""))
        if cell.first is None:
            return None
        self._remember(geometry)
        example, outcome = cell.found[cell.first]
        example, outcome, dropped = self._fewer_requests(example, outcome, cell.first,
                                                         cell.shrink_deadline)
        example, outcome, runs = self._simpler_geometry(example, outcome, cell.first,
                                                        cell.shrink_deadline)
        runs += dropped
        return Finding(check=cell.first, example=example, outcome=outcome,
                       identity=self.identity, found_after=round(cell.found_after, 1),
                       examples_before=cell.examples_before,
                       shrink_seconds=round(self.clock() - cell.shrink_started, 1),
                       shrink_runs=cell.shrink_runs + runs,
                       original=cell.first_example or example, reproduced=not cell.flaky)

    def _search(self, geometry: Geometry, cell: _Cell) -> str | None:
        """Run hypothesis over the workloads of ``geometry``; what it found is in ``cell``.
        Returns why the geometry was refused when its engine refused it, else None."""
        runner, clock = self.runner, self.clock

        def one(requests: tuple[RequestShape, ...]) -> None:
            now = clock()
            if now >= (cell.shrink_deadline if cell.first else self._deadline):
                raise OutOfBudget
            example = Example.of(geometry, requests)
            # Shrinking runs each candidate on a fresh engine: a failure that needs an earlier
            # example's engine state does not reproduce (hypothesis then says so: flaky).
            outcome = runner.run(example, fresh=cell.first is not None)
            self.tally.add(outcome)
            if cell.first:
                cell.shrink_runs += 1
            if outcome.status == REJECTED:
                if outcome.whole_geometry and not cell.first:
                    raise WholeGeometryRefused(outcome.reason)
                reject()  # and a shrink step whose fresh engine did not start: not that one
            failure = outcome.failure
            if failure is None:
                return
            if cell.first is None:
                cell.first, cell.first_example = failure.check, example
                cell.found_after = clock() - self._start
                cell.examples_before = self.tally.examples
                cell.shrink_started = clock()
                cell.shrink_deadline = cell.shrink_started + self.shrink_budget
            kept = cell.found.get(failure.check)
            if kept is None or example.simplicity() <= kept[0].simplicity():
                # hypothesis's latest failing candidate is not always the simplest one run
                # (a shrink cut short by its time): each check keeps its simplest
                cell.found[failure.check] = (example, outcome)
            raise failure_type(failure.check)(failure.why)

        test = settings(
            database=self.db, max_examples=self.per_geometry, deadline=None,
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
            suppress_health_check=list(HealthCheck), report_multiple_bugs=True,
            verbosity=Verbosity.quiet, print_blob=False, derandomize=False,
        )(hypothesis_seed(self._seed_of(geometry))(given(workloads(runner.bounds(geometry)))(one)))
        test._hypothesis_internal_database_key = cell_key(self.identity, geometry).encode()
        try:
            test()
        except BaseException as e:  # noqa: BLE001 - sorted by _settle, the rest re-raised
            return self._settle(e, cell)
        return None

    def _settle(self, error: BaseException, cell: _Cell) -> str | None:
        """What the end of one geometry's hypothesis run says: why the geometry was refused,
        or None (what was found is in ``cell``). Hypothesis ends with one error, or, when
        several checks failed or the time ran out while it shrank one, a group of them: each
        is settled here (a spent budget, a failed check, an unsatisfiable or flaky search),
        and anything else, an error of the harness, goes on up."""
        leaves = list(_leaves(error))
        refused = next((e for e in leaves if isinstance(e, WholeGeometryRefused)), None)
        if refused is not None and cell.first is None:
            return str(refused)
        if any(isinstance(e, Flaky) for e in leaves):
            cell.flaky = True
            self.tally.flaky += 1
        settled = (OutOfBudget, WholeGeometryRefused, ExampleFailed, Flaky, Unsatisfiable)
        if not all(isinstance(e, settled) for e in leaves):
            raise error
        return None

    def _seed_of(self, geometry: Geometry) -> int:
        blob = f"{self.seed}:{cell_key(self.identity, geometry)}".encode()
        return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big")

    def _still_fails(self, candidate: Example, check: str) -> Outcome | None:
        """``candidate``'s outcome, run on a fresh engine, when ``check`` fails first in it."""
        result = self.runner.run(candidate, fresh=True)
        self.tally.add(result)
        failure = result.failure
        return result if failure is not None and failure.check == check else None

    def _fewer_requests(self, example: Example, outcome: Outcome, check: str,
                        deadline: float) -> tuple[Example, Outcome, int]:
        """``example`` without each request ``check`` still fails without, one at a time (the
        shrinker of hypothesis may leave a request that changes nothing in the failure)."""
        runs = 0
        i = 0
        while 1 < len(example.requests) and i < len(example.requests) \
                and self.clock() < deadline:
            requests = example.requests[:i] + example.requests[i + 1:]
            candidate = Example.of(example.values, requests)
            result = self._still_fails(candidate, check)
            runs += 1
            if result is not None:
                example, outcome = candidate, result
            else:
                i += 1
        return example, outcome, runs

    def _simpler_geometry(self, example: Example, outcome: Outcome, check: str,
                          deadline: float) -> tuple[Example, Outcome, int]:
        """``example`` in the simplest geometry where ``check`` still fails (one value made
        simpler at a time, until none is or the shrink time is spent)."""
        runs = 0
        improved = True
        while improved and self.clock() < deadline:
            improved = False
            for values in simpler_geometries(example.values):
                if self.clock() >= deadline:
                    break
                candidate = Example.of(values, example.requests)
                result = self._still_fails(candidate, check)
                runs += 1
                if result is not None:
                    example, outcome, improved = candidate, result, True
                    self.log(f"hil explore: still fails in the simpler geometry"
                             f" {candidate.geometry.describe().split(': ', 1)[1]}")
                    break
        return example, outcome, runs
