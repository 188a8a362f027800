"""Tests for the offline tiny-model builder in fixtures.models."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.model_stats import model_exposure
from fixtures import model_hash, models
from fixtures.models import MODEL_SPECS, build_model, model_content_hash, resolve_model
from harness.checks.exposure import Exposure

NAMES = list(MODEL_SPECS)
SENTENCE = "On 2024-03-17 at 07:45, rack 9 logged 412 tests (409 PASS, 3 FAIL); see ticket #88!"
# Far enough in the past that the memo trusts these stamps.
OLD_NS = 1_600_000_000 * 10**9


def _age_files(folder: Path) -> None:
    for i, p in enumerate(sorted(folder.rglob("*"))):
        if p.is_file():
            os.utime(p, ns=(OLD_NS + i, OLD_NS + i))


@pytest.fixture(scope="module")
def cache_dir() -> Path:
    # The suites' own cache: a trained build costs CPU time, so it is made once and shared.
    return Path(os.environ.get("HIL_CACHE_DIR", str(models.DEFAULT_CACHE_DIR)))


@pytest.fixture(scope="module")
def built(cache_dir: Path) -> dict[str, Path]:
    return {name: build_model(name, cache_dir) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_build_loads_and_generates(built: dict[str, Path], cache_dir: Path, name: str) -> None:
    folder = built[name]
    assert folder.parent == cache_dir / "models"
    assert folder.name == f"{name}-{models.build_key(MODEL_SPECS[name])[:12]}"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in folder.iterdir()
    }

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.config.model_type == MODEL_SPECS[name].architecture
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.config.vocab_size == len(tokenizer) == models.TOKENIZER_VOCAB_SIZE
    assert (model.config.pad_token_id, model.config.bos_token_id, model.config.eos_token_id) == (
        0,
        1,
        2,
    )

    inputs = tokenizer("The weather on the hill was", return_tensors="pt")
    assert set(inputs) == {"input_ids", "attention_mask"}
    prompt_len = inputs["input_ids"].shape[1]
    outputs = [
        model.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)[
            0, prompt_len:
        ].tolist()
        for _ in range(2)
    ]
    assert len(outputs[0]) == 8
    assert outputs[0] == outputs[1]


def test_granite_config_values(built: dict[str, Path]) -> None:
    config = json.loads((built["tiny-granite"] / "config.json").read_text())
    assert config["embedding_multiplier"] == 12.0
    assert config["residual_multiplier"] == 0.22
    assert config["attention_multiplier"] == 0.0078125
    assert config["logits_scaling"] == 8.0
    for key, value in {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    }.items():
        assert config[key] == value, key


def test_tokenizer_round_trip_and_special_ids(built: dict[str, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(built["tiny-llama"])
    assert tokenizer.convert_tokens_to_ids(["<pad>", "<s>", "</s>", "<unk>"]) == [0, 1, 2, 3]
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == (
        "<pad>",
        "<s>",
        "</s>",
        "<unk>",
    )
    assert tokenizer.model_max_length == 2048

    ids = tokenizer(SENTENCE)["input_ids"]
    assert tokenizer.bos_token_id not in ids
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == SENTENCE
    printable = "".join(chr(c) for c in range(32, 127)) + "\n\t"
    assert tokenizer.decode(tokenizer(printable)["input_ids"]) == printable


def test_build_leaves_torch_settings_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "MODEL_SPECS", {
        "tiny-llama": dataclasses.replace(MODEL_SPECS["tiny-llama"], train_steps=2)})
    torch.set_num_threads(2)
    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
              torch.get_default_dtype(), torch.random.get_rng_state())
    build_model("tiny-llama", tmp_path)
    after = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
             torch.get_default_dtype(), torch.random.get_rng_state())
    assert after[:3] == before[:3]
    assert torch.equal(after[3], before[3])


@pytest.fixture(scope="module")
def exposures(built: dict[str, Path]) -> dict[str, Exposure]:
    return {name: model_exposure(folder, name) for name, folder in built.items()}


@pytest.mark.parametrize("name", NAMES)
def test_models_are_confident_where_the_suites_compare(
    exposures: dict[str, Exposure], name: str
) -> None:
    """Token equality means something only where the reference is sure: measured over the
    reference's greedy positions of the token-equality prompts and the KV suites' scenarios."""
    e = exposures[name]
    assert e.positions > 1000, e.line()
    assert e.median_top1 >= 0.5, e.line()
    assert e.share <= 0.05, e.line()
    assert e.warning() is None, e.warning()


def test_untrained_model_is_flagged_as_flat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same measurement on random weights (the old fixtures) fails the targets."""
    monkeypatch.setattr(models, "MODEL_SPECS", {"tiny-llama": dataclasses.replace(
        MODEL_SPECS["tiny-llama"], train_steps=0, logit_gain=1.0, initializer_range=0.2)})
    e = model_exposure(build_model("tiny-llama", tmp_path), "random-llama")
    assert e.share > 0.05 and e.median_top1 < 0.5, e.line()
    assert e.warning() is not None


