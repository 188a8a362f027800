"""The tokenizer's answers kept on disk: the real tokenizer's, reused only for the same model
folder and tokenizer stack, and no transformers import where every answer is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from fixtures import models
from fixtures.models import build_model, model_content_hash
from harness.core.paths import REPO_ROOT
from harness.scenario import token_cache
from harness.scenario.token_cache import CachedTokenizer

TEXTS = ["On 2024-03-17 rack 9 logged 412 tests (409 PASS, 3 FAIL)!", "", "  spaces\tand\nlines "]


@pytest.fixture(scope="module")
def folder() -> Path:
    cache = Path(os.environ.get("HIL_CACHE_DIR", str(models.DEFAULT_CACHE_DIR)))
    return build_model("tiny-llama", cache)


def test_answers_are_the_real_tokenizers_and_come_from_disk_the_second_time(folder, tmp_path):
    real = AutoTokenizer.from_pretrained(str(folder))
    digest = model_content_hash(folder)
    first = CachedTokenizer(folder, digest, tmp_path)
    for text in TEXTS:
        for special in (True, False):
            assert first.encode(text, add_special_tokens=special) == real.encode(
                text, add_special_tokens=special)
    ids = real.encode(TEXTS[0], add_special_tokens=False)
    assert first.decode(ids) == real.decode(ids)
    assert first.loaded

    again = CachedTokenizer(folder, digest, tmp_path)
    assert again.encode(TEXTS[0], add_special_tokens=False) == ids
    assert again.decode(ids) == real.decode(ids)
    assert not again.loaded  # every answer was on disk
    assert again.vocab_size == real.vocab_size  # anything else is the real tokenizer's
    assert again.loaded


def test_another_model_or_stack_does_not_reuse_the_answers(folder, tmp_path, monkeypatch):
    digest = model_content_hash(folder)
    kept = CachedTokenizer(folder, digest, tmp_path)
    kept.encode(TEXTS[0])
    # A wrong answer planted in the file is served for this model and stack only.
    data = json.loads(kept.file.read_text())
    data = {k: [7, 7, 7] for k in data}
    kept.file.write_text(json.dumps(data))
    assert CachedTokenizer(folder, digest, tmp_path).encode(TEXTS[0]) == [7, 7, 7]
    other_model = CachedTokenizer(folder, "0" * 64, tmp_path)
    assert other_model.encode(TEXTS[0]) != [7, 7, 7] and other_model.loaded
    monkeypatch.setattr(token_cache, "tokenizer_stack",
                        lambda: {"format": "1", "transformers": "0.0", "tokenizers": "0.0"})
    other_stack = CachedTokenizer(folder, digest, tmp_path)
    assert other_stack.file != kept.file
    assert other_stack.encode(TEXTS[0]) != [7, 7, 7] and other_stack.loaded


def test_a_damaged_file_is_recomputed_and_an_unwritable_cache_costs_time_only(folder, tmp_path):
    digest = model_content_hash(folder)
    tok = CachedTokenizer(folder, digest, tmp_path)
    expected = tok.encode(TEXTS[0])
    tok.file.write_text("{not json")
    assert CachedTokenizer(folder, digest, tmp_path).encode(TEXTS[0]) == expected
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    assert CachedTokenizer(folder, digest, blocked).encode(TEXTS[0]) == expected


def test_a_session_with_every_prompt_tokenized_before_imports_no_transformers(folder, tmp_path):
    code = (
        "import sys\n"
        "from harness.scenario.catalog import ModelCatalog\n"
        "from harness.reference.runner import reference_stack\n"
        f"cat = ModelCatalog(__import__('pathlib').Path({str(tmp_path)!r}))\n"
        "m = cat.model('tiny-llama')\n"
        "sc = cat.scenario('token_equality', 'pair', m)\n"
        "reference_stack()\n"
        "print(len(sc.requests), 'transformers' in sys.modules, 'torch' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / folder.name).symlink_to(folder)
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           cwd=REPO_ROOT, check=True)
    assert first.stdout.split()[1] == "True"  # tokenized for the first time
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                            cwd=REPO_ROOT, check=True)
    assert second.stdout.split() == [first.stdout.split()[0], "False", "False"], second.stderr
