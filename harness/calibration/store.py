"""Calibrations in the cache: ``<cache dir>/calibration/<key>.json``, measured once per key.

The key covers what the measured noise depends on: the model's content hash, the precision,
the reference stack (``harness.reference.runner.reference_stack``: torch, transformers and
the reference's own code), the sequences measured (the suites' prompts, as token ids) and
the calibration's own code. A change to any of them is a miss and the model is measured
again. An entry that is not JSON, was stored for other key fields or has the wrong shape is
named in ``Calibration.bad`` and measured again (the reference cache's rules, whose class
this reuses with a flat folder).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.calibration import measure as measure_mod
from harness.calibration import metrics, thresholds, topk_kl
from harness.calibration.measure import Measurement, Sequence, suite_sequences
from harness.calibration.metrics import METRICS
from harness.calibration.thresholds import MetricThreshold, Thresholds
from harness.core.comparison import NEAR_TIE_TOP_K
from harness.reference.cache import ReferenceCache, cache_key
from harness.reference.runner import reference_stack
from harness.scenario.token_cache import CachedTokenizer

FORMAT = 1
# The modules whose code decides a calibration's numbers.
_IMPL_MODULES = (measure_mod, metrics, thresholds, topk_kl)


class CalibrationMissing(LookupError):
    """No calibration stored for a stack that is not this machine's (it cannot measure it)."""


class CalibrationCache(ReferenceCache):
    """The reference cache's entries, locking and verification, one flat folder."""

    def path_for(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def lookup(self, fields: dict[str, Any],
               check: Callable[[dict[str, Any]], str | None]) -> dict[str, Any] | None:
        """The stored value for ``fields``, or None (a damaged entry is noted in ``bad``)."""
        return self._read(self.path_for(cache_key(fields)), fields, check)


def impl_hash() -> str:
    digest = hashlib.sha256()
    for mod in _IMPL_MODULES:
        digest.update(Path(mod.__file__ or "").read_bytes())
    return digest.hexdigest()[:16]


def sequences_hash(sequences: list[Sequence]) -> str:
    blob = repr([(list(s.prompt_token_ids), s.max_tokens) for s in sequences]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def key_fields(model_hash: str, precision: str, stack: dict[str, str],
               sequences: list[Sequence]) -> dict[str, Any]:
    return {"calibration": FORMAT, "model": model_hash, "precision": precision, "stack": stack,
            "sequences": sequences_hash(sequences), "impl": impl_hash()}


def _compact(values: list[float]) -> list[float]:
    """Ascending, four significant digits: the stored distribution."""
    return [float(f"{v:.4g}") for v in sorted(values)]


def summarise(m: Measurement, model_hash: str, stack: dict[str, str]) -> dict[str, Any]:
    """The cache entry's value: each metric's sorted distribution, and the thresholds."""
    flips = int(sum(m.flips))
    th = Thresholds(
        model_hash, m.precision, stack, m.positions, flips / m.positions if m.positions else 0.0,
        {name: MetricThreshold.from_sample(name, m.values[name]) for name in METRICS})
    return {
        "format": FORMAT, "precision": m.precision, "top_k": NEAR_TIE_TOP_K,
        "positions": m.positions, "sequences": m.sequences, "flips": flips,
        "reference_disagreements": m.reference_disagreements, "seconds": round(m.seconds, 3),
        "units": dict(metrics.UNITS),
        "distributions": {name: _compact(m.values[name]) for name in METRICS},
        "thresholds": th.to_dict(),
    }


def entry_problem(value: dict[str, Any], precision: str) -> str | None:
    """Why ``value`` is not a usable calibration of ``precision``, or None."""
    try:
        th = Thresholds.from_dict(value["thresholds"])
        dists = value["distributions"]
        positions = int(value["positions"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return f"wrong shape ({e.__class__.__name__}: {e})"
    if th.precision != precision or value.get("precision") != precision:
        return f"stored for precision {value.get('precision')!r}, not {precision!r}"
    if positions < 1 or set(th.metrics) != set(METRICS) or not isinstance(dists, dict):
        return "no positions measured, or not every metric present"
    for name in METRICS:
        d = dists.get(name)
        if (not isinstance(d, list) or len(d) != positions
                or not all(isinstance(v, int | float) for v in d)):
            return f"distribution of {name} is not {positions} numbers"
        if any(math.isnan(x) for x in d) or d != sorted(d):
            return f"distribution of {name} is not sorted or holds NaN"
    return None


@dataclass
class Calibration:
    """One stored calibration, whether it was measured now, and damaged entries replaced."""

    value: dict[str, Any]
    thresholds: Thresholds
    path: Path
    measured: bool
    bad: list[str] = field(default_factory=list)


def calibrate(
    model_path: Path, model_hash: str, precision: str, cache_dir: Path, *,
    force: bool = False, sequences: list[Sequence] | None = None,
    measure_fn: Callable[..., Measurement] | None = None,
) -> Calibration:
    """The calibration of a model in ``precision`` on this machine's reference stack: from
    the cache, else measured (``force``: measured again) and stored."""
    measure_mod.torch_dtype(precision)  # an unknown precision is refused before any work
    if sequences is None:
        sequences = suite_sequences(CachedTokenizer(model_path, model_hash, cache_dir))
    stack = reference_stack()
    fields = key_fields(model_hash, precision, stack, sequences)
    cache = CalibrationCache(Path(cache_dir) / "calibration")
    path = cache.path_for(cache_key(fields))
    if force:
        path.unlink(missing_ok=True)

    def compute() -> dict[str, Any]:
        run = measure_fn or measure_mod.measure
        m = run(model_path, model_hash, precision, cache_dir, sequences=sequences)
        return summarise(m, model_hash, stack)

    value = cache.get_or_compute(fields, compute, check=lambda v: entry_problem(v, precision))
    return Calibration(value, Thresholds.from_dict(value["thresholds"]), path,
                       measured=cache.misses > 0, bad=list(cache.bad))


def calibrated_thresholds(
    model_path: Path, model_hash: str, precision: str, cache_dir: Path,
    stack: dict[str, str] | None = None, sequences: list[Sequence] | None = None,
) -> Thresholds:
    """The thresholds of a model in ``precision``: what the card and half-precision targets
    judge a run by. Measured on demand for this machine's stack; for another ``stack`` only
    a stored calibration serves (CalibrationMissing otherwise)."""
    if stack is None or stack == reference_stack():
        return calibrate(model_path, model_hash, precision, cache_dir,
                         sequences=sequences).thresholds
    if sequences is None:
        sequences = suite_sequences(CachedTokenizer(model_path, model_hash, cache_dir))
    fields = key_fields(model_hash, precision, stack, sequences)
    cache = CalibrationCache(Path(cache_dir) / "calibration")
    value = cache.lookup(fields, lambda v: entry_problem(v, precision))
    if value is None:
        why = f" ({cache.bad[0]})" if cache.bad else ""
        raise CalibrationMissing(
            f"no calibration of model {model_hash[:12]} in {precision} for stack {stack}{why};"
            " run `hil calibrate` on a machine with that stack")
    return Thresholds.from_dict(value["thresholds"])
