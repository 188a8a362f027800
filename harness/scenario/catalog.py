"""Models and prompt sets a session resolves: tiny models built on demand or local folders."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.scenario.prompts import PromptSet, Scenario


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

    def model(self, value: str) -> Model:
        """Resolve ``tiny-llama``/``tiny-granite`` (built on demand) or a local folder."""
        if value not in self._models:
            # deferred: a heavy import, paid only where this runs
            from transformers import AutoTokenizer

            # deferred: a heavy import, paid only where this runs
            from fixtures.models import model_content_hash, resolve_model

            path = resolve_model(value, self.cache_dir)
            digest = model_content_hash(path, memo_dir=self.cache_dir / "model-hash")
            tok = AutoTokenizer.from_pretrained(str(path))
            label = value if os.sep not in value else path.name
            self._models[value] = Model(label=label, path=path, content_hash=digest, tokenizer=tok)
        return self._models[value]

    @staticmethod
    def scenario(prompt_set: str | PromptSet, case: str, model: Model) -> Scenario:
        ps = prompt_set if isinstance(prompt_set, PromptSet) else PromptSet.load(prompt_set)
        return ps.scenario(case, model.tokenizer)
