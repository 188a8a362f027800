"""``hil calibrate``: measure each model's reduced-precision noise and show its thresholds.

    hil calibrate [--model NAME|FOLDER ...] [--precision fp16,bf16] [--cache-dir DIR]
                  [--reports-dir DIR] [--force] [--attn-scale F]

Per model and precision: the calibration from the cache, or measured now
(``harness.calibration.store``), printed as a table (metric, n, p50, p99, max, band,
limit) and written to REPORTS_DIR/calibration.md. ``--attn-scale 1.08`` then measures the
model again with an 8 % attention-scale fault and says whether the thresholds catch it.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from harness.calibration.fault import Judged, judge_measurement
from harness.calibration.measure import PRECISIONS, measure
from harness.calibration.metrics import METRICS, UNITS
from harness.calibration.store import Calibration, calibrate
from harness.calibration.thresholds import ALPHA, BAND_RATE, LIMIT_MARGIN
from harness.staging.staged_report import StagedReport

DEFAULT_MODELS = ("tiny-llama", "tiny-granite")
COLUMNS = ("metric", "unit", "n", "p50", "p99", "max", "band", "limit")
FAULT_COLUMNS = ("metric", "p50", "p99", "max", "over band", "over limit", "requests failed",
                 "run")


class CommandError(ValueError):
    """A refusal: one line for ``hil calibrate: ...``."""


def _list(values: list[str], default: tuple[str, ...]) -> list[str]:
    items = [x.strip() for v in values for x in v.split(",") if x.strip()]
    return list(dict.fromkeys(items)) or list(default)


def _g(x: float) -> str:
    return f"{x:.4g}"


def calibration_rows(c: Calibration) -> list[tuple[str, ...]]:
    rows = []
    for name in METRICS:
        t = c.thresholds.metrics[name]
        rows.append((name, UNITS[name], str(t.n), _g(t.p50), _g(t.p99), _g(t.max), _g(t.band),
                     _g(t.limit)))
    return rows


def fault_rows(judged: list[Judged]) -> list[tuple[str, ...]]:
    return [(j.metric, _g(j.p50), _g(j.p99), _g(j.max), f"{j.over_band} of {j.n}"
             f" ({j.allowed} allowed)", str(j.over_limit), f"{j.requests_failed} of {j.requests}",
             "fails" if j.run_failed else "passes") for j in judged]


def heading(model: str, c: Calibration) -> str:
    v = c.value
    how = "measured now" if c.measured else "from the cache"
    return (f"{model} {v['precision']}: {v['positions']} positions of {v['sequences']} sequences,"
            f" greedy flips {v['flips']} ({100 * c.thresholds.flip_rate:.2f} %), measured in"
            f" {v['seconds']:g} s ({how})")


def text_table(rows: list[tuple[str, ...]], columns: tuple[str, ...]) -> str:
    widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*r) for r in [columns, *rows])


def md_table(rows: list[tuple[str, ...]], columns: tuple[str, ...]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


RULE = (f"band = the p99 of the measured noise: a request or run fails when more of its"
        f" positions are over it than {100 * BAND_RATE:g} % per position would give with"
        f" probability {ALPHA:g}; limit = {LIMIT_MARGIN:g} x the largest measured"
        f" ({LIMIT_MARGIN ** 2:g} x for the KL metrics, second order in the error): no position"
        " may exceed it. kl_topk is the lower bound of KL(fp32 || reduced) the distribution"
        " check computes from both top-k tables.")


def _resolve(value: str, cache_dir: Path) -> Any:
    # deferred: a heavy import, paid only where this runs
    from harness.scenario.catalog import ModelCatalog
    from harness.scenario.model_folder import ModelFolderError, check_model_folder

    try:
        model = ModelCatalog(cache_dir).model(value)
        check_model_folder(model.path)
    except (ValueError, ModelFolderError, OSError) as e:
        raise CommandError(f"--model {value}: {e}") from None
    return model


def run(models: list[str], precisions: list[str], cache_dir: Path, reports_dir: Path,
        force: bool = False, attn_scale: float | None = None) -> str:
    """Calibrate every model in every precision; print the tables; return the markdown."""
    md = ["# Reduced-precision calibration", "", RULE, ""]
    for value in models:
        model = _resolve(value, cache_dir)
        for precision in precisions:
            c = calibrate(model.path, model.content_hash, precision, cache_dir, force=force)
            for note in c.bad:
                print(f"hil calibrate: damaged calibration entry {note}", file=sys.stderr)
            head = heading(model.label, c)
            print(f"{head}\n{text_table(calibration_rows(c), COLUMNS)}\n")
            md += [f"## {model.label} {precision}", "", head + ".", "",
                   md_table(calibration_rows(c), COLUMNS), ""]
            if attn_scale is not None:
                start = time.monotonic()
                m = measure(model.path, model.content_hash, precision, cache_dir,
                            attn_scale=attn_scale)
                rows = fault_rows(judge_measurement(m, c.thresholds))
                what = (f"fault: attention scale x{attn_scale:g} in {precision}, judged by the"
                        f" thresholds above ({time.monotonic() - start:.1f} s)")
                print(f"{what}\n{text_table(rows, FAULT_COLUMNS)}\n")
                md += [what + ".", "", md_table(rows, FAULT_COLUMNS), ""]
    reports_dir.mkdir(parents=True, exist_ok=True)
    text = "\n".join(md)
    (reports_dir / "calibration.md").write_text(text, encoding="utf-8")
    return text


def calibrate_command(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    precisions = _list(args.precision, PRECISIONS)
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        print(f"hil calibrate: --precision {','.join(unknown)}: unknown; choose from"
              f" {','.join(PRECISIONS)}", file=sys.stderr)
        return 2
    if args.attn_scale is not None and not 0 < args.attn_scale < math.inf:
        print(f"hil calibrate: --attn-scale {args.attn_scale:g}: must be a positive factor"
              " (1.08 is an 8 % error)", file=sys.stderr)
        return 2
    reports = Path(args.reports_dir)
    try:
        # Published when every model was calibrated: a refusal or a stop (hil's one line
        # says what was kept) leaves the earlier calibration.md as it was.
        with StagedReport(reports, "calibrate", "calibration.md") as out:
            run(_list(args.model, DEFAULT_MODELS), precisions, Path(args.cache_dir),
                out.staging, force=args.force, attn_scale=args.attn_scale)
            out.complete()
    except CommandError as e:
        print(f"hil calibrate: {e}", file=sys.stderr)
        return 2
    print(f"written: {reports / 'calibration.md'}")
    return 0


def add_calibrate_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``hil calibrate`` sub-command."""
    p = subparsers.add_parser("calibrate", help="measure reduced-precision noise per model and"
                              " precision; print and store the thresholds")
    p.add_argument("--model", action="append", default=[], metavar="NAME|FOLDER",
                   help="tiny-model name or model folder; repeatable or comma-separated"
                   f" (default {','.join(DEFAULT_MODELS)})")
    p.add_argument("--precision", action="append", default=[], metavar="P[,P]",
                   help=f"{','.join(PRECISIONS)} (default both)")
    # --cache-dir and --reports-dir are the options hil shares with pytest (harness/cli.py
    # adds them from their declarations, with HIL_CACHE_DIR and HIL_REPORTS_DIR).
    p.add_argument("--force", action="store_true", help="measure again even when cached")
    p.add_argument("--attn-scale", type=float, default=None, metavar="F",
                   help="also measure with every attention scale times F (1.08: an 8 %% error)"
                   " and say whether the thresholds catch it")
    p.set_defaults(func=calibrate_command)
    return p
