"""Models and prompt sets a session resolves: tiny models built on demand or local folders."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.scenario.prompts import PromptSet, Scenario
from harness.scenario.token_cache import CachedTokenizer


@dataclass
class Model:
    """A resolved model folder with its tokenizer and content hash."""

    label: str
    path: Path
    content_hash: str
    tokenizer: Any

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


class ModelCatalog:
    """Resolves model names once per session (building tiny models into ``cache_dir``)."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self._models: dict[str, Model] = {}
        # One line per tiny model the cache held damaged and this session rebuilt.
        self.rebuilt: list[str] = []

    def _folder(self, value: str) -> Path:
        """A tiny model's cache folder checked against its build manifest (rebuilt, with a
        ModelRebuiltWarning naming the folder and what was wrong, when damaged), or a local
        folder checked as it is (never rebuilt: a damaged one raises ModelFolderError)."""
        # deferred: a heavy import, paid only where this runs
        from fixtures.models import MODEL_SPECS, ModelRebuiltWarning, ensure_model, resolve_model
        from harness.scenario.model_folder import check_model_folder

        if value not in MODEL_SPECS:
            path = resolve_model(value, self.cache_dir)
            check_model_folder(path)
            return path
        cached = ensure_model(value, self.cache_dir)
        if cached.state == "rebuilt":
            line = (f"model folder {cached.path} was damaged ({'; '.join(cached.problems)});"
                    " rebuilt it")
            self.rebuilt.append(line)
            warnings.warn(ModelRebuiltWarning(line), stacklevel=3)
        return cached.path

    def model(self, value: str) -> Model:
        """Resolve ``tiny-llama``/``tiny-granite`` (verified, built or rebuilt on demand) or a
        local folder (checked, never rebuilt)."""
        if value not in self._models:
            # deferred: a heavy import, paid only where this runs
            from fixtures.models import model_content_hash

            path = self._folder(value)
            digest = model_content_hash(path, memo_dir=self.cache_dir / "model-hash")
            # Answers kept by content: transformers is imported only for a text not seen before.
            tok = CachedTokenizer(path, digest, self.cache_dir)
            label = value if os.sep not in value else path.name
            self._models[value] = Model(label=label, path=path, content_hash=digest, tokenizer=tok)
        return self._models[value]

    @staticmethod
    def scenario(prompt_set: str | PromptSet, case: str, model: Model) -> Scenario:
        ps = prompt_set if isinstance(prompt_set, PromptSet) else PromptSet.load(prompt_set)
        return ps.scenario(case, model.tokenizer)
