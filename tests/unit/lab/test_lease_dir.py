"""The lease folder and its files: a file, a directory or a symlink where a lease file or
the folder belongs is refused, the folder is private and ours, stale holders are cleaned."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.lab.inventory import load_inventory
from harness.lab.lease_files import (
    LeaseDirError,
    clean_stale_holders,
    default_lease_dir,
    ensure_lease_dir,
)
from harness.lab.leases import LeaseManager
from tests.bad_input import INV, write


def spyre_manager(tmp_path: Path, lease_dir: Path, worker: str = "gw0") -> LeaseManager:
    inv = load_inventory(write(tmp_path, "inv.toml", INV + '[[device]]\nid = "cpu"\nkind = "cpu"\n'))
    return LeaseManager(inv, lease_dir, tmp_path / "run", worker)


def test_lease_dir_that_is_a_file_fails_device_tests_only(tmp_path):
    not_a_dir = write(tmp_path, "leases", "x")
    m = spyre_manager(tmp_path, not_a_dir)
    assert m.lease("vllm-cpu", None, None) is None  # CPU-only runs never touch it
    with pytest.raises(LeaseDirError, match=f"--lease-dir {not_a_dir} is not a folder; remove it"):
        m.lease("spyre", "eager", "cb")
    assert not_a_dir.read_text() == "x"


def test_lock_path_that_is_a_directory_or_symlink(tmp_path):
    leases = tmp_path / "leases"
    ensure_lease_dir(leases)
    (leases / "card0.lock").mkdir()
    with pytest.raises(LeaseDirError, match=r"lock path .*card0\.lock is a directory; remove it"):
        spyre_manager(tmp_path, leases).lease("spyre", "eager", "cb")
    (leases / "card0.lock").rmdir()
    victim = write(tmp_path, "victim", "precious")
    (leases / "card0.lock").symlink_to(victim)
    with pytest.raises(LeaseDirError, match=r"card0\.lock is a symlink; remove it"):
        spyre_manager(tmp_path, leases).lease("spyre", "eager", "cb")
    assert victim.read_text() == "precious"


def test_holder_record_never_follows_a_symlink(tmp_path):
    leases = ensure_lease_dir(tmp_path / "leases")
    victim = write(tmp_path, "victim", "precious")
    (leases / "card0.holder").symlink_to(victim)
    m = spyre_manager(tmp_path, leases)
    lease = m.lease("spyre", "eager", "cb")
    assert lease is not None and lease.device.id == "card0"
    assert victim.read_text() == "precious"
    holder = leases / "card0.holder"
    assert not holder.is_symlink() and json.loads(holder.read_text())["worker"] == "gw0"
    m.release_all()
    assert not holder.exists()  # released: no stale record left behind


def test_lease_dir_must_be_private_and_ours(tmp_path):
    d = ensure_lease_dir(tmp_path / "new")
    assert (d.stat().st_mode & 0o777) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(LeaseDirError, match=r"has mode 0777, writable by others; run `chmod 700"):
        ensure_lease_dir(shared)
    link = tmp_path / "link"
    link.symlink_to(d)
    with pytest.raises(LeaseDirError, match="is a symlink"):
        ensure_lease_dir(link)
    if os.getuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 4242, -1)
        with pytest.raises(LeaseDirError, match=r"is owned by uid 4242, not by you"):
            ensure_lease_dir(theirs)
    assert str(os.getuid()) in str(default_lease_dir()) or "XDG_RUNTIME_DIR" in os.environ


def test_stale_holder_records_are_cleaned(tmp_path):
    leases = ensure_lease_dir(tmp_path / "leases")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (leases / "card1.holder").write_text(json.dumps({"worker": "gw9", "pid": int(dead)}))
    (leases / "card2.holder").write_text("not json")
    (leases / "card3.holder").write_text(json.dumps({"worker": "gw0", "pid": os.getpid()}))
    assert sorted(clean_stale_holders(leases)) == ["card1", "card2"]
    assert (leases / "card3.holder").exists()
