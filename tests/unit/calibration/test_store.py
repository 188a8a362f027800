"""The calibration cache: keyed by model, precision, stack and sequences; damaged entries are
named and measured again; thresholds on demand (a fake measurement stands in for the model)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from harness.calibration import store
from harness.calibration.measure import Measurement, Sequence
from harness.calibration.metrics import METRICS
from harness.calibration.store import CalibrationMissing, calibrate, calibrated_thresholds

SEQS = [Sequence("set/a", (1, 2, 3), 4), Sequence("set/b", (4, 5), 3)]
STACK = {"torch": "t", "transformers": "x", "impl": "i"}


class FakeMeasure:
    """Synthetic noise, counted: 7 positions per call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, model_path: Path, model_hash: str, precision: str, cache_dir: Path,
                 sequences: list[Sequence] | None = None) -> Measurement:
        self.calls.append(precision)
        rng = random.Random(len(self.calls))
        m = Measurement(precision, lengths=[4, 3], seconds=0.01)
        for name in METRICS:
            m.values[name] = [rng.expovariate(50.0) for _ in range(7)]
        m.flips = [0.0] * 6 + [1.0]
        return m


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeMeasure:
    monkeypatch.setattr(store, "reference_stack", lambda: dict(STACK))
    return FakeMeasure()


def cal(tmp_path: Path, fake: FakeMeasure, precision: str = "bf16", **kw) -> store.Calibration:
    return calibrate(tmp_path / "model", "m" * 64, precision, tmp_path, sequences=SEQS,
                     measure_fn=fake, **kw)


def test_measured_once_then_read_from_the_cache(tmp_path: Path, fake: FakeMeasure) -> None:
    first = cal(tmp_path, fake)
    assert first.measured and first.path.parent == tmp_path / "calibration"
    again = cal(tmp_path, fake)
    assert not again.measured and again.thresholds == first.thresholds
    assert fake.calls == ["bf16"]
    th = first.thresholds
    assert (th.positions, th.flip_rate, th.precision) == (7, pytest.approx(1 / 7), "bf16")
    assert set(th.metrics) == set(METRICS) and th.metrics["kl_topk"].n == 7
    stored = json.loads(first.path.read_text())["value"]
    assert stored["distributions"]["kl_topk"] == sorted(stored["distributions"]["kl_topk"])
    cal(tmp_path, fake, force=True)
    assert fake.calls == ["bf16", "bf16"]


def test_a_changed_precision_stack_or_sequence_set_is_a_miss(
        tmp_path: Path, fake: FakeMeasure, monkeypatch: pytest.MonkeyPatch) -> None:
    base = cal(tmp_path, fake)
    assert cal(tmp_path, fake, "fp16").path != base.path
    monkeypatch.setattr(store, "reference_stack", lambda: {**STACK, "torch": "t2"})
    assert cal(tmp_path, fake).measured
    other = calibrate(tmp_path / "model", "m" * 64, "bf16", tmp_path, measure_fn=fake,
                      sequences=SEQS[:1])
    assert other.measured
    assert fake.calls == ["bf16", "fp16", "bf16", "bf16"]
    assert len(list((tmp_path / "calibration").glob("*.json"))) == 4


def relabel(entry: dict) -> dict:
    entry["value"]["thresholds"]["precision"] = "fp16"
    return entry


@pytest.mark.parametrize("damage,why", [
    (lambda text: text[: len(text) // 2], "unreadable"),
    (lambda text: json.dumps({"key_fields": json.loads(text)["key_fields"], "value": {}}),
     "wrong shape"),
    (lambda text: json.dumps({**json.loads(text), "key_fields": {"model": "other"}}),
     "key fields do not match"),
    (lambda text: json.dumps(relabel(json.loads(text))), "stored for precision"),
])
def test_a_damaged_entry_is_named_and_measured_again(tmp_path: Path, fake: FakeMeasure,
                                                     damage, why: str) -> None:
    first = cal(tmp_path, fake)
    good = first.path.read_text()
    first.path.write_text(damage(good))
    again = cal(tmp_path, fake)
    assert again.measured and len(fake.calls) == 2
    (note,) = again.bad
    assert note.startswith(str(first.path)) and why in note and note.endswith("recomputed")
    assert json.loads(first.path.read_text())["key_fields"] == json.loads(good)["key_fields"]


def test_a_sorted_distribution_is_required(tmp_path: Path, fake: FakeMeasure) -> None:
    first = cal(tmp_path, fake)
    entry = json.loads(first.path.read_text())
    entry["value"]["distributions"]["kl_full"].reverse()
    first.path.write_text(json.dumps(entry))
    assert "not sorted" in cal(tmp_path, fake).bad[0]


def test_thresholds_on_demand_and_for_another_stack(tmp_path: Path, fake: FakeMeasure,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store.measure_mod, "measure", fake)
    th = calibrated_thresholds(tmp_path / "model", "m" * 64, "fp16", tmp_path, sequences=SEQS)
    assert fake.calls == ["fp16"] and th.stack == STACK
    same = calibrated_thresholds(tmp_path / "model", "m" * 64, "fp16", tmp_path, stack=STACK,
                                 sequences=SEQS)
    assert same == th and fake.calls == ["fp16"]
    with pytest.raises(CalibrationMissing, match="no calibration .* fp16 for stack"):
        calibrated_thresholds(tmp_path / "model", "m" * 64, "fp16", tmp_path,
                              stack={**STACK, "torch": "card"}, sequences=SEQS)


def test_an_unknown_precision_is_refused_before_any_work(tmp_path: Path,
                                                         fake: FakeMeasure) -> None:
    with pytest.raises(ValueError, match="unknown precision 'fp8'; known: fp16, bf16"):
        cal(tmp_path, fake, "fp8")
    assert fake.calls == []
