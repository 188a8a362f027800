"""The Spyre plugin's generations, declared once: vllm-spyre (0.x-1.x) and sendnn-inference (2.x).

vllm-spyre was renamed sendnn-inference at 2.0. Everything the harness names differs
between the two: the distribution and module, the ``vllm.platform_plugins`` entry point
(``VLLM_PLUGINS``), the prefix of every environment variable, the platform class that must
run, the batching modes a decoder can have, and where the KV blocks live. A stack says which
generation it carries by the distribution it pins (``[versions]`` of ``stacks/NAME.toml``);
the host stack (``--stack host``) is asked what it has installed.

A wrong plugin name does not fail upstream: vLLM loads no plugin and runs its own CPU
platform, so every "spyre" test would pass on plain vLLM. ``platform_problem`` is the check
made after every engine start against the platform class the engine actually runs.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from harness.stacks import host as host_stack
from harness.stacks.spec import load_stack


@dataclass(frozen=True)
class PluginGeneration:
    """One generation of the Spyre plugin: the names and the shape the harness relies on."""

    name: str  # in messages and reports
    distribution: str  # what pip installs, and what a stack's [versions] pins
    module: str  # the import name
    plugin: str  # its vllm.platform_plugins entry point: the VLLM_PLUGINS value
    env_prefix: str  # of every variable it reads
    platform_class: str  # module.Class of the platform that must run
    modes: tuple[str, ...]  # the decoder batching modes it has (harness mode names)
    kv_home: str  # "runner": the runner's own pool; "scheduler": vLLM's KVCacheManager
    preload: tuple[str, ...]  # modules a preloaded fork-server parent imports
    pausing: bool = False  # the scheduler may pause a decoding request (keeps its blocks)
    # The modes whose scheduler admits a request only where the pool holds all it may need
    # beside the others' reservations, and holds it back otherwise (never preempting).
    holds_back_on_blocks: tuple[str, ...] = ()

    def var(self, key: str) -> str:
        """The full name of the plugin's variable ``key`` (``DYNAMO_BACKEND``)."""
        return f"{self.env_prefix}{key}"

    def mode_env(self, mode: str) -> dict[str, str]:
        """The variables that select ``mode`` (1.x picks its runner by variables; 2.x has one
        runner, and pausing on, as users run it, unless the mode is ``np``)."""
        if self.kv_home == "scheduler":
            return {self.var("PAUSING_ENABLED"): "0" if mode == "np" else "1"} if self.pausing else {}
        return {
            self.var("USE_CB"): "0" if mode == "sb" else "1",
            self.var("USE_CHUNKED_PREFILL"): "1" if mode == "cp" else "0",
        }

    def mode_kwargs(self, mode: str) -> dict[str, Any]:
        """``vllm.LLM`` arguments that select ``mode``: on 2.x prefix caching is the only choice."""
        if self.kv_home == "scheduler":
            return {"enable_prefix_caching": mode == "pc"}
        return {}


VLLM_SPYRE = PluginGeneration(
    name="vllm-spyre 1.x",
    distribution="vllm-spyre",
    module="vllm_spyre",
    plugin="spyre",
    env_prefix="VLLM_SPYRE_",
    platform_class="vllm_spyre.platform.SpyrePlatform",
    modes=("sb", "cb", "cp"),
    kv_home="runner",
    # continuous batching reserves a joining request's worst case; its chunked prefill reserves
    # nothing and leaves the pool to vLLM's stand-in
    holds_back_on_blocks=("cb",),
    preload=("vllm_spyre.v1.worker.spyre_worker", "vllm_spyre.v1.worker.spyre_model_runner",
             "vllm_spyre.model_executor.model_loader.spyre", "vllm_spyre.v1.core.scheduler"),
)

SENDNN_INFERENCE = PluginGeneration(
    name="sendnn-inference 2.x",
    distribution="sendnn-inference",
    module="sendnn_inference",
    plugin="sendnn_inference",
    env_prefix="SENDNN_INFERENCE_",
    platform_class="sendnn_inference.platform.SpyrePlatform",
    modes=("cp", "pc", "np"),
    kv_home="scheduler",
    preload=("sendnn_inference.v1.worker.spyre_worker",
             "sendnn_inference.v1.worker.spyre_model_runner",
             "sendnn_inference.model_executor.model_loader.spyre",
             "sendnn_inference.v1.core.scheduler",
             # what every engine start imports next (0.15-0.3 s each start otherwise)
             "fms.models.hf", "fms.utils.spyre.paged"),
    pausing=True,
    holds_back_on_blocks=("cp", "pc", "np"),  # promises of prompt + max_tokens at admission
)

GENERATIONS = (SENDNN_INFERENCE, VLLM_SPYRE)  # newest first: a host with both runs the newest


def by_distribution(names: set[str]) -> PluginGeneration | None:
    """The generation whose distribution is among ``names`` (canonical, lower-case)."""
    for gen in GENERATIONS:
        if gen.distribution in names:
            return gen
    return None


@functools.cache
def _installed_in(python: str) -> frozenset[str]:
    code = ("import importlib.metadata as m; print('\\n'.join(sorted({(d.metadata['Name'] or '')"
            ".lower().replace('_', '-') for d in m.distributions()})))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(out.stdout.split()) if out.returncode == 0 else frozenset()


def for_stack(stack: str) -> PluginGeneration | None:
    """The generation ``stack`` carries; None when it has no Spyre plugin."""
    if stack == host_stack.HOST:  # the given Python, else the one running the harness
        return by_distribution(set(_installed_in(host_stack.host_python() or sys.executable)))
    try:
        versions = load_stack(stack).versions
    except Exception:  # an unknown stack is refused elsewhere with its own message
        return None
    return by_distribution({k.lower().replace("_", "-") for k in versions})


def platform_problem(gen: PluginGeneration | None, info: dict[str, Any], label: str) -> str | None:
    """Why the engine that reported ``info`` is not running ``gen``'s platform, or None.

    ``info["platform_module"]`` and ``info["platform"]`` name the class of the engine's
    ``current_platform``; ``info["plugins"]``
    the ``VLLM_PLUGINS`` it saw. Fails with both names instead of letting vLLM's fallback to
    its own CPU platform pass for the plugin."""
    if gen is None:
        return None
    running = f"{info.get('platform_module', '?')}.{info.get('platform', '?')}"
    if running == gen.platform_class:
        return None
    return (
        f"{label} must run {gen.name}'s platform {gen.platform_class} (plugin {gen.plugin!r}),"
        f" but the engine runs {running} with VLLM_PLUGINS={info.get('plugins')!r}: the plugin"
        f" was not loaded (a wrong VLLM_PLUGINS name, or {gen.distribution} missing from the"
        f" engine's environment), and vLLM fell back to another platform"
    )
