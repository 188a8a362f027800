"""The model folder check names the file at fault (a truncated or corrupt safetensors
file, a bad config.json, a missing shard) and passes the real checkpoints."""

import json
import os
import struct
from pathlib import Path

import pytest

from harness.core.paths import REPO_ROOT
from harness.scenario.model_folder import ModelFolderError, check_model_folder
from tests.bad_input import model_folder

ROOT = REPO_ROOT


def test_model_folder_checks_name_the_file(tmp_path):
    check_model_folder(model_folder(tmp_path))  # a sound folder passes
    m = model_folder(tmp_path, truncate=10)
    with pytest.raises(ModelFolderError) as e:
        check_model_folder(m)
    assert str(e.value).startswith(f"{m / 'model.safetensors'}: the header describes")
    (m / "model.safetensors").write_bytes(b"\x05\x00")
    with pytest.raises(ModelFolderError, match="too short for a safetensors file"):
        check_model_folder(m)
    (m / "model.safetensors").write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(ModelFolderError, match="header of 1000000 bytes does not fit"):
        check_model_folder(m)
    m = model_folder(tmp_path, config="[1, 2]")
    with pytest.raises(ModelFolderError, match=r"config\.json: has no \"model_type\" string"):
        check_model_folder(m)
    m = model_folder(tmp_path, config='{"model_type": "llama"')
    with pytest.raises(ModelFolderError, match=r"config\.json: not valid JSON \(.* at line 1"):
        check_model_folder(m)
    m = model_folder(tmp_path)
    (m / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "shard-2.safetensors"}}))
    with pytest.raises(ModelFolderError, match="names shard-2.safetensors, which is not in the folder"):
        check_model_folder(m)


def test_built_models_pass_the_folder_check():
    """No false alarm on the real checkpoints (built once into the project cache)."""
    from fixtures.models import MODEL_SPECS, build_model

    cache = Path(os.environ.get("HIL_CACHE_DIR", ROOT / ".hil-cache"))
    for name in MODEL_SPECS:
        check_model_folder(build_model(name, cache))
