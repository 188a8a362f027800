"""A platform parent traces vLLM's compiled sampler helper once, for the engines it forks, and
where the helpers compile with inductor runs inductor's CPU probe once instead
(``harness.in_engine.fork_parent.warm_compiled_helpers``), on the installed vLLM and plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.core.paths import REPO_ROOT

# In one child Python whose platform is Spyre's with the eager helper backend: an "engine"
# forked before the warm-up and one forked after call the sampler as engines do (batches of 1
# and 4, another vocabulary, each grad mode) and count the frames dynamo traced in them. Before
# that, the same with the inductor backend (the card targets' default): engines forked before
# and after the warm-up pick inductor's vector instruction set and count the probe programs
# they build and load; and the warm-up is asked where it must do nothing (compiling disabled).
_CHILD = r"""
import json, os, threading
import torch
from torch._dynamo.utils import counters
from vllm.platforms import current_platform
from vllm.v1.sample.sampler import Sampler
from harness.in_engine.fork_parent import warm_compiled_helpers

def engine_traces():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        before = sum(counters["frames"].values())
        for mode in ("enable_grad", "no_grad", "inference_mode"):
            with getattr(torch, mode)():
                for rows, vocab in ((1, 300), (4, 300), (2, 5000)):
                    logprobs = torch.randn(rows, vocab).log_softmax(-1)
                    Sampler.gather_logprobs(logprobs, 5, torch.zeros(rows, dtype=torch.int64))
        os.write(w, str(sum(counters["frames"].values()) - before).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    return int(os.read(r, 100))

def engine_probes():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        from torch._inductor import cpu_vec_isa
        started = []
        real = cpu_vec_isa.VecISA.check_build
        def counted(self, code):
            started.append(str(self))
            return real(self, code)
        cpu_vec_isa.VecISA.check_build = counted  # builds and loads one probe program
        cpu_vec_isa.pick_vec_isa()
        os.write(w, str(len(started)).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    return int(os.read(r, 100))

out = {"backend": current_platform.simple_compile_backend}
torch._dynamo.config.disable = True  # what TORCH_COMPILE_DISABLE=1 sets at torch's import
out["disabled"] = warm_compiled_helpers()
type(current_platform).simple_compile_backend = "inductor"
out["disabled_inductor"] = warm_compiled_helpers()
torch._dynamo.config.disable = False
out["probes_without"] = engine_probes()
out["inductor"] = warm_compiled_helpers()
out["inductor_threads"] = threading.active_count()
out["probes_with"] = engine_probes()
type(current_platform).simple_compile_backend = "eager"
out["traced_without"] = engine_traces()
out["warmed"] = warm_compiled_helpers()
out["threads"] = threading.active_count()
out["traced_with"] = engine_traces()
print(json.dumps(out))
"""


def test_an_engine_forked_after_the_warm_up_traces_no_sampler_helper_and_probes_no_cpu():
    pytest.importorskip("sendnn_inference")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VLLM_", "SENDNN_", "TORCH_COMPILE"))}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT),
                "VLLM_PLUGINS": "sendnn_inference",
                "SENDNN_INFERENCE_SIMPLE_COMPILE_BACKEND": "eager"})
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO_ROOT, text=True,
                          capture_output=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["backend"] == "eager", got  # the platform the engines of the eager target get
    # Nothing where nothing compiles.
    assert got["disabled"] == [] and got["disabled_inductor"] == [], got
    # Inductor: its CPU probe only (no helper compiled: no compile thread in the parent).
    assert got["probes_without"] > 0, got  # the control: an engine starts probe programs
    assert [w.split(" (")[0] for w in got["inductor"]] == ["inductor vector ISA probe"], got
    assert got["inductor_threads"] == 1, got
    assert got["probes_with"] == 0, got
    assert got["traced_without"] > 0, got  # the control: there is tracing to save
    assert len(got["warmed"]) == 3, got  # every grad mode
    assert got["threads"] == 1, got  # the parent stays fit to fork
    assert got["traced_with"] == 0, got
