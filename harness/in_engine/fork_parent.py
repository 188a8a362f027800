"""The preloaded parent that engine processes are forked from (``python -m
harness.in_engine.fork_parent ADDRESS [--platform]``): it imports torch, transformers and vLLM
once, without resolving vLLM's platform unless it is a platform parent, then forks one engine
process (``harness.in_engine.process``) per request from the harness side
(``harness.engine.forkserver``). A module whose import would resolve the platform is left for
the child, or for the platform parent forked from this one (on vLLM 0.28 that is all of vLLM:
``import vllm`` reads the platform). What each kind's plugin adds once its platform is resolved
is the kind's own (its ``plugin_preload``): the harness side hands every kind's map to the
parent in its environment (``harness.in_engine.kind_modules.FORK_PARENT_ENV``), with the
modules its engines import from the kinds by name, which the parent imports once for all.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.abc
import inspect
import json
import os
import random
import select
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from harness.core.parent_death import pid_alive
from harness.in_engine import process
from harness.in_engine.kind_modules import FORK_PARENT_ENV, ForkParentModules, import_modules

# What the parent imports: what ``from vllm import LLM`` and an engine start pull in,
# where importable without resolving the platform. Missing modules are skipped.
PRELOAD = (
    "torch", "transformers", "numpy", "sympy", "openai", "aiohttp", "fastapi", "pydantic",
    "mistral_common", "huggingface_hub", "tokenizers", "safetensors", "zmq", "gguf", "cv2",
    "jinja2", "regex", "yaml", "PIL", "xgrammar", "triton", "torch._dynamo", "torch._inductor",
    "transformers.models.llama.modeling_llama", "transformers.models.auto.modeling_auto",
    "vllm", "vllm.envs", "vllm.config", "vllm.engine.arg_utils", "vllm.sampling_params",
    "vllm.entrypoints.llm", "vllm.v1.engine.llm_engine", "vllm.v1.engine.core",
    "vllm.v1.core.sched.scheduler", "vllm.v1.core.block_pool", "vllm.v1.sample.sampler",
    "vllm.model_executor.models.llama", "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
)

# What a platform parent adds to PRELOAD (imported again: what its parent skipped is
# imported there), once its platform is resolved from its variables.
PLATFORM_PRELOAD = (
    "vllm.config", "vllm.engine.arg_utils", "vllm.sampling_params", "vllm.entrypoints.llm",
    "vllm.v1.engine.llm_engine", "vllm.v1.engine.core", "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.block_pool", "vllm.v1.core.kv_cache_manager", "vllm.v1.sample.sampler",
    "vllm.v1.executor.uniproc_executor", "vllm.model_executor.models.llama",
    "vllm.model_executor.model_loader", "vllm.distributed.parallel_state",
    # vLLM 0.28 imports these while it builds an engine (LLM's argument parsing, the
    # executor's message queue and elastic-EP hooks): 0.5-0.7 s per engine otherwise.
    "vllm.entrypoints.openai.cli_args", "vllm.distributed.device_communicators.shm_broadcast",
    "vllm.distributed.elastic_ep.elastic_execute",
)
# Imported only where the resolved platform is a kind's plugin (module prefix -> modules):
# every kind's, read from FORK_PARENT_ENV when the parent starts (``main``); a platform
# parent, forked from that parent, has it already.
PLUGIN_PRELOAD: dict[str, tuple[str, ...]] = {}

# ---------------------------------------------------------------------------
# The parent process
# ---------------------------------------------------------------------------


class _PlatformTouched(BaseException):
    """Raised (not Exception: no module may swallow it) when a preloaded module
    resolves vLLM's platform at import time; that module is left to the child."""


