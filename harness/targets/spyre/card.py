"""Cards: the per-card environment, one engine per card at a time, and the check that an engine
really ran on the card it leased.

A card engine is a Spyre engine on the sendnn backend (or a Neuron engine) bound to a leased
device. vllm-spyre and the Spyre runtime read the card to use, the compute mode and the compile
cache from the environment; ``card_env`` sets them per leased card (the inventory's ``env`` for the
device wins, so the lab decides where it must). After start, ``verify_card_engine`` compares what
the engine reports (platform, dynamo backend, FLEX_COMPUTE, torch_sendnn) and the runtime's
``Opened: SEN:VFIO:<address>`` log line with the leased card.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.core.errors import EngineError

# Defaults, documented in the README ("On a card host"); the inventory's per-device env overrides.
CARD_ENV_DEFAULTS = {
    "FLEX_COMPUTE": "SENTIENT",  # unset, vllm-spyre's spyre_setup picks the simulator (SENULATOR)
    "FLEX_DEVICE": "VFIO",
    "AIU_WORLD_SIZE": "1",  # one card per engine (no tensor parallel)
    "TORCH_SENDNN_CACHE_ENABLE": "1",
    # The runtime logs the card it opened ("Opened: SEN:VFIO...") at INFO; the check needs it.
    "DTLOG_LEVEL": "INFO",
}

# Per-backend engine-start timeouts: a card start compiles every graph (upstream deployments
# allow 1200 s); the CPU targets start in seconds.
START_TIMEOUTS = {"sendnn": 1200.0, "neuron": 1800.0, "default": 600.0}

# The card computes in fp16 against an fp32 reference: near-ties are wider there.
NEAR_TIE_TOL_SENDNN = 0.10
# What each target computes in, as vllm-spyre / vLLM load our fp32 checkpoints.
DEVICE_DTYPES = {"sendnn": "fp16", "eager": "fp32", "vllm-cpu": "the model's dtype (fp32)"}

_OPENED = re.compile(r"Opened: (\S+)")
_PCI = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


class CardMismatch(EngineError):
    """The engine came up, but not as the leased card's Spyre/sendnn engine."""


def is_card_config(cfg: Any) -> bool:
    """Whether an engine of ``cfg`` holds a whole device (a card cannot load two models at once)."""
    return bool(cfg.device) and (cfg.backend == "sendnn" or cfg.target == "neuron")


def start_timeout(cfg: Any, option: float | None) -> float:
    """The engine-start limit: ``--engine-start-timeout`` when given, else the backend's default."""
    if option:
        return float(option)
    if cfg.backend == "sendnn":
        return START_TIMEOUTS["sendnn"]
    if cfg.target == "neuron":
        return START_TIMEOUTS["neuron"]
    return START_TIMEOUTS["default"]


def near_tie_policy(base: Any, target_label: str, sendnn_tol: float) -> Any:
    """The near-tie policy for a trace of ``target_label`` (e.g. ``spyre-sendnn-cb``): the card's
    wider tolerance on sendnn, and the dtypes compared, stated in every diff."""
    if "-sendnn" in target_label:
        backend, tol = "sendnn", max(base.prob_tol, sendnn_tol)
    elif "-eager" in target_label:
        backend, tol = "eager", base.prob_tol
    else:
        backend, tol = "vllm-cpu", base.prob_tol
    dtypes = f"reference fp32 (transformers on the CPU) vs device {DEVICE_DTYPES[backend]}"
    return replace(base, prob_tol=tol, dtypes=dtypes)


def card_env(device: Any, cache_dir: Path) -> dict[str, str]:
    """What vllm-spyre and the Spyre runtime need for an engine on ``device`` (an inventory
    device), before the inventory's own ``env`` is laid on top; empty for other devices."""
    if device.kind != "spyre" or (device.backend or "sendnn") != "sendnn":
        return {}
    env = dict(CARD_ENV_DEFAULTS)
    env["TORCH_SENDNN_CACHE_DIR"] = str(cache_dir / "sendnn" / device.id)
    inv_env = dict(device.env)
    address = device.address or inv_env.get("AIU_WORLD_RANK_0", "")
    if address:
        env["AIU_WORLD_RANK_0"] = address
        env["HIL_CARD_ADDRESS"] = address  # what the verification expects the runtime to open
    return env


def engine_card_info() -> dict[str, Any]:
    """Run inside the engine process after start: what it runs on, as the engine sees it."""
    info: dict[str, Any] = {
        "env": {k: os.environ.get(k) for k in
                ("FLEX_COMPUTE", "FLEX_DEVICE", "AIU_WORLD_SIZE", "AIU_WORLD_RANK_0",
                 "TORCH_SENDNN_CACHE_DIR")},
    }
    try:
        # deferred: a heavy import, paid only where this runs
        import vllm_spyre.envs as envs_spyre

        info["dynamo_backend"] = envs_spyre.VLLM_SPYRE_DYNAMO_BACKEND
    except ImportError:
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


