"""harness.session.build: the one way a session is built (pytest's ``hil`` fixture, ``hil
explore``, ``hil nightly --explore``), each setting checked there once, nothing written
before the session opens."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from harness.core.paths import REPO_ROOT
from harness.explore.session import LIVE_ENGINES, SessionSettings, check_session
from harness.plugin.options import command_values
from harness.session.build import (
    BadSetting,
    check_environment,
    check_stack,
    session_inventory,
    session_options,
)
from tests.bad_input import write


@pytest.fixture(autouse=True)
def no_hil_variables(monkeypatch):
    import os

    for name in [n for n in os.environ if n.startswith("HIL_")]:
        monkeypatch.delenv(name)


def test_every_session_is_built_in_one_place():
    """No module of the harness but harness/session/build.py makes a SessionOptions, a
    HilSession or its leases, or points the engines' caches: a second way would check (and
    honour) other settings than pytest's, as hil explore's own did."""
    made = re.compile(r"\b(SessionOptions|HilSession|LeaseManager)\(|VLLM_CACHE_ROOT\", ")
    others = [f"{p.relative_to(REPO_ROOT)}:{n}"
              for p in sorted((REPO_ROOT / "harness").rglob("*.py"))
              if p != REPO_ROOT / "harness" / "session" / "build.py"
              for n, line in enumerate(p.read_text().splitlines(), 1)
              if made.search(line) and not line.lstrip().startswith(("class ", "#"))]
    assert others == []


def test_the_search_session_is_pytests_but_what_the_search_decides(tmp_path):
    """Built from the same declared options, the search's options differ from a pytest run's
    only where the search decides itself: its live engines, triage, teacher forcing, and the
    arguments it takes (folders, engine timeout, stack)."""
    settings = SessionSettings(cache_dir=tmp_path / "c", reports_dir=tmp_path / "r",
                               stack="default", call_timeout=30.0)
    searched = check_session(settings).opts
    as_pytest = session_options(command_values({
        "--hil-cache-dir": str(tmp_path / "c"), "--hil-reports-dir": str(tmp_path / "r"),
        "--stack": "default", "--engine-timeout": 30.0}))
    assert searched == replace(as_pytest, max_live_engines=LIVE_ENGINES, triage=False,
                               teacher_forcing=False)
    assert not (tmp_path / "c").exists() and not (tmp_path / "r").exists()


def test_a_bad_variable_is_refused_before_any_option_is_read(monkeypatch):
    monkeypatch.setenv("HIL_ENGINE_START", "zygote")

    def value(name):
        raise AssertionError(f"{name} read before the environment was checked")

    with pytest.raises(BadSetting, match=r"^env HIL_ENGINE_START: 'zygote' is not a known"
                       r" value; expected one of platform, preload, fresh; fix or unset it$"):
        session_options(value)
    monkeypatch.setenv("HIL_ENGINE_START", "fresh")
    check_environment()


def test_an_options_bad_variable_is_refused_even_when_the_session_does_not_read_it(
        monkeypatch):
    monkeypatch.setenv("HIL_SHARD", "3/2")
    with pytest.raises(BadSetting, match=r"^env HIL_SHARD \(option --shard\): '3/2' is out of"
                       r" range.*; fix or unset HIL_SHARD$"):
        command_values({})
    assert command_values({"--shard": "1/2"})("--shard") == "1/2"  # given: the variable's unused


def test_the_inventory_and_stack_are_refused_with_their_own_messages(tmp_path):
    with pytest.raises(BadSetting, match="inventory file not found: "):
        session_inventory(str(tmp_path / "nope.toml"))
    bad = write(tmp_path, "inv.toml", "[[device]]\nid = 59\n")
    with pytest.raises(BadSetting, match=re.escape(str(bad))):
        session_inventory(str(bad))
    assert session_inventory("").source == "discovery"
    with pytest.raises(BadSetting, match=r"^--stack: no stack 'nope'"):
        check_stack("nope")
    assert check_stack("host") == "host"
