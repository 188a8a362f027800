"""Evidence as files a reviewer opens: token diff (HTML), KV ledger (CSV, PNG), scenario
(JSON), engine log excerpt. Pure functions of traces and scenarios; no allure import."""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from harness.core.comparison import TokenDiff, TokenOutcome, TraceComparison
from harness.core.trace import SOURCE_VLLM_SCHEDULER, RequestTrace, StepRecord, TokenStep, Trace
from harness.core.verdict import KV_LEDGER, Verdict

# Rows of the token table kept around the first divergence when a request is long.
ROWS_BEFORE, ROWS_AFTER, MAX_ROWS = 24, 8, 64
# Lines of engine log kept in an excerpt.
LOG_LINES = 200

_CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:12px;color:#222}
h2{font-size:15px;margin:4px 0 8px} h3{font-size:14px;margin:16px 0 4px}
table{border-collapse:collapse;margin:4px 0 8px}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0} td.num{text-align:right;font-variant-numeric:tabular-nums}
td.tok{font-family:ui-monospace,monospace;white-space:pre}
tr.diverge td{background:#ffd2d2;font-weight:bold;border-color:#d33}
tr.nearTie td{background:#fff2c2;font-weight:bold}
tr.after td{color:#999;font-style:italic}
tr.gap td{color:#777;text-align:center}
tr.picked td{background:#ffe9e9;font-weight:bold}
.verdict{display:inline-block;padding:0 6px;border-radius:3px;color:#fff}
.mismatch{background:#c62828}.near-tie{background:#b8860b}.exact{background:#2e7d32}
.other{background:#6a1b9a} .muted{color:#666} pre{white-space:pre-wrap;margin:2px 0}
"""


def _outcome_class(v: TokenOutcome) -> str:
    return {TokenOutcome.EXACT: "exact", TokenOutcome.NEAR_TIE: "near-tie",
            TokenOutcome.MISMATCH: "mismatch"}.get(v, "other")


def _token_text(decode: Callable[[list[int]], str] | None, token: int | None) -> str:
    if token is None:
        return ""
    if decode is None:
        return ""
    try:
        # repr without quotes: newlines and spaces stay visible.
        return repr(decode([token]))[1:-1]
    except Exception as exc:  # noqa: BLE001 - a broken decoder must not lose the diff
        return f"<decode failed: {exc!r}>"


def _lp(step: TokenStep | None) -> str:
    if step is None:
        return ""
    lp = step.top_logprobs.get(step.token_id, step.logprob)
    return f"{lp:.4f}"


def _rows_to_show(n: int, pos: int | None) -> list[int | None]:
    """Row indices to render; None marks an elided stretch."""
    if n <= MAX_ROWS:
        return list(range(n))
    if pos is None:
        return list(range(MAX_ROWS - 1)) + [None]
    lo, hi = max(0, pos - ROWS_BEFORE), min(n, pos + ROWS_AFTER + 1)
    rows: list[int | None] = []
    if lo > 0:
        rows += [0, None] if lo > 1 else [0]
    rows += list(range(lo, hi))
    if hi < n:
        rows.append(None)
    return rows


def _request_table(
    d: TokenDiff, ref: RequestTrace | None, dev: RequestTrace | None,
    decode: Callable[[list[int]], str] | None,
) -> str:
    ref_steps = ref.steps if ref else []
    dev_steps = dev.steps if dev else []
    n = max(len(ref_steps), len(dev_steps))
    pos = d.position
    out = [
        "<table><tr><th>pos</th><th>reference id</th><th>reference text</th>"
        "<th>reference logprob</th><th>device id</th><th>device text</th>"
        "<th>device logprob</th><th>note</th></tr>"
    ]
    for i in _rows_to_show(n, pos):
        if i is None:
            out.append('<tr class="gap"><td colspan="8">&hellip;</td></tr>')
            continue
        r = ref_steps[i] if i < len(ref_steps) else None
        v = dev_steps[i] if i < len(dev_steps) else None
        cls, note = "", ""
        if pos is not None and i == pos:
            cls = "nearTie" if d.outcome is TokenOutcome.NEAR_TIE else "diverge"
            note = "first divergence" if d.outcome is not TokenOutcome.NEAR_TIE else "near-tie"
        elif pos is not None and i > pos:
            cls, note = "after", "not compared"
        out.append(
            f'<tr class="{cls}"><td class="num">{i}</td>'
            f'<td class="num">{"" if r is None else r.token_id}</td>'
            f'<td class="tok">{html.escape(_token_text(decode, r.token_id if r else None))}</td>'
            f'<td class="num">{_lp(r)}</td>'
            f'<td class="num">{"" if v is None else v.token_id}</td>'
            f'<td class="tok">{html.escape(_token_text(decode, v.token_id if v else None))}</td>'
            f'<td class="num">{_lp(v)}</td><td>{note}</td></tr>'
        )
    out.append("</table>")
    return "".join(out)


def _top_k_table(
    label: str, step: TokenStep, decode: Callable[[list[int]], str] | None, mark: set[int]
) -> str:
    ranked = sorted(step.top_logprobs.items(), key=lambda kv: (-kv[1], kv[0]))
    rows = "".join(
        f'<tr class="{"picked" if t in mark else ""}"><td class="num">{rank}</td>'
        f'<td class="num">{t}</td><td class="tok">{html.escape(_token_text(decode, t))}</td>'
        f'<td class="num">{lp:.4f}</td></tr>'
        for rank, (t, lp) in enumerate(ranked, 1)
    )
    return (
        f"<table><tr><th colspan=4>{html.escape(label)} top-{len(ranked)} at the divergence</th>"
        f"</tr><tr><th>rank</th><th>id</th><th>text</th><th>logprob</th></tr>{rows}</table>"
    )


def token_diff_html(
    comparison: TraceComparison,
    reference: Trace,
    device: Trace,
    title: str = "",
    decode: Callable[[list[int]], str] | None = None,
    prompts: dict[str, str] | None = None,
) -> str:
    """A self-contained HTML page: per request, reference vs device tokens (ids, text
    when ``decode`` is given, logprobs), the first divergence highlighted, failures first."""
    prompts = prompts or {}
    order = comparison.failures + comparison.near_ties + [
        d for d in comparison.diffs if d.outcome is TokenOutcome.EXACT
    ]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>token diff {html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h2>{html.escape(comparison.dev_target)} vs {html.escape(comparison.ref_target)}"
        f" reference{': ' + html.escape(title) if title else ''}</h2>",
        f"<p>{html.escape(comparison.summary())}; near-tie policy "
        f"{html.escape(comparison.policy.describe())}</p>",
    ]
    for d in order:
        ref = reference.requests.get(d.request_id)
        dev = device.requests.get(d.request_id)
        where = "" if d.position is None else f" at position {d.position}"
        parts.append(
            f"<h3>request {html.escape(repr(d.request_id))} "
            f"<span class='verdict {_outcome_class(d.outcome)}'>{d.outcome.value}</span>"
            f"{where}</h3>"
        )
        prompt = prompts.get(d.request_id, "")
        parts.append(
            f"<div class='muted'>prompt ({len(d.prompt_token_ids)} tokens): "
            f"<span class='tok'>{html.escape(prompt[:300])}</span>"
            f"{' &hellip;' if len(prompt) > 300 else ''}</div>"
        )
        if d.detail:
            parts.append(f"<pre>{html.escape(d.detail)}</pre>")
        if d.outcome is TokenOutcome.MISSING:
            continue
        parts.append(_request_table(d, ref, dev, decode))
        if d.position is not None and ref and dev and d.position < min(len(ref.steps), len(dev.steps)):
            mark = {t for t in (d.ref_token_id, d.dev_token_id) if t is not None}
            parts.append("<div style='display:flex;gap:16px'>")
            parts.append(_top_k_table("reference", ref.steps[d.position], decode, mark))
            parts.append(_top_k_table("device", dev.steps[d.position], decode, mark))
            parts.append("</div>")
    if comparison.extra_request_ids:
        parts.append(
            "<p>device returned requests absent from the reference: "
            + html.escape(", ".join(comparison.extra_request_ids)) + "</p>"
        )
    parts.append("</body></html>")
    return "".join(parts)


# ------------------------------------------------------------------ KV ledger

LEDGER_COLUMNS = [
    "step", "source", "num_blocks", "pad_blocks", "free_blocks", "owned_blocks",
    "reported_free", "reserved_blocks", "tkv", "running", "waiting", "preempted",
    "finished", "owners",
]


def ledger_steps(trace: Trace) -> list[StepRecord]:
    """The initial (post-warmup) record, when taken, then every engine step."""
    return trace.ledger_steps()


def _ids(values: Any) -> str:
    return " ".join(str(v) for v in values or [])


def ledger_rows(steps: list[StepRecord]) -> list[dict[str, Any]]:
    """One row per (step, KV source); a step without snapshots gives one row."""
    rows = []
    for d in steps:
        common = {
            "step": d.step,
            "tkv": d.tkv,
            "running": len(d.running),
            "waiting": len(d.waiting),
            "preempted": _ids(d.preempted),
            "finished": _ids(d.finished),
        }
        for k in d.kv or [None]:
            row = dict.fromkeys(LEDGER_COLUMNS, "")
            row.update(common)
            if k is not None:
                owned = {r: b for r, b in k.owned.items() if b}
                row.update(
                    source=k.source,
                    num_blocks=k.num_blocks,
                    pad_blocks=_ids(k.pad_blocks),
                    free_blocks=k.free_count(),
                    owned_blocks=k.owned_count(),
                    reported_free="" if k.reported_free is None else k.reported_free,
                    reserved_blocks="" if k.reserved is None else sum(k.reserved.values()),
                    owners=" ".join(f"{r}:{len(b)}" for r, b in owned.items()),
                )
            rows.append(row)
    return rows


def ledger_csv(steps: list[StepRecord]) -> str:
    """The per-step KV ledger as CSV (columns ``LEDGER_COLUMNS``)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=LEDGER_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(ledger_rows(steps))
    return buf.getvalue()


def _plot_source(steps: list[StepRecord]) -> str | None:
    sources = [k.source for d in steps for k in d.kv]
    runners = [s for s in sources if s != SOURCE_VLLM_SCHEDULER]
    # The runner holds the real blocks; the scheduler's pool can be a stand-in.
    return runners[-1] if runners else (sources[0] if sources else None)


def ledger_plot_png(
    steps: list[StepRecord], title: str = "", ledger: Verdict | None = None
) -> bytes | None:
    """A PNG of free and owned blocks per step, running requests on a second axis,
    preemptions marked in red and, when the ``ledger`` verdict failed, its first broken
    step in orange; None when no step carries a KV snapshot."""
    source = _plot_source(steps)
    if source is None:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    xs, free, owned, running = [], [], [], []
    for d in steps:
        snap = next((k for k in d.kv if k.source == source), None)
        if snap is None:
            continue
        xs.append(d.step)
        free.append(snap.free_count())
        owned.append(snap.owned_count())
        running.append(len(d.running))
    fig = Figure(figsize=(8, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.step(xs, free, where="post", label="free blocks", color="#2e7d32", linewidth=2)
    ax.step(xs, owned, where="post", label="owned blocks", color="#1565c0", linewidth=2)
    ax.set_xlabel("engine step (-1: after warmup)")
    ax.set_ylabel(f"blocks ({source})")
    ax.grid(True, alpha=0.3)
    ax2 = ax.twinx()
    ax2.step(xs, running, where="post", color="#888", linestyle=":", label="running requests")
    ax2.set_ylabel("running requests")
    ax2.set_ylim(bottom=0, top=max(running + [1]) + 1)
    ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    first_preempt = True
    for d in steps:
        if d.preempted:
            ax.axvline(d.step, color="#c62828", linestyle="--", linewidth=1.5,
                       label="preemption" if first_preempt else None)
            ax.annotate(",".join(d.preempted), (d.step, ax.get_ylim()[1]),
                        color="#c62828", fontsize=8, ha="left", va="top")
            first_preempt = False
    if ledger is not None and not ledger.ok and ledger.family == KV_LEDGER and ledger.at is not None:
        invariant = ledger.check.split(".", 1)[-1]
        ax.axvline(ledger.at, color="#ef6c00", linewidth=2, label=f"{invariant} broken")
    handles = ax.get_legend_handles_labels()
    handles2 = ax2.get_legend_handles_labels()
    ax.legend(handles[0] + handles2[0], handles[1] + handles2[1], loc="center right", fontsize=8,
              framealpha=0.9)
    ax.set_title(title or "KV ledger", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


# ------------------------------------------------------------------ scenario, log


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def scenario_json(scenario: Any, config: Any = None) -> str:
    """The scenario as run: name, tags, limits, requests, and the engine configuration."""
    data: dict[str, Any] = {
        "scenario": getattr(scenario, "name", None),
        "tags": _plain(getattr(scenario, "tags", {})),
        "limits": _plain(getattr(scenario, "limits", None)),
        "requests": [
            {
                "request_id": r.request_id,
                "arrival_step": r.arrival_step,
                "max_tokens": r.max_tokens,
                "prompt_tokens": len(r.prompt_token_ids),
                "prompt_text": r.prompt_text,
                "prompt_token_ids": list(r.prompt_token_ids),
            }
            for r in getattr(scenario, "requests", [])
        ],
    }
    if config is not None:
        data["engine"] = {"label": config.label, "key": config.key, **_plain(config.to_dict())}
    return json.dumps(data, indent=1)


def log_excerpt(path: Path | str, offset: int = 0, lines: int = LOG_LINES) -> str:
    """The last ``lines`` lines of an engine log, with a marker line where this test's
    calls began (byte ``offset``); '' when the file is unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    offset = offset if 0 <= offset <= len(data) else 0
    before = data[:offset].decode("utf-8", "replace").splitlines()
    during = data[offset:].decode("utf-8", "replace").splitlines()
    marker = f"----- this test's engine calls start here (byte {offset}) -----"
    kept = (before + [marker] + during)[-lines:]
    return f"[{path}: last {len(kept)} lines]\n" + "\n".join(kept)
