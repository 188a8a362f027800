"""Spyre cards: the per-card environment, the check that an engine really ran on the card it
leased, the card's start limit and near-tie tolerance (``SpyreTarget``'s whole-device hooks).

A card engine is a Spyre engine on the sendnn backend bound to a leased device (one engine per
card at a time: harness.engine.device_ledger). vllm-spyre and the Spyre runtime read the card to
use, the compute mode and the compile cache from the environment; ``card_env`` sets them per
leased card (the inventory's ``env`` for the device wins, so the lab decides where it must).
After start, ``verify_card_engine`` compares what the engine reports (platform, dynamo backend,
FLEX_COMPUTE, torch_sendnn) and the runtime's ``Opened: SEN:VFIO:<address>`` log line with the
leased card.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.core.comparison import NearTiePolicy
from harness.targets.base import MODEL_DTYPE
from harness.targets.spyre.generations import GENERATIONS

# Defaults, documented in the README ("On a card host"); the inventory's per-device env overrides.
CARD_ENV_DEFAULTS = {
    "FLEX_COMPUTE": "SENTIENT",  # unset, vllm-spyre's spyre_setup picks the simulator (SENULATOR)
    # How the runtime reaches the card: VFIO here; upstream's image uses PF. An inventory
    # device's env sets its own, and the verification expects what the engine ran with.
    "FLEX_DEVICE": "VFIO",
    "AIU_WORLD_SIZE": "1",  # the cards of the engine's lease: 1, or its group's size
    "TORCH_SENDNN_CACHE_ENABLE": "1",
    # The runtime logs the card it opened ("Opened: SEN:VFIO...") at INFO; the check needs it.
    "DTLOG_LEVEL": "INFO",
}

# Inherited variables that change what a card engine compiles, schedules or opens: the
# compiler's (VLLM_DT_*: chunk size, batch TKV limit), the runtime's, and each plugin
# generation's own. ``hil devices`` and the report's environment list every one a run inherits.
INHERITED_PREFIXES = ("VLLM_DT_", "FLEX_", "AIU_", "DT_", "DTLOG_", "TORCH_SENDNN_", "SPYRE_",
                      *(g.env_prefix for g in GENERATIONS))
# The plugin variables the harness sets per engine (its mode and backend).
_HARNESS_PLUGIN_KEYS = ("DYNAMO_BACKEND", "USE_CB", "USE_CHUNKED_PREFILL", "PAUSING_ENABLED")

# A card start compiles every graph (upstream deployments allow 1200 s); eager starts in seconds.
SENDNN_START_TIMEOUT = 1200.0

# The card computes in fp16 against an fp32 reference: near-ties are wider there.
NEAR_TIE_TOL_SENDNN = 0.10
# What each backend computes in, as vllm-spyre loads our fp32 checkpoints.
DEVICE_DTYPES = {"sendnn": "fp16", "eager": "fp32"}

_OPENED = re.compile(r"Opened: (\S+)")
_PCI = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


def near_tie_policy(base: NearTiePolicy, backend: str, sendnn_tol: float) -> NearTiePolicy:
    """The near-tie policy for a trace of ``backend`` (``SpyreTarget.backend_of`` its label):
    the card's wider tolerance on sendnn, and the dtypes compared, stated in every diff."""
    tol = max(base.prob_tol, sendnn_tol) if backend == "sendnn" else base.prob_tol
    dtype = DEVICE_DTYPES.get(backend, MODEL_DTYPE)
    dtypes = f"reference fp32 (transformers on the CPU) vs device {dtype}"
    return replace(base, prob_tol=tol, dtypes=dtypes)


def card_env(device: Any, cache_dir: Path) -> dict[str, str]:
    """What vllm-spyre and the Spyre runtime need for an engine on ``device`` (an inventory
    device), before the inventory's own ``env`` is laid on top; empty for other devices."""
    if device.kind != "spyre" or (device.backend or "sendnn") != "sendnn":
        return {}
    env = dict(CARD_ENV_DEFAULTS)
    env["TORCH_SENDNN_CACHE_DIR"] = str(cache_dir / "sendnn" / device.id)
    # A group's engine runs rank i on its i-th card: the runtime of rank i (RANK, set by the
    # plugin from vLLM's rank) opens AIU_WORLD_RANK_<i>.
    cards = device.members or (device,)
    env["AIU_WORLD_SIZE"] = str(len(cards))
    addresses = [c.address or dict(c.env).get("AIU_WORLD_RANK_0", "") for c in cards]
    for rank, address in enumerate(addresses):
        if address:
            env[f"AIU_WORLD_RANK_{rank}"] = address
    if all(addresses):  # what the verification expects the runtime of each rank to open
        env["HIL_CARD_ADDRESS"] = ",".join(addresses)
    return env


