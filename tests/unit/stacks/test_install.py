"""The installer's data: hashed locks, the default stack's steps, and what a stack may hold."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from harness.stacks import spec as stacks
from harness.stacks.locks import LockError, hashes_from_report, lock_text, read_pins


@pytest.mark.parametrize("name", ["default", "legacy-spyre-0.4"])
def test_every_pin_of_a_lock_carries_its_hash(name: str) -> None:
    stack = stacks.load_stack(name)
    assert stack.lock is not None
    pins = read_pins(stack.lock)
    body = [ln for ln in stack.lock.read_text().splitlines() if ln and not ln.startswith("#")]
    assert len(body) == len(pins) > 10
    for line in body:
        pin, _, digest = line.partition(" --hash=sha256:")
        assert "==" in pin and len(digest) == 64, line
    locked = [s for s in stack.steps if s.when == "locked" and s.kind == "pip"]
    assert locked and all("--require-hashes" in s.args for s in locked)


def test_default_stack_is_installed_by_its_steps() -> None:
    stack = stacks.load_stack("default")
    assert stack.installer == "steps"
    assert stack.path in stack.stamp_files  # its steps are part of what an install is
    kinds = [(s.when, s.kind) for s in stack.steps]
    assert ("resolve", "freeze") in kinds and ("locked", "pip") in kinds
    assert stack.env == {} and stack.target_env == {} and stack.engine == {}


def test_default_stack_refuses_an_engine_env_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "stacks").mkdir()
    text = stacks.stack_file("default").read_text()
    (tmp_path / "stacks" / "default.toml").write_text(text + '\n[env]\nVLLM_USE_V1 = "1"\n')
    monkeypatch.setattr(stacks, "ROOT", tmp_path)
    monkeypatch.setattr(stacks, "STACKS_DIR", tmp_path / "stacks")
    with pytest.raises(stacks.StackError, match=r"env set, but the default stack's engine environment"):
        stacks.load_stack("default")


def test_read_pins_drops_comments_and_hashes(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text("# header\na-b==1.0 --hash=sha256:" + "0" * 64 + "\nc==2\n")
    assert read_pins(lock) == ["a-b==1.0", "c==2"]
    lock.write_text("a @ https://example/a.whl\n")
    with pytest.raises(LockError, match=r"x.lock:1: 'a @ https://example/a.whl' is not a name==version pin"):
        read_pins(lock)


def test_hashes_come_from_the_index_or_the_local_file(tmp_path: Path) -> None:
    wheel = tmp_path / "c-2-py3-none-any.whl"
    wheel.write_bytes(b"wheel bytes")
    report = {"install": [
        {"metadata": {"name": "A_B"}, "download_info": {
            "url": "https://files.example/a_b-1.0-py3-none-any.whl",
            "archive_info": {"hashes": {"sha256": "ab" * 32}}}},
        {"metadata": {"name": "c"}, "download_info": {"url": wheel.as_uri(), "archive_info": {}}},
    ]}
    hashes = hashes_from_report(report, ["a-b==1.0", "c==2"])
    assert hashes == {"a-b": "ab" * 32, "c": hashlib.sha256(b"wheel bytes").hexdigest()}
    assert lock_text(["# h"], ["a-b==1.0"], hashes) == f"# h\na-b==1.0 --hash=sha256:{'ab' * 32}\n"
    with pytest.raises(LockError, match="pip chose no file for d==3"):
        hashes_from_report(report, ["a-b==1.0", "d==3"])
    report["install"][0]["download_info"] = {"url": "https://files.example/a.whl"}
    with pytest.raises(LockError, match="a-b: pip picked https://files.example/a.whl with no sha256"):
        hashes_from_report(report, ["a-b==1.0"])


def test_setup_sh_is_a_thin_entry_point() -> None:
    text = (stacks.ROOT / "setup.sh").read_text()
    assert "-m harness.stacks install" in text
    assert "-m pip" not in text and "-m venv" not in text  # no install logic of its own
