"""Bad input for the tests of docs/bad-input.md: an engine config, an earlier run's
results, and input files (an inventory, a model folder)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from harness.core.config import EngineConfig
from harness.core.settings import SettingError, env_value


def cfg(**kw):
    base = dict(target="vllm-cpu", model="/m", max_model_len=256, max_num_seqs=4)
    base.update(kw)
    return EngineConfig(**base)


def env_refuses(name: str, raw: str) -> bool:
    """The settings layer refuses ``raw`` as variable ``name``'s value."""
    try:
        env_value(name, {name: raw})
    except SettingError:
        return True
    return False


# ------------------------------------------------------------------ earlier results


def earlier_run(reports: Path) -> dict[Path, bytes]:
    """A finished earlier run's files (results, summary, report, stats, device records)."""
    files = {
        reports / "allure-results" / "old-result.json": b'{"name": "earlier"}',
        reports / "allure-results" / "environment.properties": b"stack=default\n",
        reports / "summary.md": b"# earlier summary\n",
        reports / "allure-report" / "index.html": b"<html>earlier</html>",
        reports / "allure-report" / "history" / "history-trend.json": b"[{}, {}]",
        reports / "stats" / "main.json": b"{}",
        reports / "devices" / "card0.broken.json": b'{"error": "earlier"}',
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def assert_nothing_lost(files: dict[Path, bytes]) -> None:
    for path, data in files.items():
        assert path.is_file() and path.read_bytes() == data, f"{path} was changed or removed"


# ------------------------------------------------------------------ input files


def write(tmp_path: Path, name: str, body: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(body.encode() if isinstance(body, str) else body)
    return p


def safetensors_bytes(tensors: dict[str, int]) -> bytes:
    """A minimal valid safetensors file of float32 vectors ``name -> length``."""
    header, offset = {}, 0
    for name, n in tensors.items():
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + b"\0" * offset


def model_folder(tmp_path: Path, config: str | None = None, truncate: int = 0) -> Path:
    m = tmp_path / "model"
    m.mkdir(exist_ok=True)
    (m / "config.json").write_text(config if config is not None else '{"model_type": "llama"}')
    data = safetensors_bytes({"w": 16, "b": 4})
    (m / "model.safetensors").write_bytes(data[: len(data) - truncate])
    (m / "tokenizer.json").write_text('{"version": "1.0"}')  # a sound folder has a tokenizer
    return m


INV = '[[device]]\nid = "card0"\nkind = "spyre"\nbackend = "eager"\n'
