"""The cache heals: a tiny-model folder is checked against the manifest it was built with
before use, rebuilt when damaged (saying which folder and what was wrong), and a local folder
is refused, never rebuilt. One untrained build per module (the files and their layout are
those of a trained one; training is not what is tested), copied into a fresh cache per case."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures import model_hash, models
from fixtures.model_hash import MANIFEST_FILE, manifest_problems, model_content_hash
from harness.scenario.model_folder import ModelFolderError, check_model_folder

NAME = "tiny-llama"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A sound build's cache folder (the models/ folder's parent), built once per module."""
    patch = pytest.MonkeyPatch()
    patch.setattr(models, "MODEL_SPECS", {
        NAME: dataclasses.replace(models.MODEL_SPECS[NAME], train_steps=0)})
    cache = tmp_path_factory.mktemp("pristine-cache")
    assert models.ensure_model(NAME, cache).state == "built"
    yield cache
    patch.undo()


@pytest.fixture
def cache(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "cache"))


def _folder(cache: Path) -> Path:
    return models.model_dir_for(NAME, cache)


def _key() -> str:
    return models.build_key(models.MODEL_SPECS[NAME])


def _truncate(folder: Path) -> None:
    weights = folder / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 1000)


def _flip(rel: str, at: int) -> Callable[[Path], None]:
    def flip(folder: Path) -> None:
        with open(folder / rel, "r+b") as handle:
            handle.seek(at)
            byte = handle.read(1)
            handle.seek(at)
            handle.write(bytes([byte[0] ^ 0xFF]))
    return flip


def _empty(folder: Path) -> None:
    for child in folder.iterdir():
        child.unlink()


def _same_size_tokenizer(folder: Path) -> None:
    path = folder / "tokenizer.json"
    path.write_bytes(b" " * path.stat().st_size)


def _header_length(folder: Path) -> None:
    # Same size, another header length: the file's first 8 bytes are its header length.
    path = folder / "model.safetensors"
    with open(path, "r+b") as handle:
        declared = int.from_bytes(handle.read(8), "little")
        handle.seek(0)
        handle.write((declared + 8).to_bytes(8, "little"))