def prepare_card_start(env: dict[str, str]) -> None:
    """Before a card engine starts: its compile cache folder exists, created as upstream's
    setup does (the runtime does not create it, and a missing one fails a cached start)."""
    cache = env.get("TORCH_SENDNN_CACHE_DIR")
    if cache:
        Path(cache).mkdir(parents=True, exist_ok=True)


def inherited_card_env(environ: Any) -> list[tuple[str, str, str]]:
    """(name, value, what it does) for every variable of ``environ`` that a card engine would
    inherit and that changes it: the ones the harness sets per engine are ignored (the
    inventory's ``env`` is where a lab changes them); the others change the engine as given."""
    ours = {*CARD_ENV_DEFAULTS, "AIU_WORLD_RANK_0", "TORCH_SENDNN_CACHE_DIR",
            *(g.var(k) for g in GENERATIONS for k in _HARNESS_PLUGIN_KEYS)}
    out = []
    for name in sorted(environ):
        if not name.startswith(INHERITED_PREFIXES):
            continue
        if name in ours:
            what = ("ignored: the harness sets it per engine; set it in the inventory's env for"
                    " the device to change it")
        else:
            what = "changes every Spyre engine of this run (inherited as is)"
        out.append((name, str(environ[name]), what))
    return out


def engine_card_info() -> dict[str, Any]:
    """Run inside the engine process after start: what it runs on, as the engine sees it."""
    info: dict[str, Any] = {
        "env": {k: os.environ.get(k) for k in
                ("FLEX_COMPUTE", "FLEX_DEVICE", "AIU_WORLD_SIZE", "AIU_WORLD_RANK_0",
                 "TORCH_SENDNN_CACHE_DIR")},
    }
    for gen in GENERATIONS:  # the plugin's own reading of its backend variable
        if importlib.util.find_spec(gen.module) is None:
            continue
        envs = importlib.import_module(f"{gen.module}.envs")  # deferred: heavy, engine side
        info["dynamo_backend"] = getattr(envs, gen.var("DYNAMO_BACKEND"))
        break
    else:
        return info
    if importlib.util.find_spec("torch_sendnn") is not None:
        # deferred: a heavy import, paid only where this runs
        from torch_sendnn import _version

        info["torch_sendnn"] = _version.__version__
        info["torch_sendnn_emulated"] = bool(getattr(_version, "EMULATED", False))
    return info


def opened_devices(log_text: str) -> list[str]:
    """What the runtime says it opened, in order: ``SEN:VFIO:<address>`` or ``SENULATOR``."""
    return [m.group(1).rstrip(",;") for m in _OPENED.finditer(log_text)]


# vLLM prefixes what a rank's Python writes with its process name; the runtime's own lines may
# come without it (a native library writes to the file descriptor).
_RANK_OPENED = re.compile(r"\(Worker_TP(\d+)[^)]*\).*?Opened: (\S+)")


def opened_by_rank(log_text: str) -> dict[int, list[str]]:
    """What each rank's runtime says it opened, where its line names the rank."""
    out: dict[int, list[str]] = {}
    for m in _RANK_OPENED.finditer(log_text):
        out.setdefault(int(m.group(1)), []).append(m.group(2).rstrip(",;"))
    return out


def rank_card_problems(expected: list[str], ranks: list[dict[str, Any]] | None,
                       log_text: str, flex_device: str) -> list[str]:
    """What breaks "rank i runs on the group's i-th card" in a tensor-parallel card engine:
    each rank's own environment (the card its runtime opens) and, where the log names the
    rank, the card it opened; [] when every rank is on its card."""
    problems = []
    for r in ranks or []:
        rank, env = r.get("rank"), r.get("env") or {}
        if not isinstance(rank, int) or not 0 <= rank < len(expected):
            continue
        size = env.get("AIU_WORLD_SIZE")
        if size != str(len(expected)):
            problems.append(f"rank {rank} runs with AIU_WORLD_SIZE={size}, not {len(expected)}")
        own = env.get(f"AIU_WORLD_RANK_{rank}")
        if own != expected[rank]:
            problems.append(f"rank {rank}'s runtime would open AIU_WORLD_RANK_{rank}={own},"
                            f" not its card {expected[rank]}")
        if env.get("RANK") not in (None, str(rank)):
            problems.append(f"rank {rank} runs with RANK={env.get('RANK')} (its runtime opens"
                            f" AIU_WORLD_RANK_{env.get('RANK')})")
    for rank, opened in sorted(opened_by_rank(log_text).items()):
        want = f"SEN:{flex_device}:{expected[rank]}" if rank < len(expected) else None
        if want is None or any(o != want for o in opened):
            problems.append(f"rank {rank} opened {', '.join(opened)}, expected {want}")
    return problems