def test_second_build_reuses_folder(
    built: dict[str, Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = built["tiny-llama"]
    before = {p.name: p.stat().st_mtime_ns for p in [folder, *folder.iterdir()]}

    def no_rebuild(*args: object, **kwargs: object) -> None:
        raise AssertionError("folder was rebuilt")

    monkeypatch.setattr(models, "write_model", no_rebuild)
    assert build_model("tiny-llama", cache_dir) == folder
    assert {p.name: p.stat().st_mtime_ns for p in [folder, *folder.iterdir()]} == before


def test_concurrent_builds_make_one_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_write = models.write_model

    def counting_write(spec: models.ModelSpec, out_dir: Path) -> None:
        calls.append(spec.name)
        real_write(spec, out_dir)

    monkeypatch.setattr(models, "write_model", counting_write)
    # Untrained: this test is about the lock and the temporary folder, not the weights.
    monkeypatch.setattr(models, "MODEL_SPECS", {
        "tiny-llama": dataclasses.replace(MODEL_SPECS["tiny-llama"], train_steps=0)})
    final = models.model_dir_for("tiny-llama", tmp_path)
    final.parent.mkdir(parents=True)
    stale = final.parent / f".{final.name}.tmp-crashed"
    stale.mkdir()

    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(build_model("tiny-llama", tmp_path)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results == [final, final]
    assert calls == ["tiny-llama"]
    assert not stale.exists()
    assert [p.name for p in final.parent.iterdir() if not p.name.endswith(".lock")] == [final.name]


def test_unknown_name_is_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tiny-llama, tiny-granite") as excinfo:
        build_model("tiny-gpt", tmp_path)
    assert not isinstance(excinfo.value, KeyError)


def test_content_hash_tracks_bytes_and_ignores_location(
    built: dict[str, Path], tmp_path: Path
) -> None:
    folder = built["tiny-llama"]
    copy = Path(shutil.copytree(folder, tmp_path / "copy"))
    original = model_content_hash(folder)
    assert len(original) == 64
    assert model_content_hash(copy) == original

    (copy / ".lock").write_text("hidden files do not count")
    assert model_content_hash(copy) == original

    config = copy / "config.json"
    data = bytearray(config.read_bytes())
    data[-2] ^= 0x01
    config.write_bytes(bytes(data))
    assert model_content_hash(copy) != original


def test_content_hash_memo(
    built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = Path(shutil.copytree(built["tiny-granite"], tmp_path / "model"))
    for p in folder.iterdir():
        os.utime(p)  # fresh, as if just written (copytree kept the cached build's stamps)
    memo_dir = tmp_path / "memo"
    # the hashed files: the hidden build manifest is no part of the content hash
    listing = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))

    # Freshly written files are not memoised: a same-tick rewrite would keep size and mtime.
    fresh = model_content_hash(folder, memo_dir)
    assert not (memo_dir / model_hash.MEMO_FILE).exists()

    _age_files(folder)
    assert model_content_hash(folder, memo_dir) == fresh
    memo = json.loads((memo_dir / model_hash.MEMO_FILE).read_text())
    assert len(memo["entries"]) == len(listing)
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == listing

    hashed: list[str] = []
    real_sha = model_hash.file_sha256

    def counting_sha(path: Path) -> str:
        hashed.append(path.name)
        return real_sha(path)

    monkeypatch.setattr(model_hash, "file_sha256", counting_sha)
    assert model_content_hash(folder, memo_dir) == fresh
    assert hashed == []

    weights = folder / "model.safetensors"
    stat = weights.stat()
    with open(weights, "r+b") as handle:
        handle.seek(stat.st_size - 1)
        last = handle.read(1)
        handle.seek(stat.st_size - 1)
        handle.write(bytes([last[0] ^ 0xFF]))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1000))
    changed = model_content_hash(folder, memo_dir)
    assert hashed == ["model.safetensors"]
    assert changed != fresh
    assert changed == model_content_hash(folder)


def test_resolve_model_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ValueError) as excinfo:
        resolve_model(str(missing), tmp_path)
    assert str(excinfo.value) == (
        f"model folder not found: {missing}; pass --model with a local model folder "
        "(containing config.json) or one of: tiny-llama, tiny-granite"
    )

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="config.json") as excinfo:
        resolve_model(str(empty), tmp_path)
    assert str(empty) in str(excinfo.value)
    assert "not found" not in str(excinfo.value)

    a_file = tmp_path / "weights.bin"
    a_file.write_bytes(b"\0")
    with pytest.raises(ValueError, match="not a folder"):
        resolve_model(str(a_file), tmp_path)


def test_resolve_model_accepts_names_and_folders(built: dict[str, Path], cache_dir: Path) -> None:
    assert resolve_model("tiny-granite", cache_dir) == built["tiny-granite"]
    assert resolve_model(str(built["tiny-llama"]), cache_dir) == built["tiny-llama"].resolve()


def test_main_prints_folder(
    built: dict[str, Path], cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert models.main(["tiny-llama", "--cache-dir", str(cache_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(built["tiny-llama"])
