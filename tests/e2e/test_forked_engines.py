"""Engines forked from a preloaded parent behave as fresh engine processes do.

On the default stack (vLLM 0.28, sendnn-inference 2.x: Spyre on spyre-eager-cp) and on the
spyre-1.10 stack (vLLM 0.17, vllm-spyre 1.x: Spyre on spyre-eager-cb), each engine run by its
stack's python as the engine pool runs it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from fixtures.models import build_model
from harness.core.errors import EngineCrashed
from harness.core.paths import REPO_ROOT
from harness.engine import forkserver
from harness.engine.forkserver import ForkedProcess
from harness.engine.host import EngineHost
from harness.engine.pool import stack_runtime
from harness.scenario.prompts import EngineLimits
from harness.targets import target_for
from harness.targets.variants import VARIANTS
from tests.suite_runner import SPYRE_1X_STACK, needs_spyre_1x

ROOT = REPO_ROOT


LAB_MODULE = '''
import json, os, sys
def record(config, path):
    from vllm.platforms import current_platform
    with open(path, "w") as f:
        json.dump({"mark": os.environ.get("LAB_MARK"), "plugins": os.environ.get("VLLM_PLUGINS"),
                   "path0": [p for p in sys.path if "lab" in p][:1],
                   "platform": type(current_platform).__name__,
                   "plugins_loaded": __import__("vllm.plugins").plugins.plugins_loaded}, f)
'''


# stack -> the Spyre variant its plugin generation runs
STACKS = [
    pytest.param("default", "spyre-eager-cp", id="default"),
    pytest.param(SPYRE_1X_STACK, "spyre-eager-cb", id=SPYRE_1X_STACK, marks=needs_spyre_1x),
]


def _engine(tmp_path: Path, variant: str, name: str, stack: str = "default",
            **kw: Any) -> EngineHost:
    model = build_model("tiny-llama", ROOT / ".hil-cache")
    limits = EngineLimits(256, 4, cp_chunk=128)  # the chunk is read by cp only
    cfg = VARIANTS[variant].engine_config(str(model), limits, stack=stack, **kw)
    t = target_for(cfg)
    python, stack_env, stack_kwargs = stack_runtime(cfg)
    return EngineHost(cfg, {**t.engine_env(), **stack_env}, {**t.llm_kwargs(), **stack_kwargs},
                      tmp_path / name, start_timeout=300, python=python)


def _started_as(host: EngineHost) -> str:
    return "forked" if isinstance(host.proc, ForkedProcess) else "fresh"


@pytest.mark.e2e  # starts engines
@pytest.mark.parametrize(("stack", "spyre"), STACKS)
def test_forked_engines_see_the_callers_pythonpath_env_platform_and_faults(tmp_path, monkeypatch,
                                                                           stack, spyre):
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "hil_lab_mark.py").write_text(LAB_MODULE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(lab), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("LAB_MARK", "from-the-caller")
    monkeypatch.setenv("HIL_ALLOW_EXTERNAL_FAULTS", "1")
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    share = tmp_path / "share"
    share.mkdir(mode=0o700)
    # fresh processes; this process's own parents; a run's shared parents (its own folder)
    for mode in ("fresh", "platform", "shared"):
        monkeypatch.setenv(forkserver.START_ENV, "fresh" if mode == "fresh" else "platform")
        if mode == "shared":
            monkeypatch.setenv(forkserver.SHARE_ENV, str(share))
            monkeypatch.setenv(forkserver.OWNER_ENV, str(os.getpid()))
        else:
            monkeypatch.delenv(forkserver.SHARE_ENV, raising=False)
        for variant in ("vllm-cpu", spyre):
            out = tmp_path / f"{mode}-{variant}.json"
            monkeypatch.setenv("HIL_FAULTS", f"hil_lab_mark.record:path={out}")
            host = _engine(tmp_path, variant, f"{mode}-{variant}", stack)
            try:
                assert _started_as(host) == ("fresh" if mode == "fresh" else "forked")
                if mode != "fresh":  # from the run's shared parent, or from this process's own
                    shared = isinstance(host.proc.server.proc, forkserver._SharedClientParent)
                    assert shared == (mode == "shared"), mode
                info = {k: host.info[k] for k in ("platform", "platform_module", "num_gpu_blocks",
                                                  "block_size", "kv_source", "kv_pad_blocks")}
                log = host.log_tail(400)
            finally:
                host.close()
            assert "[hil] fault installed: hil_lab_mark.record" in log
            seen[(mode, variant)] = {**json.loads(out.read_text()), **info}
    forkserver.close_share(str(share))
    for variant in ("vllm-cpu", spyre):
        assert seen[("platform", variant)] == seen[("fresh", variant)], variant
        assert seen[("shared", variant)] == seen[("fresh", variant)], variant
        assert seen[("fresh", variant)]["mark"] == "from-the-caller"
        assert seen[("fresh", variant)]["path0"] == [str(lab)]
    assert seen[("platform", "vllm-cpu")]["platform"] == "CpuPlatform"
    assert seen[("platform", spyre)]["platform"] != "CpuPlatform"


@pytest.mark.e2e  # starts engines
@pytest.mark.parametrize("stack", [
    pytest.param("default", id="default"),
    pytest.param(SPYRE_1X_STACK, id=SPYRE_1X_STACK, marks=needs_spyre_1x),
])
def test_a_killed_engine_leaves_its_parent_and_a_dead_parent_is_the_engines_death(tmp_path, stack):
    first = _engine(tmp_path, "vllm-cpu", "a", stack)
    assert _started_as(first) == "forked"
    srv = first.proc.server
    os.kill(first.proc.pid, signal.SIGKILL)
    with pytest.raises(EngineCrashed, match=r"exit code -9"):
        first.call("metrics")
    first.close()
    second = _engine(tmp_path, "vllm-cpu", "b", stack)
    try:
        assert second.proc.server is srv and srv.alive  # the parent survived its child
        assert second.start_seconds < 10
        second.call("metrics")
        os.kill(srv.proc.pid, signal.SIGKILL)  # the parent dies: so does its engine
        deadline = time.monotonic() + 10
        while second.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert second.proc.poll() == -signal.SIGKILL
        with pytest.raises(EngineCrashed):
            second.call("metrics")
    finally:
        second.close()
    third = _engine(tmp_path, "vllm-cpu", "c", stack)  # a new parent is started
    try:
        assert third.proc.server is not srv
        third.call("metrics")
    finally:
        third.close()
