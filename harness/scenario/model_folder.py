"""A local ``--model`` folder checked before any engine or reference loads it.

Reads only what is cheap: config.json, each safetensors file's header and size, a sharded
checkpoint's index, whether weights and a tokenizer are there, and a tiny-model build's
manifest when the folder carries one, so a truncated download or a corrupt config gives one line
naming the file instead of a long traceback from deep inside a loader.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

MAX_HEADER = 100 * 1024 * 1024  # safetensors refuses larger headers too


class ModelFolderError(ValueError):
    """A model folder that cannot load; the message names the file and what to do."""


def _check_config(path: Path) -> None:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ModelFolderError(f"{path}: not UTF-8 text (byte at offset {e.start}); replace the"
                               " file with the checkpoint's config.json") from None
    except json.JSONDecodeError as e:
        raise ModelFolderError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column"
                               f" {e.colno}); replace the file with the checkpoint's config.json"
                               ) from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise ModelFolderError(f"{path}: has no \"model_type\" string (seen:"
                               f" {type(data).__name__}); replace it with the checkpoint's"
                               " config.json")


def check_config_file(path: Path) -> None:
    """Raise ModelFolderError naming ``path`` unless it is a checkpoint's config.json: UTF-8
    JSON, an object with a ``model_type`` string."""
    _check_config(path)


def _check_safetensors(path: Path) -> None:
    size = path.stat().st_size
    hint = "the file is damaged or was cut short; copy or download it again"
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelFolderError(f"{path}: {size} bytes, too short for a safetensors file; {hint}")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise ModelFolderError(f"{path}: header of {n} bytes does not fit in the file's"
                                   f" {size} bytes; {hint}")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ModelFolderError(f"{path}: the safetensors header is not valid JSON; {hint}"
                                   ) from None
    if not isinstance(header, dict):
        raise ModelFolderError(f"{path}: the safetensors header is not an object; {hint}")
    end = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        offsets = t.get("data_offsets") if isinstance(t, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) for o in offsets)):
            raise ModelFolderError(f"{path}: tensor {name!r} has no data_offsets; {hint}")
        end = max(end, offsets[1])
    if 8 + n + end != size:
        raise ModelFolderError(f"{path}: the header describes {8 + n + end} bytes, the file has"
                               f" {size}; {hint}")


def check_model_folder(folder: Path) -> None:
    """Raise ModelFolderError for the first file of ``folder`` that cannot load."""
    config = folder / "config.json"
    if not config.is_file():
        raise ModelFolderError(f"model folder has no config.json: {folder}; pass --model a"
                               " Hugging Face checkpoint folder")
    _check_config(config)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            raise ModelFolderError(f"{index}: not a valid safetensors index (needs a"
                                   " \"weight_map\" object); copy it again") from None
        for name in sorted(shards):
            if not (folder / name).is_file():
                raise ModelFolderError(f"{index}: names {name}, which is not in the folder;"
                                       " copy the missing shard")
    for path in sorted(folder.glob("*.safetensors")):
        _check_safetensors(path)
    _check_present(folder)
    _check_manifest(folder)


# Any one of these is a tokenizer AutoTokenizer can load (fast, sentencepiece, BPE or WordPiece).
_TOKENIZER_FILES = ("tokenizer.json", "*.model", "vocab.json", "vocab.txt")
_WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")


def _check_present(folder: Path) -> None:
    """The weights and a tokenizer are there: a copy that left them out is named, not loaded."""
    if not any(any(folder.glob(pattern)) for pattern in _WEIGHT_FILES):
        raise ModelFolderError(f"model folder {folder} has no weights (no *.safetensors or"
                               " pytorch_model.bin file); copy the checkpoint's weight files")
    tokenizers = sorted({p for pattern in _TOKENIZER_FILES for p in folder.glob(pattern)})
    if not tokenizers:
        raise ModelFolderError(f"model folder {folder} has no tokenizer (none of"
                               f" {', '.join(_TOKENIZER_FILES)}); copy the checkpoint's tokenizer"
                               " files")
    if all(p.stat().st_size == 0 for p in tokenizers):
        raise ModelFolderError(f"{tokenizers[0]}: an empty file; copy the checkpoint's tokenizer"
                               " files again")


def _check_manifest(folder: Path) -> None:
    """A folder the tiny-model builder wrote (a cache folder given by path, or a copy of one)
    matches its build manifest; it is not rebuilt here: the cache's own copy is, by name."""
    # deferred: read only for folders that carry a manifest
    from fixtures.model_hash import has_manifest, manifest_problems
    from fixtures.model_specs import MODEL_SPECS

    if not has_manifest(folder):
        return
    problems = manifest_problems(folder)
    if problems:
        raise ModelFolderError(f"model folder {folder} does not match its build manifest:"
                               f" {'; '.join(problems)}; pass the model by name"
                               f" ({', '.join(MODEL_SPECS)}: the cache rebuilds it) or copy the"
                               " folder again")
