"""Ports an engine binds: picked in the engine process as it starts, never by the harness ahead.

A port picked by the harness when it configures an engine is free then, and may be taken by
another run on the host (its engines, their connections) by the time the engine binds it,
seconds later: the engine's start then fails with ``EADDRINUSE``, which is no defect of the
stack. So the harness names the variables an engine needs a port in (``BIND_PORTS_ENV``: Spyre's
``MASTER_PORT``, torch.distributed's ``env://`` rendezvous) and the engine process fills them
just before vLLM is built (``pick_bind_ports``), and a start that still finds an address in use
is restarted with other ports (``harness.engine.bind_retry``).
"""

from __future__ import annotations

import os
import random
import re
import socket
from collections.abc import Collection, MutableMapping
from pathlib import Path

BIND_PORTS_ENV = "HIL_BIND_PORTS"  # variables the engine fills with a port it picks: "A,B"
AVOID_ENV = "HIL_PORTS_AVOID"  # ports an earlier start of this engine found taken: "P,Q"
PICKED_LINE = "[hil] port picked at bind:"  # the engine log's line: "... MASTER_PORT=20123"
# The lowest port picked where the kernel's ephemeral range leaves room below it: ports under
# 20000 are where hosts' own services listen.
PORT_FLOOR = 20000
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default ip_local_port_range

# What an engine start refused because an address was taken says: torch.distributed's
# DistNetworkError ("... port: 32929, useIpv6: false, code: -98, name: EADDRINUSE, message:
# address already in use"), Python's OSError ("[Errno 98] Address already in use"), ZMQ's.
ADDRESS_IN_USE = re.compile(r"EADDRINUSE|address already in use|\[Errno 98\]", re.IGNORECASE)
_PICKED = re.compile(re.escape(PICKED_LINE) + r" \w+=(\d+)")


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range for ports it hands out itself (``bind`` to port 0, the source port
    of every outgoing connection on the host)."""
    try:
        low, high = (int(x) for x in path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def bindable(port: int) -> bool:
    """Whether a TCP port can be bound on every address now (nothing listens on it, no
    connection holds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def pick_port(avoid: Collection[int] = (), rng: random.Random | None = None,
              ephemeral: tuple[int, int] | None = None) -> int:
    """A TCP port nothing is bound to now, never one of ``avoid``: at random below the kernel's
    ephemeral range where it leaves a thousand ports there (the kernel never hands those out by
    itself, so only another explicit choice can take it before the engine binds it), else one
    the kernel gives."""
    rng = rng or random.SystemRandom()
    low, _ = ephemeral or ephemeral_range()
    if low - PORT_FLOOR >= 1000:
        for _ in range(200):
            port = rng.randrange(PORT_FLOOR, low)
            if port not in avoid and bindable(port):
                return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port


def pick_bind_ports(environ: MutableMapping[str, str] | None = None) -> dict[str, int]:
    """Fill each variable ``BIND_PORTS_ENV`` names with a port picked now (``pick_port``, none
    of ``AVOID_ENV``'s, each another); says each in the log (``PICKED_LINE``). Called in the
    engine process just before vLLM is built, so a forked engine never carries its parent's
    choice and a restarted one never repeats its last."""
    env = os.environ if environ is None else environ
    names = [n.strip() for n in env.get(BIND_PORTS_ENV, "").split(",") if n.strip()]
    avoid = {int(p) for p in env.get(AVOID_ENV, "").split(",") if p.strip().isdigit()}
    picked: dict[str, int] = {}
    for name in names:
        port = pick_port(avoid | set(picked.values()))
        env[name] = str(port)
        picked[name] = port
        print(f"{PICKED_LINE} {name}={port}", flush=True)
    return picked


def address_in_use(text: str) -> bool:
    """Whether an engine's error or log says an address it binds was in use."""
    return bool(ADDRESS_IN_USE.search(text))


def ports_picked(log_text: str) -> list[int]:
    """The ports an engine log says were picked at bind (``PICKED_LINE``), in order."""
    return [int(p) for p in _PICKED.findall(log_text)]
