"""A model's tokenizer as the harness uses it (``encode`` and ``decode``), kept on disk by content.

Loading a tokenizer means importing transformers (3-5 s), which every pytest process paid
before its first test although its prompts were tokenized the same way by the previous one.
Here each answer is kept in a file per model content hash and tokenizer stack (the versions
of transformers and tokenizers): a process whose prompts were all tokenized before loads no
tokenizer; a new text, a new model or another stack loads the real one and adds its answers.
The answers are the real tokenizer's, only remembered: a changed model folder or stack is
another file.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FORMAT = 1


def tokenizer_stack() -> dict[str, str]:
    """The versions a tokenizer's answers depend on besides the model folder (read from the
    installed distributions: nothing is imported)."""
    stack = {"format": str(FORMAT)}
    for dist in ("transformers", "tokenizers"):
        try:
            stack[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            stack[dist] = "absent"
    return stack


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


class CachedTokenizer:
    """``encode``/``decode`` of the tokenizer in ``path``, answered from ``cache_dir`` where
    asked before (any other attribute is the real tokenizer's, loaded on first use)."""

    def __init__(self, path: Path, model_hash: str, cache_dir: Path) -> None:
        self.path = Path(path)
        stack = tokenizer_stack()
        self.file = Path(cache_dir) / "tokens" / f"{model_hash[:24]}-{_key(stack)[:12]}.json"
        self._answers: dict[str, Any] | None = None
        self._real: Any = None
        self.loaded = False  # whether the real tokenizer was loaded in this process

    # -- the real tokenizer ------------------------------------------------------------------
    @property
    def real(self) -> Any:
        if self._real is None:
            # deferred: a heavy import, paid only where an answer is not on disk
            from transformers import AutoTokenizer

            self._real = AutoTokenizer.from_pretrained(str(self.path))
            self.loaded = True
        return self._real

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.real, name)

    # -- the answers on disk -----------------------------------------------------------------
    def _load(self) -> dict[str, Any]:
        if self._answers is None:
            self._answers = self._read()
        return self._answers

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _remember(self, key: str, value: Any) -> None:
        answers = self._load()
        answers[key] = value
        merged = {**self._read(), **answers}  # another process's answers are kept too
        tmp = self.file.with_name(f"{self.file.name}.{os.getpid()}.tmp")
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(merged))
            os.replace(tmp, self.file)
        except OSError:  # a cache that cannot be written costs time only
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)

    def _answer(self, key: str, valid: type, compute: Any) -> Any:
        value = self._load().get(key)
        if isinstance(value, valid):
            return value
        value = compute()
        self._remember(key, value)
        return value

    # -- the two calls the harness makes -------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._answer(_key("encode", text, bool(add_special_tokens)), list,
                           lambda: [int(i) for i in self.real.encode(
                               text, add_special_tokens=add_special_tokens)])
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        return self._answer(_key("decode", ids), str, lambda: str(self.real.decode(ids)))
