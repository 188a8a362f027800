"""Ports an engine binds: picked in the engine process, free when picked, outside the kernel's
ephemeral range, never one to avoid; an address-in-use failure told apart by its text."""

from __future__ import annotations

import random
import socket

import pytest

from harness.core import ports
from harness.core.ports import (
    AVOID_ENV,
    BIND_PORTS_ENV,
    PICKED_LINE,
    address_in_use,
    pick_bind_ports,
    pick_port,
    ports_picked,
)

# torch.distributed's refusal as a Spyre engine's rank 0 raised it (torch 2.13), and vLLM's
# engine start as the harness reports it.
DIST_NETWORK_ERROR = ("The server socket has failed to listen on any local network address."
                      " port: 32929, useIpv6: false, code: -98, name: EADDRINUSE, message:"
                      " address already in use")


def test_a_picked_port_is_free_below_the_ephemeral_range_and_never_one_to_avoid():
    rng = random.Random(7)
    first = pick_port(rng=random.Random(7), ephemeral=(32768, 60999))
    assert ports.PORT_FLOOR <= first < 32768
    with socket.socket() as held:  # the port the same choice would give is taken now
        held.bind(("", first))
        held.listen()
        again = pick_port(rng=random.Random(7), ephemeral=(32768, 60999))
    assert again != first and ports.PORT_FLOOR <= again < 32768
    avoid = {pick_port(rng=random.Random(7), ephemeral=(32768, 60999))}
    assert pick_port(avoid, rng=random.Random(7), ephemeral=(32768, 60999)) not in avoid
    assert all(pick_port(rng=rng) != 0 for _ in range(20))


def test_with_no_room_below_the_ephemeral_range_the_kernel_gives_the_port():
    port = pick_port(ephemeral=(1024, 65535))
    assert 0 < port < 65536
    assert pick_port({port}, ephemeral=(1024, 65535)) != port


def test_the_engine_fills_each_named_variable_with_its_own_port_and_says_so(capsys):
    env = {BIND_PORTS_ENV: "MASTER_PORT, OTHER_PORT", AVOID_ENV: "1,2"}
    picked = pick_bind_ports(env)
    assert set(picked) == {"MASTER_PORT", "OTHER_PORT"}
    assert picked["MASTER_PORT"] != picked["OTHER_PORT"]
    assert env["MASTER_PORT"] == str(picked["MASTER_PORT"])
    out = capsys.readouterr().out
    assert ports_picked(out) == [picked["MASTER_PORT"], picked["OTHER_PORT"]]
    assert f"{PICKED_LINE} MASTER_PORT={picked['MASTER_PORT']}" in out


def test_an_earlier_choice_is_never_kept(monkeypatch):
    # A value inherited (a parent's environment, a lab's export, an earlier start's) is replaced.
    env = {BIND_PORTS_ENV: "MASTER_PORT", "MASTER_PORT": "32929", AVOID_ENV: "32929"}
    for _ in range(20):
        pick_bind_ports(env)
        assert env["MASTER_PORT"] != "32929"
    assert pick_bind_ports({}) == {}  # an engine that binds nothing of the harness's


@pytest.mark.parametrize("text", [
    DIST_NETWORK_ERROR,
    "OSError: [Errno 98] Address already in use",
    "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:5555')",
])
def test_an_address_in_use_is_recognised(text):
    assert address_in_use(text)


@pytest.mark.parametrize("text", [
    "ValueError: Number of pages available on Spyre (3) is not enough",
    "DistNetworkError: Connection reset by peer",
    "",
])
def test_other_failures_are_not_an_address_in_use(text):
    assert not address_in_use(text)
