"""Records to and from JSON-ready dicts: the one place that knows their wire shape.

Used where records cross a boundary: the engine process sends them to the
harness over a socket, and the reference cache keeps them on disk. Everything
else reads the typed records of ``harness.core.trace``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from harness.core.kv_delta import expand_deltas
from harness.core.trace import KvSnapshot, RequestTrace, StepRecord, TokenStep, Trace


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def snapshot_to_dict(s: KvSnapshot) -> dict[str, Any]:
    """A JSON-serialisable dict (all mapping keys are strings)."""
    # Field by field with shallow copies: asdict's deep copy costs 150 ms on a pool of
    # 100k blocks. The host's view of a delta (delta_view) is rebuilt on reading.
    d: dict[str, Any] = {}
    for f in fields(s):
        v = getattr(s, f.name)
        if f.name == "delta_view":
            continue
        if f.name == "ref_counts" and v is not None:
            v = {str(k): n for k, n in v.items()}
        elif f.name in ("owned", "runner_blocks") and v is not None:
            v = {k: list(ids) for k, ids in v.items()}
        elif isinstance(v, (list, dict)):
            v = v.copy()
        d[f.name] = v
    return d


def snapshot_from_dict(d: Mapping[str, Any]) -> KvSnapshot:
    """Inverse of ``snapshot_to_dict``; optional keys may be missing."""
    reserved = d.get("reserved")
    ref_counts = d.get("ref_counts")
    return KvSnapshot(
        source=str(d["source"]),
        num_blocks=int(d["num_blocks"]),
        pad_blocks=[int(b) for b in d.get("pad_blocks", [])],
        free_blocks=[int(b) for b in d.get("free_blocks", [])],
        owned={str(k): [int(b) for b in v] for k, v in d.get("owned", {}).items()},
        dummy_ids=[str(r) for r in d.get("dummy_ids", [])],
        reserved=None if reserved is None else {str(k): int(v) for k, v in reserved.items()},
        reported_free=_opt_int(d.get("reported_free")),
        tkv=_opt_int(d.get("tkv")),
        block_size=_opt_int(d.get("block_size")),
        counted_free=_opt_int(d.get("counted_free")),
        ref_counts=None if ref_counts is None else {int(k): int(v) for k, v in ref_counts.items()},
        prefix_caching=bool(d.get("prefix_caching", False)),
        serving=None if d.get("serving") is None else [str(r) for r in d["serving"]],
        promised=None if d.get("promised") is None else {str(k): int(v) for k, v in d["promised"].items()},
        promised_total=_opt_int(d.get("promised_total")),
        runner_blocks=None if d.get("runner_blocks") is None
        else {str(k): [int(b) for b in v] for k, v in d["runner_blocks"].items()},
        device_blocks=_opt_int(d.get("device_blocks")),
        pausing=None if d.get("pausing") is None else bool(d["pausing"]),
        chunk_size=_opt_int(d.get("chunk_size")),
        predicted_tkv=_opt_int(d.get("predicted_tkv")),
        predicted_batch=None if d.get("predicted_batch") is None
        else [str(r) for r in d["predicted_batch"]],
        runner_cached=None if d.get("runner_cached") is None
        else {str(k): int(v) for k, v in d["runner_cached"].items()},
        ranks=None if d.get("ranks") is None else [dict(r) for r in d["ranks"]],
        free_taken=_opt_ints(d.get("free_taken")),
        free_returned=_opt_ints(d.get("free_returned")),
    )


def _opt_ints(values: Any) -> list[int] | None:
    return None if values is None else [int(b) for b in values]


def step_to_dict(s: StepRecord) -> dict[str, Any]:
    # Field by field: asdict would deep-copy the snapshots only to have them replaced.
    d: dict[str, Any] = {f.name: getattr(s, f.name) for f in fields(s) if f.name != "kv"}
    d["kv"] = [snapshot_to_dict(k) for k in s.kv]
    return d


def step_from_dict(d: Mapping[str, Any]) -> StepRecord:
    ids = lambda key: [str(r) for r in d.get(key, [])]  # noqa: E731
    return StepRecord(
        step=int(d["step"]),
        running=ids("running"),
        waiting=ids("waiting"),
        finished=ids("finished"),
        aborted=ids("aborted"),
        preempted=ids("preempted"),
        delivered_finished=ids("delivered_finished"),
        preemptions={str(k): int(v) for k, v in d.get("preemptions", {}).items()},
        paused=ids("paused"),
        scheduled=bool(d.get("scheduled", False)),
        num_scheduled_tokens=int(d.get("num_scheduled_tokens", 0)),
        tkv=_opt_int(d.get("tkv")),
        kv=[snapshot_from_dict(k) for k in d.get("kv", [])],
        executed={str(k): int(v) for k, v in d.get("executed", {}).items()},
        arrived=_opt_ids(d.get("arrived")),
        prefilled=_opt_ids(d.get("prefilled")),
        prefilling=_opt_ids(d.get("prefilling")),
    )


def _opt_ids(values: Any) -> list[str] | None:
    return None if values is None else [str(r) for r in values]


def request_to_dict(r: RequestTrace) -> dict[str, Any]:
    return {
        "request_id": r.request_id,
        "prompt_token_ids": list(r.prompt_token_ids),
        # JSON object keys must be strings.
        "steps": [
            {
                "token_id": s.token_id,
                "logprob": s.logprob,
                "top_logprobs": {str(k): v for k, v in s.top_logprobs.items()},
                **({} if s.rank is None else {"rank": s.rank}),
            }
            for s in r.steps
        ],
        "num_preemptions": r.num_preemptions,
        "finish_reason": r.finish_reason,
        "num_cached_tokens": r.num_cached_tokens,
        # only where recorded: the reference cache's entries keep their shape
        **({} if r.max_tokens is None else {"max_tokens": r.max_tokens}),
        **({} if r.aborted_at is None else {"aborted_at": r.aborted_at}),
    }


def request_from_dict(d: Mapping[str, Any]) -> RequestTrace:
    steps = [
        TokenStep(
            token_id=int(s["token_id"]),
            logprob=float(s["logprob"]),
            top_logprobs={int(k): float(v) for k, v in s["top_logprobs"].items()},
            rank=_opt_int(s.get("rank")),
        )
        for s in d["steps"]
    ]
    return RequestTrace(
        request_id=str(d["request_id"]),
        prompt_token_ids=[int(t) for t in d["prompt_token_ids"]],
        steps=steps,
        num_preemptions=int(d.get("num_preemptions", 0)),
        finish_reason=d.get("finish_reason"),
        num_cached_tokens=int(d.get("num_cached_tokens", 0)),
        max_tokens=_opt_int(d.get("max_tokens")),
        aborted_at=_opt_int(d.get("aborted_at")),
    )


def trace_to_dict(t: Trace) -> dict[str, Any]:
    return {
        "target": t.target,
        "requests": {k: request_to_dict(v) for k, v in t.requests.items()},
        "steps": [step_to_dict(s) for s in t.steps],
        "initial": None if t.initial is None else step_to_dict(t.initial),
        "idle_at_end": t.idle_at_end,
        "metrics": dict(t.metrics),
        "info": dict(t.info),
        "forced": {k: request_to_dict(v) for k, v in t.forced.items()},
        **({"aborted": {k: request_to_dict(v) for k, v in t.aborted.items()}} if t.aborted else {}),
    }


def trace_from_dict(d: Mapping[str, Any]) -> Trace:
    """Inverse of ``trace_to_dict``; delta KV snapshots come back with their ``delta_view``."""
    initial = d.get("initial")
    trace = Trace(
        target=str(d.get("target", "")),
        requests={str(k): request_from_dict(v) for k, v in d.get("requests", {}).items()},
        steps=[step_from_dict(s) for s in d.get("steps", [])],
        initial=None if initial is None else step_from_dict(initial),
        idle_at_end=bool(d.get("idle_at_end", False)),
        metrics={str(k): float(v) for k, v in d.get("metrics", {}).items()},
        info=dict(d.get("info", {})),
        forced={str(k): request_from_dict(v) for k, v in d.get("forced", {}).items()},
        aborted={str(k): request_from_dict(v) for k, v in d.get("aborted", {}).items()},
    )
    expand_deltas(trace)
    return trace
