"""The fork server's rules, without engines: which variables key a preloaded parent, how many
parents are kept, when a child is not forked from one, the fresh-process fallback, and what a
platform-free parent leaves to its children."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.core.paths import REPO_ROOT
from harness.engine import forkserver
from harness.engine.forkserver import ForkedProcess, ForkServerError, late, parent_env, platform_key


@pytest.fixture(autouse=True)
def _no_shared_parents(monkeypatch):
    """These tests are of a process's own parents: not the test run's shared ones."""
    monkeypatch.delenv(forkserver.SHARE_ENV, raising=False)


def test_a_share_folder_must_be_private_and_this_users(tmp_path, monkeypatch):
    assert forkserver.share_folder() is None  # none named: per-process parents
    folder = tmp_path / "share"
    folder.mkdir(mode=0o755)
    monkeypatch.setenv(forkserver.SHARE_ENV, str(folder))
    assert forkserver.share_folder() is None  # others may read it: not used
    folder.chmod(0o700)
    assert forkserver.share_folder() == folder
    monkeypatch.setenv(forkserver.SHARE_ENV, str(tmp_path / "gone"))
    assert forkserver.share_folder() is None


def test_a_run_opens_one_share_its_children_inherit_and_closes_it(monkeypatch):
    monkeypatch.delenv(forkserver.OWNER_ENV, raising=False)
    folder = forkserver.open_share()
    try:
        assert folder and os.environ[forkserver.SHARE_ENV] == folder
        assert os.environ[forkserver.OWNER_ENV] == str(os.getpid())
        assert forkserver.open_share() is None  # a child of a shared run shares its owner's
        assert forkserver.share_folder() == Path(folder)
    finally:
        forkserver.close_share(folder)
    assert not Path(folder).exists() and forkserver.SHARE_ENV not in os.environ


def test_a_shared_parent_that_cannot_start_falls_back_to_the_process_own(tmp_path, monkeypatch):
    # /bin/false is no Python: the shared parent exits before it is ready; the engine is then
    # started the way it would be without a share (here: fresh, the own parent broken too).
    share = tmp_path / "share"
    share.mkdir(mode=0o700)
    monkeypatch.setenv(forkserver.SHARE_ENV, str(share))
    with pytest.raises(forkserver.ForkServerError, match="exited .* before it was ready"):
        forkserver.shared_server("/bin/false", {"PATH": os.environ["PATH"]}, share)


def test_starting_a_shared_parent_beyond_the_limit_stops_the_least_recently_used(tmp_path):
    # Three live "parents" (sleeping processes with records), used in the order b, c, a: keeping
    # two stops b, the least recently used, and removes its record.
    procs = {n: subprocess.Popen(["sleep", "60"]) for n in "abc"}
    try:
        for i, n in enumerate("bca"):
            record = tmp_path / f"{n}.json"
            record.write_text(json.dumps({"pid": procs[n].pid}))
            os.utime(record, (1000 + i, 1000 + i))
        forkserver._stop_least_used(tmp_path, keep=2)
        assert procs["b"].wait(timeout=10) == -15
        assert procs["a"].poll() is None and procs["c"].poll() is None
        assert sorted(p.name for p in tmp_path.glob("*.json")) == ["a.json", "c.json"]
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_the_shells_own_variables_make_no_conflict_unless_read():
    srv = _Server({"PWD": "/a", "LANG": "C"}, [])
    assert srv.conflicts({"PWD": "/b", "LANG": "C"}) == []
    assert srv.conflicts({"PWD": "/a", "LANG": "fr"}) == ["LANG"]
    assert _Server({"PWD": "/a"}, ["PWD"]).conflicts({"PWD": "/b"}) == ["PWD"]


def test_late_variables_are_left_to_the_child_and_the_rest_keys_the_parent():
    caller = {"PATH": "/bin", "VLLM_LOGGING_LEVEL": "INFO", "HIL_ENGINE_AUTHKEY": "x",
              "PYTEST_CURRENT_TEST": "t0 (call)"}
    child = {"PATH": "/bin", "PYTHONPATH": "/lab", "TORCH_COMPILE_DISABLE": "1",
             "VLLM_PLUGINS": "spyre", "MASTER_PORT": "1234", "HIL_ENGINE_AUTHKEY": "y"}
    env = parent_env(child, caller)
    # Variables read at import (PYTHONPATH, torch's) are the parent's; the target's late
    # ones are not, the caller's late ones are (its imports read VLLM_LOGGING_LEVEL).
    assert env == {"PATH": "/bin", "PYTHONPATH": "/lab", "TORCH_COMPILE_DISABLE": "1",
                   "VLLM_LOGGING_LEVEL": "INFO"}
    assert late("VLLM_PLUGINS") and not late("TORCH_COMPILE_DISABLE") and not late("OMP_NUM_THREADS")
    # A platform parent is decided by the platform's variables, not by per-engine ones.
    assert platform_key(child) == (("VLLM_PLUGINS", "spyre"),)
    # pytest names the running test in the environment: one parent serves every test.
    a = parent_env({**child, "PYTEST_CURRENT_TEST": "t1 (call)"}, caller)
    assert a == parent_env({**child, "PYTEST_CURRENT_TEST": "t2 (call)"}, caller)
    assert platform_key({**child, "PYTEST_CURRENT_TEST": "t1"}) == platform_key(child)


def test_parents_beyond_the_limit_are_stopped_least_recently_used_first(monkeypatch, tmp_path):
    closed: list[str] = []

    class Fake:
        def __init__(self, name: str) -> None:
            self.name, self.alive = name, True

        def close(self) -> None:
            closed.append(self.name)

    monkeypatch.setattr(forkserver, "_servers", {})
    monkeypatch.setattr(forkserver.ForkServer, "start",
                        classmethod(lambda cls, python, env, cwd, log: Fake(env["K"])))
    for name in ("a", "b", "c", "a", "d"):
        forkserver.server_for("py", {"K": name}, str(tmp_path), tmp_path)
    assert closed == ["b"] and len(forkserver._servers) == forkserver.MAX_PARENTS


class _Server(forkserver.ForkServer):
    def __init__(self, env: dict[str, str], read: list[str]) -> None:  # no process
        self.env, self.report = env, {"read": read}


def test_a_child_differing_in_a_variable_the_parent_read_is_not_forked_from_it():
    srv = _Server({"PATH": "/bin", "VLLM_LOGGING_LEVEL": "INFO"}, read=["VLLM_LOGGING_LEVEL"])
    assert srv.conflicts({"PATH": "/bin", "VLLM_LOGGING_LEVEL": "INFO", "VLLM_PLUGINS": ""}) == []
    assert srv.conflicts({"PATH": "/bin", "VLLM_LOGGING_LEVEL": "DEBUG"}) == ["VLLM_LOGGING_LEVEL"]
    assert srv.conflicts({"PATH": "/usr/bin", "VLLM_LOGGING_LEVEL": "INFO"}) == ["PATH"]


def test_an_unknown_start_mode_is_refused(monkeypatch):
    monkeypatch.setenv(forkserver.START_ENV, "zygote")
    with pytest.raises(ValueError, match="HIL_ENGINE_START='zygote': expected one of platform"):
        forkserver.start_mode()


def test_a_fork_server_that_cannot_start_falls_back_to_a_fresh_process(tmp_path, monkeypatch):
    def broken(*a: Any, **kw: Any) -> Any:
        raise ForkServerError("no fork here")

    monkeypatch.setattr(forkserver, "server_for", broken)
    proc = forkserver.spawn_engine("/bin/true", "unused", {"PATH": os.environ["PATH"]}, str(tmp_path),
                                   tmp_path / "log", open(tmp_path / "log", "ab"))
    assert not isinstance(proc, ForkedProcess)
    assert proc.wait(timeout=30) == 0


# A stand-in vllm whose platform is resolved lazily, as vLLM's is; ``import vllm`` reads it
# where NEW (vLLM 0.28: vllm.utils.torch_utils), else only the submodule ``vllm.reader`` does.
_PLATFORMS = '''
_current_platform = None
def __getattr__(name):
    global _current_platform
    if name == "current_platform":
        if _current_platform is None:
            _current_platform = "resolved"
        return _current_platform
    raise AttributeError(name)
'''
_PRELOAD_IN_A_CHILD = '''
import json, os, sys
from harness.in_engine.fork_parent import preload
report = preload(("json", "vllm", "vllm.reader", "vllm.quiet"))
left = sorted(m for m in sys.modules if m.split(".")[0] == "vllm")
import vllm.quiet  # what the child does: the package imports whole, the platform resolves
from vllm.platforms import current_platform
print(json.dumps({"skipped": report["skipped"], "resolved": report["platform_resolved"],
                  "left": left, "later": current_platform, "attr": vllm.quiet.OK}))
'''


@pytest.mark.parametrize("new", [True, False], ids=["import-vllm-reads-it", "a-submodule-reads-it"])
def test_a_platform_free_parent_leaves_what_reads_the_platform_and_no_half_imported_package(
        tmp_path, new):
    pkg = tmp_path / "vllm"
    (pkg / "platforms").mkdir(parents=True)
    (pkg / "platforms" / "__init__.py").write_text(_PLATFORMS)
    (pkg / "envs.py").write_text("X = 1\n")
    (pkg / "quiet.py").write_text("import vllm.envs\nOK = vllm.envs.X\n")
    (pkg / "reader.py").write_text("from vllm.platforms import current_platform\n")
    (pkg / "__init__.py").write_text("import vllm.envs\n" + ("import vllm.reader\n" if new else ""))
    out = subprocess.run([sys.executable, "-c", _PRELOAD_IN_A_CHILD], cwd=REPO_ROOT, text=True,
                         capture_output=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["resolved"] is False and got["later"] == "resolved" and got["attr"] == 1
    if new:  # the package's own import reads it: nothing of it stays, every module is left
        assert got["skipped"]["vllm"] == "resolves the platform at import (read by vllm.reader)"
        assert set(got["skipped"]) == {"vllm", "vllm.reader", "vllm.quiet"}
        assert got["left"] == []
    else:  # only the module that reads it is left to the child
        assert set(got["skipped"]) == {"vllm.reader"}
        assert "vllm" in got["left"] and "vllm.reader" not in got["left"]


def test_an_unfit_parent_is_reported_in_one_line_with_what_it_skipped():
    report = {"read": ["PATH"] * 500, "platform_resolved": True, "threads": 1,
              "skipped": {"gguf": "ModuleNotFoundError: No module named 'gguf'",
                          "vllm": "resolves the platform at import (read by vllm.utils.torch_utils)",
                          "vllm.envs": "its package vllm ...", "vllm.config": "its package vllm ..."}}
    assert forkserver.unfit_reason(report) == (
        "its imports resolved vLLM's platform (skipped: gguf (ModuleNotFoundError: No module named"
        " 'gguf'), vllm (resolves the platform at import (read by vllm.utils.torch_utils); and 2 of"
        " its modules))")
    assert forkserver.unfit_reason({"threads": 3}) == "3 threads after its imports"


def test_the_share_says_how_often_its_parents_started_and_whom_they_served(tmp_path, monkeypatch):
    # Two environments' logs: one parent started twice (it stopped idle in between).
    from harness.in_engine.fork_parent import READY_LINE

    share = tmp_path / "share"
    share.mkdir(mode=0o700)
    served = "[hil] shared parent {}: client {} served by pid 9\n"
    (share / "a.log").write_text(f"{READY_LINE}11\n" + served.format(11, 1) + served.format(11, 2)
                                 + f"{READY_LINE}12\n" + served.format(12, 1))
    (share / "b.log").write_text(f"{READY_LINE}13\n" + served.format(13, 1))
    done = forkserver.close_share(str(share))
    assert done == "shared fork parents: 3 started for 2 environments, 4 pytest processes served"
    assert not share.exists()


def test_shared_parents_stay_while_memory_allows(tmp_path, monkeypatch):
    # Three live parents (this process stands for each): with memory to spare, up to
    # MAX_SHARED - 1 stay as one more starts; short by 1.5 parents' worth, two go (one stays);
    # with memory unknown, five stay (the old fixed cap).
    import json

    for i in range(3):
        (tmp_path / f"k{i}.json").write_text(json.dumps({"pid": os.getpid()}))
    (tmp_path / "dead.json").write_text(json.dumps({"pid": 0}))
    gib = 1 << 30
    floor = forkserver.SHARED_MEMORY_FLOOR + forkserver.SHARED_PARENT_BYTES
    assert forkserver.shared_room(tmp_path, available=floor + 4 * gib) == forkserver.MAX_SHARED - 1
    assert forkserver.shared_room(tmp_path, available=floor - gib - gib // 2) == 1
    assert forkserver.shared_room(tmp_path, available=0) == 0
    assert forkserver.memory_available() > 0  # /proc/meminfo read on this machine
    monkeypatch.setattr(forkserver, "memory_available", lambda: None)
    assert forkserver.shared_room(tmp_path) == 5


def test_the_variables_placing_an_engine_on_its_card_key_no_parent_and_are_given_at_the_fork():
    # Two engines on two cards (the Spyre kind's placement variables): one parent environment,
    # one platform key, one shared key; a parent that read one of them by name conflicts.
    caller = {"PATH": "/bin"}
    card = {"PATH": "/bin", "VLLM_PLUGINS": "sendnn_inference", "FLEX_COMPUTE": "SENTIENT"}
    on0 = {**card, "AIU_WORLD_SIZE": "1", "AIU_WORLD_RANK_0": "0000:3b:00.0",
           "TORCH_SENDNN_CACHE_DIR": "/c/sendnn/card0", "PCIDEVICE_IBM_COM_AIU_PF": "0000:3b:00.0"}
    on1 = {**card, "AIU_WORLD_SIZE": "1", "AIU_WORLD_RANK_0": "0000:3c:00.0",
           "TORCH_SENDNN_CACHE_DIR": "/c/sendnn/card1", "PCIDEVICE_IBM_COM_AIU_PF": "0000:3c:00.0"}
    assert parent_env(on0, caller) == parent_env(on1, caller) == {"PATH": "/bin"}
    assert platform_key(on0) == platform_key(on1) == (("FLEX_COMPUTE", "SENTIENT"),
                                                      ("VLLM_PLUGINS", "sendnn_inference"))
    parent = {k: v for k, v in on0.items() if not k.startswith(forkserver.PER_ENGINE_PREFIXES)}
    assert parent == card
    assert _Server(parent, read=["VLLM_PLUGINS"]).conflicts(on1) == []
    assert _Server(parent, read=["AIU_WORLD_RANK_0"]).conflicts(on1) == ["AIU_WORLD_RANK_0"]
    assert _Server(parent, read=[]).conflicts({**on1, "FLEX_COMPUTE": "SENULATOR"}) == []  # late