def _recording_environ(read: set[str]) -> Any:
    """os.environ that records the names read through it (same data underneath)."""
    base = os.environ

    def note(key: object) -> None:
        read.add(key.decode(errors="replace") if isinstance(key, bytes) else str(key))

    class Recording(type(base)):  # type: ignore[misc]
        def __getitem__(self, key: str) -> str:
            note(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            note(key)
            return super().__contains__(key)

        def get(self, key: str, default: Any = None) -> Any:
            note(key)
            return super().get(key, default)

    rec = Recording.__new__(Recording)
    rec.__dict__.update(base.__dict__)  # shares _data: writes stay visible both ways
    return rec


def preload(modules: tuple[str, ...] = PRELOAD, platform: bool = False) -> dict[str, Any]:
    """Import ``modules`` (without resolving vLLM's platform unless ``platform``); which
    variables were read and which modules skipped."""
    read: set[str] = set()
    original = os.environ
    os.environ = _recording_environ(read)  # noqa: B003 - same data, reads recorded
    skipped: dict[str, str] = {}
    touched: dict[str, str] = {}  # package -> why its own import resolves the platform
    guard = None
    t0 = time.monotonic()
    try:
        if platform:
            # deferred: a heavy import, paid only where this runs
            from vllm.platforms import current_platform

            owner = type(current_platform).__module__
            extra = [m for k, v in PLUGIN_PRELOAD.items() if owner.startswith(k) for m in v]
            modules = (*modules, *extra)
        for name in dict.fromkeys(modules):
            package = next((p for p in touched if name == p or name.startswith(p + ".")), None)
            if package is not None:
                skipped[name] = f"its package {package} {touched[package]}"
                continue
            if guard is None and not platform:
                guard = _guard_platform()
            before = set(sys.modules)
            try:
                __import__(name)
            except _PlatformTouched as e:
                skipped[name] = f"resolves the platform at import ({e.args[0]})"
                # Where a package's own import was aborted (vLLM 0.28: ``import vllm`` reads
                # the platform), the submodules it had run are dropped too: a later import
                # of the package would find them without it. The child imports it whole,
                # and so does a platform parent.
                for mod in set(sys.modules) - before:
                    if mod.split(".")[0] not in sys.modules:
                        del sys.modules[mod]
                top = name.split(".")[0]
                if top not in sys.modules:
                    touched[top] = skipped[name]
            except Exception as e:  # absent or broken on this stack: the child imports it
                skipped[name] = f"{type(e).__name__}: {e}"[:200]
    finally:
        os.environ = original  # noqa: B003 - the original object back
        if guard is not None:
            guard()
    resolved = _platform_resolved()
    warmed = warm_compiled_helpers() if platform else []
    return {"read": sorted(read), "skipped": skipped, "platform_resolved": resolved,
            "warmed": warmed, "seconds": round(time.monotonic() - t0, 2), "pid": os.getpid()}


# The grad modes an engine's sampler runs in: as called (sendnn-inference 2.x samples outside
# the worker's no_grad), under a platform's no_grad (Spyre's "inference mode") and under
# torch.inference_mode (vLLM's own workers).
_GRAD_MODES = ("enable_grad", "no_grad", "inference_mode")


def warm_compiled_helpers() -> list[str]:
    """Do here, once for every engine forked from this platform parent, what an engine pays at
    its first steps for the helpers vLLM compiles with ``torch.compile``, by the backend the
    platform compiles them with: ``eager``, the trace of the sampler's helper
    (``_trace_sampler_helper``); inductor, its probe of the CPU (``_warm_inductor_isa``). Where
    compiling is disabled or another backend is used, nothing is done. Never an error: what is
    not done here the engine does. Returns what was traced or probed."""
    try:
        # deferred: heavy imports, paid only where this runs (a platform parent has them)
        import torch
        from vllm.platforms import current_platform
    except Exception:
        return []
    if torch._dynamo.config.disable:  # TORCH_COMPILE_DISABLE, as torch read it
        return []
    backend = getattr(current_platform, "simple_compile_backend", None)
    if backend == "eager":
        return _trace_sampler_helper(torch)
    if backend == "inductor":
        return _warm_inductor_isa()
    return []


def _trace_sampler_helper(torch: Any) -> list[str]:
    """Where the platform compiles vLLM's helpers with dynamo's ``eager`` backend (tracing
    only: no code generated, no thread started), trace the one every engine calls: the
    sampler's rank count (``batched_count_greater_than``), through the installed
    ``Sampler.gather_logprobs`` itself, so with the marks its version puts on the batch. An
    engine traced it at its first logprob step and again at its first batch of another size or
    model vocabulary: 0.1-0.3 s per engine (measured on 2 cores, 0.06-0.23 s per trace). The
    forked engine finds the traced graph in its copy of the parent's memory, with the vocabulary
    and batch sizes dynamic, in each grad mode; anything else it traces itself, as before.
    Nothing where the sampler's helper is not a static method (vLLM 0.9)."""
    try:
        from vllm.v1.sample.sampler import Sampler
    except Exception:
        return []
    if not isinstance(inspect.getattr_static(Sampler, "gather_logprobs", None), staticmethod):
        return []
    warmed: list[str] = []
    for mode in _GRAD_MODES:
        try:
            with getattr(torch, mode)():
                for rows in (1, 2):  # the batch of one, then of several (versions that specialize 1)
                    logprobs = torch.zeros(rows, 64)
                    torch._dynamo.mark_dynamic(logprobs, 1)  # any model's vocabulary
                    Sampler.gather_logprobs(logprobs, 1, torch.zeros(rows, dtype=torch.int64))
            warmed.append(f"Sampler.gather_logprobs ({mode})")
        except Exception:  # the engine traces it at its first step, as without this
            continue
    return warmed


def _warm_inductor_isa() -> list[str]:
    """Where the platform compiles vLLM's helpers with inductor (the Spyre card targets: the
    plugins' default), inductor's first compile or cache load in an engine picks the CPU's vector
    instruction set by building and loading a probe library per candidate, each loaded in a new
    Python that imports torch (``torch._inductor.cpu_vec_isa.valid_vec_isa_list``, cached for
    the process): six such Pythons on an AVX-512 host, 9-10 s per engine with vllm-spyre 1.10's
    torch 2.10, about 1 s with torch 2.13. Run here once, the answer is in every forked
    engine's copy of this process; the probes are waited for (no thread is left), and
    ``ATEN_CPU_CAPABILITY``, which picks among them, is still read by the engine. The helpers
    themselves are not compiled here (inductor's compile workers are threads and processes a
    parent that forks must not hold). Never an error: the engine probes as before."""
    try:
        from torch._inductor import cpu_vec_isa

        valid = cpu_vec_isa.valid_vec_isa_list()
    except Exception:
        return []
    return [f"inductor vector ISA probe ({', '.join(str(v) for v in valid) or 'none'})"]


def _importer() -> str:
    """The module whose top-level code is being run by the innermost import on the stack."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and not frame.f_code.co_filename.startswith("<frozen"):
            return str(frame.f_globals.get("__name__", "?"))
        frame = frame.f_back
    return "?"


def _guard_platform() -> Any:
    """Make ``vllm.platforms.current_platform`` raise until the returned undo is called.

    vLLM 0.28 reads it while ``import vllm`` runs (``vllm.utils.torch_utils``), so the
    guard goes in as soon as ``vllm.platforms`` has run, before anything can read it."""
    patched: list[tuple[Any, Any]] = []  # (module, its own __getattr__ or None)

    def install(platforms: Any) -> None:
        original = platforms.__dict__.get("__getattr__")

        def guarded(name: str) -> Any:
            if name == "current_platform" and platforms.__dict__.get("_current_platform") is None:
                raise _PlatformTouched(f"read by {_importer()}")
            if original is None:
                raise AttributeError(name)
            return original(name)

        platforms.__getattr__ = guarded
        patched.append((platforms, original))

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != "vllm.platforms":
                return None
            spec = None
            for finder in sys.meta_path:
                find = None if finder is self else getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            run = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                install(module)

            spec.loader.exec_module = exec_module
            return spec

    finder = None
    if "vllm.platforms" in sys.modules:
        install(sys.modules["vllm.platforms"])
    else:
        finder = Finder()
        sys.meta_path.insert(0, finder)

    def undo() -> None:
        if finder is not None and finder in sys.meta_path:
            sys.meta_path.remove(finder)
        for platforms, original in patched:
            if original is None:
                platforms.__dict__.pop("__getattr__", None)
            else:
                platforms.__getattr__ = original

    return undo


def _platform_resolved() -> bool:
    mod = sys.modules.get("vllm.platforms")
    return bool(mod is not None and (mod.__dict__.get("_current_platform") is not None
                                     or "current_platform" in mod.__dict__))


def _set_pdeathsig() -> None:
    """Die with the parent (Linux); elsewhere the parent's exit still closes our socket."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _child(conn: Connection, spec: dict[str, Any]) -> None:
    """In the forked child: become the fresh engine process ``spec`` describes."""
    code = 1
    try:
        _set_pdeathsig()
        if os.getppid() == 1:
            os._exit(1)
        conn.close()  # the parent's socket is not ours
        fd = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        os.chdir(spec["cwd"])
        os.environ.clear()
        os.environ.update(spec["env"])

        random.seed()  # not the parent's sequence
        if spec.get("role") == "platform":
            os.environ["HIL_FORKSERVER_AUTHKEY"] = spec["authkey"]
            code = main(["", spec["address"]], platform=True)
        else:
            sys.argv = [str(process.__file__), *spec["argv"]]
            print(f"[hil] engine process {os.getpid()} forked from {os.getppid()} (preloaded)",
                  flush=True)
            code = process.main(sys.argv)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(conn: Connection, platform: bool = False) -> int:
    """Fork on request; report each child's exit; exit when the host goes away."""
    children: set[int] = set()
    while True:
        while children:  # reap: the host learns each exit code
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            conn.send(("exit", {"pid": pid, "code": os.waitstatus_to_exitcode(status)}))
        try:
            if not conn.poll(0.1):
                continue
            op, spec = conn.recv()
        except (EOFError, OSError):
            return 0
        if op != "fork":
            conn.send(("error", f"unknown request {op!r}"))
            continue
        if threading.active_count() > 1 or (_platform_resolved() and not platform):
            conn.send(("error", "the parent is no longer fit to fork (threads or a resolved platform)"))
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(conn, spec)
        children.add(pid)
        conn.send(("forked", pid))


def main(argv: list[str], platform: bool = False) -> int:
    authkey = bytes.fromhex(os.environ.pop("HIL_FORKSERVER_AUTHKEY"))
    # Popped: the engines forked from here get the environment their host gives them. A
    # platform parent finds none: it was forked from a parent that read it.
    kinds = ForkParentModules.from_env(os.environ.pop(FORK_PARENT_ENV, ""))
    PLUGIN_PRELOAD.update(kinds.plugin_preload)
    conn = Client(argv[1], family="AF_UNIX", authkey=authkey)
    try:
        # What every engine imports from the kinds by name (their fault and probe modules), once
        # here; before ``preload``, so its record of variables read stays that of the stack's.
        import_modules(kinds.modules)
        # A platform parent imports what its parent skipped too: on vLLM 0.28 all of vLLM,
        # whose ``import vllm`` resolves the platform.
        report = preload((*PRELOAD, *PLATFORM_PRELOAD), platform=True) if platform else preload()
    except BaseException as e:
        traceback.print_exc()
        conn.send(("unfit", {"error": repr(e)}))
        return 1

    report["threads"] = threading.active_count()
    fit = (platform or not report["platform_resolved"]) and report["threads"] == 1
    if fit:
        # What the imports built stays: children neither scan it at each collection (vLLM
        # collects three times while it builds an engine) nor copy its pages by touching it.
        gc.collect()
        gc.freeze()
    conn.send(("ready" if fit else "unfit", report))
    return serve(conn, platform) if fit else 1


# ---------------------------------------------------------------------------
# The run's shared parent (``--shared ADDRESS RECORD``)
# ---------------------------------------------------------------------------

# A shared parent with no client for this long stops (its pages are given back). Long enough
# to outlast the gaps between one environment's uses in a test session (tests of other files,
# another stack's runs): a restart costs its imports again, 10-20 s. The live ones are bounded
# anyway (forkserver.MAX_SHARED), and all stop with the run's owner.
SHARED_IDLE_SECONDS = 900.0
READY_LINE = "[hil] shared parent ready: "  # one per start, in the key's log
OWNER_ENV = "HIL_FORKSERVER_OWNER"  # the process the shared parents serve; they stop with it


def _write_record(path: str, record: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def shared_main(address: str, record: str) -> int:
    """One preloaded platform parent for every pytest process of a run that names the same
    interpreter and environment (``harness.engine.forkserver.shared_server``): it imports once,
    listens on ``address`` and forks, per client that connects, a parent of that client's own
    (``serve``, as a platform parent does for its host): the client's engines are that
    parent's children and die with it, and it ends when its client's connection closes. The
    shared parent stops when the run's owner process ends, when ``record`` is removed, or
    after SHARED_IDLE_SECONDS without a client."""
    authkey = bytes.fromhex(os.environ.pop("HIL_FORKSERVER_AUTHKEY"))
    owner = int(os.environ.pop(OWNER_ENV, "0") or 0)
    kinds = ForkParentModules.from_env(os.environ.pop(FORK_PARENT_ENV, ""))
    PLUGIN_PRELOAD.update(kinds.plugin_preload)
    try:
        import_modules(kinds.modules)
        report = preload((*PRELOAD, *PLATFORM_PRELOAD), platform=True)
    except BaseException as e:
        traceback.print_exc()
        _write_record(record, {"error": repr(e)})
        return 1
    report["threads"] = threading.active_count()
    if report["threads"] != 1:
        _write_record(record, {"error": unfit_line(report)})
        return 1
    gc.collect()
    gc.freeze()
    # Stopped (the least recently used of a folder): leave through ``finally`` below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    listener = Listener(address, family="AF_UNIX", authkey=authkey)
    sock = listener._listener._socket  # type: ignore[attr-defined]
    _write_record(record, {"pid": os.getpid(), "address": address, "authkey": authkey.hex()})
    print(f"{READY_LINE}{os.getpid()}", flush=True)
    clients: set[int] = set()
    served = 0
    last = time.monotonic()
    try:
        while True:
            while clients:  # reap the per-client parents that ended
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    clients.clear()
                    break
                if pid == 0:
                    break
                clients.discard(pid)
                last = time.monotonic()
            if (owner and not pid_alive(owner)) or not os.path.exists(record) or (
                    not clients and time.monotonic() - last > SHARED_IDLE_SECONDS):
                return 0
            if not select.select([sock], [], [], 1.0)[0]:
                continue
            try:
                conn = listener.accept()
            except Exception:  # a client that failed the handshake or went away
                continue
            last = time.monotonic()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    sock.close()  # the listening socket is the shared parent's (no unlink)
                    conn.send(("ready", {**report, "pid": os.getpid()}))
                    code = serve(conn, platform=True)
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            clients.add(pid)
            served += 1
            print(f"[hil] shared parent {os.getpid()}: client {served} served by pid {pid}",
                  flush=True)
            conn.close()
    finally:
        listener.close()
        try:
            os.unlink(record)
        except OSError:
            pass


def unfit_line(report: dict[str, Any]) -> str:
    return f"{report.get('threads')} threads after its imports"


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--shared":
        code = shared_main(sys.argv[2], sys.argv[3])
    else:
        code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