DAMAGE = {
    "truncated-safetensors": (_truncate, "model.safetensors: 3280576 bytes, built with 3281576"
                                         " (cut short)"),
    "no-tokenizer": (lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json is missing"),
    "empty-folder": (_empty, "the folder is empty"),
    "flipped-weight-byte": (_flip("model.safetensors", 3_000_000), "model.safetensors: same size,"
                                                                    " other bytes"),
    "flipped-config-byte": (_flip("config.json", 5), "config.json: same size, other bytes"),
    "tokenizer-replaced-same-size": (_same_size_tokenizer, "tokenizer.json: same size, other"
                                                           " bytes"),
    "safetensors-header-length": (_header_length, "model.safetensors: its safetensors header"
                                                  " length is not the 2208 bytes"),
    "no-manifest": (lambda f: (f / MANIFEST_FILE).unlink(), "no build manifest"),
    "extra-file": (lambda f: (f / "pytorch_model.bin").write_bytes(b"x"),
                   "pytorch_model.bin: not part of the build"),
}


def test_a_sound_folder_verifies_without_rebuilding(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_build(*args: object) -> None:
        raise AssertionError("a sound folder was rebuilt")

    monkeypatch.setattr(models, "write_model", no_build)
    assert manifest_problems(_folder(cache), _key()) == []
    assert models.ensure_model(NAME, cache) == models.CachedModel(NAME, _folder(cache),
                                                                    "verified")
    # The manifest is hidden: the content hash (the reference cache's key) is what it records.
    assert model_content_hash(_folder(cache)) == model_hash.manifest_model_hash(_folder(cache))


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_folder_is_named_and_rebuilt(cache: Path, pristine: Path, damage: str) -> None:
    damage_folder, said = DAMAGE[damage]
    folder = _folder(cache)
    sound_hash = model_content_hash(_folder(pristine))
    damage_folder(folder)
    problems = manifest_problems(folder, _key())
    assert any(said in p for p in problems), problems

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert models.build_model(NAME, cache) == folder
    assert [str(w.message) for w in caught if w.category is models.ModelRebuiltWarning] == [
        f"model folder {folder} was damaged ({'; '.join(problems)}); rebuilt it"]
    assert manifest_problems(folder, _key()) == []
    assert model_content_hash(folder) == sound_hash
    # Nothing set aside or half-built is left beside it.
    assert sorted(p.name for p in folder.parent.iterdir()) == [f".{folder.name}.lock",
                                                               folder.name]


def test_a_folder_built_for_another_key_is_rebuilt(cache: Path) -> None:
    folder = _folder(cache)
    assert manifest_problems(folder, "0" * 64) == [f"built for key {_key()[:12]}, expected"
                                                   " 000000000000"]


def test_a_crash_mid_build_leaves_no_folder_that_verifies(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(cache)
    shutil.rmtree(folder)
    real_write = models.write_model

    def crash(spec: models.ModelSpec, out_dir: Path) -> None:
        real_write(spec, out_dir)
        raise KeyboardInterrupt  # after the files, before the manifest and the rename

    monkeypatch.setattr(models, "write_model", crash)
    with pytest.raises(KeyboardInterrupt):
        models.ensure_model(NAME, cache)
    assert not folder.exists()
    assert [p.name for p in folder.parent.iterdir()] == [f".{folder.name}.lock"]
    # A build killed outright leaves its temporary folder: it has no manifest, so even renamed
    # into place by hand it would not verify; the next build clears it away.
    stale = folder.parent / f".{folder.name}.tmp-killed"
    stale.mkdir()
    real_write(models.MODEL_SPECS[NAME], stale)
    assert manifest_problems(stale, _key())[0].startswith("no build manifest")
    monkeypatch.setattr(models, "write_model", real_write)
    assert models.ensure_model(NAME, cache).state == "built"
    assert not stale.exists()


def test_the_catalog_says_once_which_folder_it_rebuilt(cache: Path) -> None:
    from harness.scenario.catalog import ModelCatalog

    folder = _folder(cache)
    (folder / "tokenizer.json").unlink()
    catalog = ModelCatalog(cache)
    with pytest.warns(models.ModelRebuiltWarning, match="tokenizer.json is missing"):
        model = catalog.model(NAME)
    assert model.path == folder
    assert catalog.rebuilt == [f"model folder {folder} was damaged (tokenizer.json is missing);"
                               " rebuilt it"]
    assert model.content_hash == model_hash.manifest_model_hash(folder)


def test_hil_models_reports_what_it_verified(
        cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli import cmd_models

    folder = _folder(cache)
    args = argparse.Namespace(names=[NAME], cache_dir=str(cache))
    _truncate(folder)
    assert cmd_models(args, []) == 0
    assert capsys.readouterr().out == (f"{NAME} rebuilt (was damaged: model.safetensors: 3280576"
                                       f" bytes, built with 3281576 (cut short)) {folder}\n")
    assert cmd_models(args, []) == 0
    assert capsys.readouterr().out == f"{NAME} verified {folder}\n"
    shutil.rmtree(folder)
    assert cmd_models(args, []) == 0
    assert capsys.readouterr().out == f"{NAME} built {folder}\n"


def test_hil_models_reports_a_folder_it_could_not_rebuild_as_damaged(
        cache: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.cli import cmd_models

    def disk_full(spec: models.ModelSpec, out_dir: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(models, "write_model", disk_full)
    folder = _folder(cache)
    (folder / "tokenizer.json").unlink()
    assert cmd_models(argparse.Namespace(names=[NAME], cache_dir=str(cache)), []) == 1
    assert capsys.readouterr().out == (
        f"{NAME} damaged (tokenizer.json is missing; the rebuild failed: [Errno 28] No space"
        f" left on device) {folder}\n")
    assert cmd_models(argparse.Namespace(names=["tiny-gpt"], cache_dir=str(cache)), []) == 2
    assert "unknown tiny model 'tiny-gpt'; known: tiny-llama" in capsys.readouterr().err


def test_a_local_folder_is_refused_naming_what_is_wrong_never_rebuilt(
        pristine: Path, tmp_path: Path) -> None:
    local = Path(shutil.copytree(_folder(pristine), tmp_path / "my-model"))
    check_model_folder(local)  # a sound copy of a build passes
    (local / "tokenizer.json").write_bytes(b"{}" + (local / "tokenizer.json").read_bytes()[2:])
    with pytest.raises(ModelFolderError) as e:
        check_model_folder(local)
    assert str(e.value).startswith(f"model folder {local} does not match its build manifest:"
                                   " tokenizer.json: same size, other bytes")
    assert models.resolve_model(str(local), tmp_path / "cache") == local  # not rebuilt
    assert not (tmp_path / "cache").exists()

    plain = tmp_path / "plain"  # a checkpoint that is no build of ours: no manifest
    shutil.copytree(_folder(pristine), plain, ignore=shutil.ignore_patterns(MANIFEST_FILE))
    (plain / "tokenizer.json").unlink()
    with pytest.raises(ModelFolderError, match=f"^model folder {plain} has no tokenizer"):
        check_model_folder(plain)
    shutil.copy(_folder(pristine) / "tokenizer.json", plain)
    (plain / "model.safetensors").unlink()
    with pytest.raises(ModelFolderError, match=f"^model folder {plain} has no weights"):
        check_model_folder(plain)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_truncations_and_deletions_are_always_detected(
        pristine: Path, data: st.DataObject) -> None:
    """Whatever files of the manifest are cut short (to any length) or deleted, the folder
    does not verify, and each damaged file is named."""
    sound = _folder(pristine)
    files = sorted(p.name for p in sound.iterdir() if not p.name.startswith("."))
    damaged = data.draw(st.lists(st.sampled_from(files), min_size=1, unique=True), label="files")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(shutil.copytree(sound, Path(tmp) / sound.name))
        for rel in damaged:
            size = (folder / rel).stat().st_size
            cut = data.draw(st.none() | st.integers(0, size - 1), label=f"{rel} cut to")
            if cut is None:
                (folder / rel).unlink()
            else:
                os.truncate(folder / rel, cut)
        problems = manifest_problems(folder, _key())
        assert problems
        for rel in damaged:
            assert any(p.startswith(rel) for p in problems), (rel, problems)
        with pytest.raises(ModelFolderError):
            check_model_folder(folder)