# Set in a card engine's env when the run allows the emulated runtime (--allow-emulated-card).
ALLOW_EMULATED_ENV = "HIL_ALLOW_EMULATED_CARD"


def verify_card_engine(cfg: Any, info: dict[str, Any], log_text: str) -> str | None:
    """None when the engine of ``cfg`` runs vllm-spyre's Spyre platform with the sendnn backend
    on the leased card; else what was expected and what was seen. Mandatory for every sendnn
    engine: one with no leased card, or on the emulated runtime in a run that does not allow
    it, is refused."""
    if cfg.target != "spyre" or cfg.backend != "sendnn":
        return None
    if not cfg.device:
        return (f"engine {cfg.label} runs the sendnn backend with no leased card: a card engine"
                " starts only under a lease of a card that serves its variant (an unleased one"
                " would open whatever card or simulator its environment names)")
    env = dict(cfg.extra_env)
    expected_addrs = [a for a in env.get("HIL_CARD_ADDRESS", "").split(",") if a]
    card = info.get("card", {})
    opened = opened_devices(log_text)
    seen_addrs = sorted(a for o in opened for a in _PCI.findall(o))
    flex_device = (card.get("env") or {}).get("FLEX_DEVICE") or "VFIO"
    allow_emulated = env.get(ALLOW_EMULATED_ENV) == "1"
    expected = {
        "platform": "SpyrePlatform",
        "dynamo backend": "sendnn",
        "FLEX_COMPUTE": "SENTIENT",
        "opened": (", ".join(f"SEN:{flex_device}:{a}" for a in expected_addrs)
                   + (" (each once, rank i its i-th card)" if len(expected_addrs) > 1 else "")
                   if expected_addrs else f"SEN:{flex_device}:<the leased card>"),
        "runtime": "torch_sendnn" + (" (the emulated one allowed)" if allow_emulated else ""),
    }
    emulated = bool(card.get("torch_sendnn_emulated"))
    seen = {
        "platform": info.get("platform"),
        "dynamo backend": card.get("dynamo_backend"),
        "FLEX_COMPUTE": (card.get("env") or {}).get("FLEX_COMPUTE"),
        "opened": ", ".join(opened) or "nothing (no 'Opened:' line in the engine log)",
        "runtime": f"torch_sendnn {card.get('torch_sendnn', '?')}"
                   + (" (emulated)" if emulated else ""),
    }
    problems = [k for k in ("platform", "dynamo backend", "FLEX_COMPUTE") if seen[k] != expected[k]]
    on_card = [o for o in opened if o.startswith(f"SEN:{flex_device}")]
    if not on_card or (expected_addrs and seen_addrs != sorted(expected_addrs)):
        problems.append("opened")
    rank_problems = (rank_card_problems(expected_addrs, info.get("ranks"), log_text, flex_device)
                     if len(expected_addrs) > 1 else [])
    if rank_problems and "opened" not in problems:
        problems.append("opened")
    if emulated and not allow_emulated:
        problems.append("runtime")
    if not problems:
        return None
    what = "card group's" if len(expected_addrs) > 1 else "card's"
    lines = [f"engine {cfg.label} on {cfg.device} is not the leased {what} Spyre sendnn engine"
             f" (wrong {', '.join(problems)})"]
    lines += [f"  {k}: expected {expected[k]}, seen {seen[k]}" for k in expected]
    lines += [f"  {p}" for p in rank_problems]
    if "opened" in problems and not opened:
        lines.append("  the runtime logs the card it opens at DTLOG_LEVEL=INFO; check that the"
                     " inventory env does not lower it")
    if "runtime" in problems:
        lines.append("  the engine ran on the emulated torch_sendnn, not a card's runtime; a run"
                     " on the emulated card host says --allow-emulated-card")
    return "\n".join(lines)


def torch_sendnn_status() -> tuple[str | None, str | None]:
    """(version, problem) of torch_sendnn in this Python; problem says what to install."""
    if importlib.util.find_spec("torch_sendnn") is None:
        return None, ("torch_sendnn is not importable in this Python: a stack problem, not a card"
                      " problem; run on the vendor's card image (a venv with system site packages)"
                      " or install the Spyre software stack")
    try:
        # deferred: a heavy import, paid only where this runs
        from torch_sendnn import _version
    except Exception as e:  # a broken install is a stack problem too
        return None, f"torch_sendnn is installed but does not import: {e!r}"
    note = " (emulated)" if getattr(_version, "EMULATED", False) else ""
    return f"{_version.__version__}{note}", None