def verify_card_engine(cfg: Any, info: dict[str, Any], log_text: str) -> str | None:
    """None when the engine of ``cfg`` runs vllm-spyre's Spyre platform with the sendnn backend
    on the leased card; else what was expected and what was seen."""
    if cfg.target != "spyre" or cfg.backend != "sendnn" or not cfg.device:
        return None
    expected_addr = dict(cfg.extra_env).get("HIL_CARD_ADDRESS", "")
    card = info.get("card", {})
    opened = opened_devices(log_text)
    seen_addrs = sorted({a for o in opened for a in _PCI.findall(o)})
    expected = {
        "platform": "SpyrePlatform",
        "dynamo backend": "sendnn",
        "FLEX_COMPUTE": "SENTIENT",
        "opened": f"SEN:VFIO:{expected_addr}" if expected_addr else "SEN:VFIO:<the leased card>",
    }
    seen = {
        "platform": info.get("platform"),
        "dynamo backend": card.get("dynamo_backend"),
        "FLEX_COMPUTE": (card.get("env") or {}).get("FLEX_COMPUTE"),
        "opened": ", ".join(opened) or "nothing (no 'Opened:' line in the engine log)",
    }
    problems = [k for k in ("platform", "dynamo backend", "FLEX_COMPUTE") if seen[k] != expected[k]]
    vfio = [o for o in opened if o.startswith("SEN:VFIO")]
    if not vfio or (expected_addr and seen_addrs != [expected_addr]):
        problems.append("opened")
    if not problems:
        return None
    lines = [f"engine {cfg.label} on {cfg.device} is not the leased card's Spyre sendnn engine"
             f" (wrong {', '.join(problems)})"]
    lines += [f"  {k}: expected {expected[k]}, seen {seen[k]}" for k in expected]
    if "opened" in problems and not opened:
        lines.append("  the runtime logs the card it opens at DTLOG_LEVEL=INFO; check that the"
                     " inventory env does not lower it")
    return "\n".join(lines)


def log_since(path: Path, offset: int) -> str:
    """The engine log from ``offset`` on (this start's part of a log shared by restarts)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


@dataclass
class CardLedger:
    """Engine starts and stops per card, with times: the run's record that a card held at most
    one live engine at any moment and started each configuration once."""

    events: list[dict[str, Any]] = field(default_factory=list)
    _live: dict[str, str] = field(default_factory=dict)  # engine key -> device

    def started(self, cfg: Any, ok: bool = True) -> None:
        self.events.append({"event": "start" if ok else "refused", "device": cfg.device,
                            "config": cfg.label, "key": cfg.key, "time": time.time()})
        if ok:
            self._live[cfg.key] = cfg.device

    def closed(self, key: str) -> None:
        device = self._live.pop(key, None)
        if device is not None:
            self.events.append({"event": "close", "device": device, "key": key, "time": time.time()})

    def mark_replacement(self, key: str) -> None:
        """The last start of ``key`` replaced a dirty engine of it (not a second configuration
        start: harness.engine.hygiene)."""
        for e in reversed(self.events):
            if e["key"] == key and e["event"] == "start":
                e["replacement"] = True
                return

    def live_on(self, device: str) -> list[str]:
        return [k for k, d in self._live.items() if d == device]

    def to_list(self) -> list[dict[str, Any]]:
        return list(self.events)


def ledger_problems(events: list[dict[str, Any]]) -> list[str]:
    """What breaks one-engine-per-card in a ledger's events (merged from every worker): two live
    engines on one card at a moment, or a configuration started twice on one card."""
    problems: list[str] = []
    live: dict[str, set[str]] = {}
    starts: dict[tuple[str, str], int] = {}
    for e in sorted(events, key=lambda e: e["time"]):
        dev = e["device"]
        if e["event"] in ("start", "refused") and not e.get("replacement"):
            starts[(dev, e["key"])] = starts.get((dev, e["key"]), 0) + 1
        if e["event"] == "start":
            held = live.setdefault(dev, set())
            if held:
                problems.append(f"{dev}: {e['config']} started while {sorted(held)} still live")
            held.add(e["key"])
        elif e["event"] == "close":
            live.get(dev, set()).discard(e["key"])
    problems += [f"{dev}: configuration {key} started {n} times" for (dev, key), n in starts.items()
                 if n > 1]
    return problems


def summary_lines(events: list[dict[str, Any]]) -> list[str]:
    """Per card, the configurations it ran and their start times (for the run summary)."""
    lines = []
    for dev in sorted({e["device"] for e in events}):
        starts = [e for e in events if e["device"] == dev and e["event"] in ("start", "refused")]
        runs = ", ".join(
            f"{e['config']} [{e['key'].rsplit(':', 1)[-1]}] at"
            f" {time.strftime('%H:%M:%S', time.localtime(e['time']))}"
            + (" (refused)" if e["event"] == "refused" else "")
            + (" (replacing a dirty engine)" if e.get("replacement") else "")
            for e in sorted(starts, key=lambda e: e["time"]))
        lines.append(f"card {dev}: {len(starts)} configuration(s): {runs}")
    problems = ledger_problems(events)
    lines += [f"ONE-ENGINE-PER-CARD VIOLATION: {p}" for p in problems]
    return lines


def append_card_summary(stats_dir: Path, summary: Path) -> str:
    """Add a "Cards" section (per card, its configurations and start times) to the run's
    summary.md from the workers' statistics; returns the section ('' when no card ran)."""
    events: list[dict[str, Any]] = []
    for f in sorted(stats_dir.glob("*.json")) if stats_dir.is_dir() else []:
        events += json.loads(f.read_text()).get("cards", [])
    if not events:
        return ""
    section = "\n".join(["## Cards", "", *[f"- {line}" for line in summary_lines(events)], ""])
    with open(summary, "a", encoding="utf-8") as f:
        f.write("\n" + section)
    return section


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
