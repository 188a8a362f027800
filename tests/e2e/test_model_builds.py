"""The offline tiny-model builder (fixtures.models) is reproducible: a fresh build of a model is
byte for byte the cached one. One model is rebuilt (tiny-granite: its architecture has the most
parts beyond Llama's, its multipliers); the builder's training loop is one for all models, and
each further rebuild costs about 45 s of CI."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from fixtures import models
from fixtures.models import MODEL_SPECS, build_model, model_content_hash


def _file_digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def built() -> dict[str, Path]:
    # The suites' own cache, as the unit tests of the builder use it: built once, shared.
    cache_dir = Path(os.environ.get("HIL_CACHE_DIR", str(models.DEFAULT_CACHE_DIR)))
    return {name: build_model(name, cache_dir) for name in MODEL_SPECS}


REBUILT = "tiny-granite"


@pytest.mark.e2e  # builds one model once more (about 45 s of CPU)
def test_two_builds_are_byte_identical(built: dict[str, Path], tmp_path: Path) -> None:
    # A fresh build in this process against the cached one (maybe built by another process,
    # with other thread settings): training must not depend on either.
    torch.set_num_threads(2)
    for name, first in built.items():
        if name != REBUILT:
            continue
        second = build_model(name, tmp_path)
        assert second != first
        assert second.name == first.name
        assert _file_digests(second) == _file_digests(first)
        assert model_content_hash(second) == model_content_hash(first)
