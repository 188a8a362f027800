"""``hil calibrate``: refusals in one line with exit 2, and the tables it prints and writes
(the measurement replaced by synthetic noise)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fixtures import models
from harness.calibration import store
from harness.calibration.metrics import METRICS
from harness.cli import main
from tests.unit.calibration.test_store import FakeMeasure

CACHE = os.environ.get("HIL_CACHE_DIR", str(models.DEFAULT_CACHE_DIR))


def hil(argv: list[str]) -> int:
    return main(argv)  # the hil command: its shared options come from the declarations


@pytest.mark.parametrize("argv,message", [
    (["--precision", "fp16,fp8"], "hil calibrate: --precision fp8: unknown; choose from fp16,bf16"),
    (["--attn-scale", "0"], "hil calibrate: --attn-scale 0: must be a positive factor"),
    (["--attn-scale", "nan"], "hil calibrate: --attn-scale nan: must be a positive factor"),
    (["--model", "no-such-model"], "hil calibrate: --model no-such-model: model folder not found"),
])
def test_refusals_name_the_option_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             argv: list[str], message: str) -> None:
    rc = hil(["calibrate", "--cache-dir", str(tmp_path), "--reports-dir", str(tmp_path),
              *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(message) and "Traceback" not in err
    assert not (tmp_path / "calibration.md").exists()


def test_tables_printed_and_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeMeasure()
    monkeypatch.setattr(store.measure_mod, "measure", fake)
    folder = models.build_model("tiny-llama", Path(CACHE))  # built once, shared with the suites
    argv = ["calibrate", "--model", str(folder), "--precision", "bf16", "--cache-dir",
            str(tmp_path), "--reports-dir", str(tmp_path)]
    assert hil(argv) == 0 and fake.calls == ["bf16"]
    out = capsys.readouterr().out
    assert f"{folder.name} bf16: 7 positions of 2 sequences, greedy flips 1" in out
    assert "(measured now)" in out
    md = (tmp_path / "calibration.md").read_text()
    assert "| metric | unit | n | p50 | p99 | max | band | limit |" in md
    assert all(f"| {name} |" in md for name in METRICS)
    assert hil(argv) == 0 and fake.calls == ["bf16"]  # the second run reads the cache
    assert "(from the cache)" in capsys.readouterr().out
