"""Property-based tests of the files a lab writes: random inventory and quarantine documents
(TOML text of random structures: random keys and types, duplicate ids and addresses, odd
strings, nesting) are either loaded, and then every device means something (one entry per id
and per address, addresses in their kind's format, no variable the harness sets itself), or
refused with an InventoryError / ValueError naming the file and what is wrong; never another
exception.

Bounded (hypothesis max_examples): a few seconds in all."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import targets
from harness.lab.inventory import InventoryError, load_inventory, owned_env
from harness.lab.quarantine import load_quarantine

# The formats the kinds declare, written out again here: the oracle of this test.
FORMATS = {
    "spyre": r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]",
    "neuron": r"(?:/dev/)?neuron\d+",
}
# What a refusal names: the file, and a field, a device or the syntax.
FIELDS = ("device", "id", "kind", "address", "env", "cores", "engine", "features", "health",
          "backend", "TOML", "unknown field", "UTF-8")

ODD = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
SCALAR = st.one_of(ODD, st.integers(-5, 10**20), st.booleans(),
                   st.floats(allow_nan=True, allow_infinity=True))
JUNK = st.recursive(SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b", "id"]), inner,
                                                  max_size=3)), max_leaves=6)



def mostly(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` about seven times in eight, else ``bad``: many documents get far enough to
    be checked for meaning, some break anywhere."""
    return st.integers(0, 7).flatmap(lambda n: bad if n == 0 else good)


IDS = mostly(st.sampled_from(["card0", "card1", "n0", "c.2"]),
             st.one_of(st.sampled_from(["../x", ".hidden", "", "a b", "x" * 65]), JUNK))
KINDS = st.sampled_from(["spyre", "neuron", "cpu"])
GOOD_ADDRESSES = {
    "spyre": st.sampled_from(["0000:1a:00.0", "0000:1A:00.0", "0000:1a:00.1", "0000:3b:00.0"]),
    "neuron": st.sampled_from(["neuron0", "/dev/neuron0", "neuron1"]),
}
BAD_ADDRESSES = st.sampled_from([
    "/etc", "1a:00.0", "0000:1a:00.8", "/dev/sda", "3", "", " ", "0000:1a:00.0\n",
    "/sys/bus/pci/devices/0000:1a:00.0", "neuron0", "0000:1a:00.0"])
GOOD_ENV = st.dictionaries(st.sampled_from(["A", "FLEX_DEVICE", "DTLOG_LEVEL"]),
                           st.one_of(ODD, st.integers(0, 9), st.booleans()), max_size=2)
ENV_KEYS = st.sampled_from([
    "HIL_DEVICE_ID", "HIL_ENGINE_AUTHKEY", "HIL_ALLOW_EXTERNAL_FAULTS", "AIU_WORLD_RANK_0",
    "NEURON_RT_VISIBLE_CORES", "HIL_NEURON_ENGINE", "VLLM_PLUGINS", "HIL_CARD_ADDRESS",
    "HIL_FAULTS", "1BAD", "a-b", "MASTER_PORT"])
ENV_VALUES = st.one_of(BAD_ADDRESSES, GOOD_ADDRESSES["spyre"],
                       st.sampled_from(["0-1", "1-0", "x", "crash-engine:when=start",
                                        "os.system:command=id", "0,0"]),
                       st.integers(-2, 9), st.booleans(), ODD)
CORES = mostly(st.sampled_from(["0-1", "0", "0-3", "0,2-3", "4-7"]),
               st.sampled_from(["1-0", "0,0", "x", "", "0--1", "-", "0-1,1"]))
ENGINE = mostly(
    st.fixed_dictionaries({}, optional={
        "tensor_parallel_size": mostly(st.integers(1, 8), st.one_of(st.integers(-1, 0),
                                                                    st.booleans(), ODD)),
        "dtype": st.sampled_from(["float32", "bfloat16", "int4"]),
        "override_neuron_config": mostly(st.just({}), JUNK)}),
    JUNK)


@st.composite
def device(draw: Any) -> dict[str, Any]:
    """A device entry: fields that fit its kind three times in four, else anything."""
    kind = draw(mostly(KINDS, st.one_of(st.sampled_from(["not-a-kind", "Spyre"]), JUNK)))
    d: dict[str, Any] = {"id": draw(IDS), "kind": kind}
    good_address = GOOD_ADDRESSES.get(kind) if isinstance(kind, str) else None
    if draw(st.booleans()):
        d["address"] = draw(mostly(good_address if good_address is not None else BAD_ADDRESSES,
                                   st.one_of(BAD_ADDRESSES, JUNK)))
    if draw(st.booleans()):
        d["env"] = draw(mostly(GOOD_ENV, st.one_of(
            st.dictionaries(ENV_KEYS, ENV_VALUES, min_size=1, max_size=3), JUNK)))
    if kind == "spyre" and draw(st.booleans()):
        d["backend"] = draw(mostly(st.sampled_from(["sendnn", "eager"]), JUNK))
        d["features"] = draw(mostly(
            st.lists(st.sampled_from(["sb", "cb", "cp"]), max_size=3, unique=True),
            st.one_of(st.just(["zz"]), JUNK)))
    if (kind == "neuron" or draw(st.integers(0, 9)) == 0) and draw(st.booleans()):
        d["cores"] = draw(mostly(CORES, JUNK))
    if (kind == "neuron" or draw(st.integers(0, 9)) == 0) and draw(st.booleans()):
        d["engine"] = draw(ENGINE)
    if draw(st.booleans()):
        d["health"] = draw(mostly(st.sampled_from(["ok", "broken", "maintenance"]),
                                  st.one_of(st.just("meh"), JUNK)))
    if draw(st.integers(0, 19)) == 0:
        d["colour"] = draw(JUNK)
    return d


INVENTORY = mostly(
    st.fixed_dictionaries({"device": st.lists(device(), min_size=1, max_size=3)}),
    st.dictionaries(st.sampled_from(["device", "devices", "known"]), JUNK, max_size=2))

KNOWN = st.fixed_dictionaries(
    {"test": mostly(st.sampled_from(["a::t[x]", "a::t[*]", "b::u", "*"]),
                    st.one_of(st.just(""), JUNK)),
     "reason": mostly(st.just("r"), st.one_of(ODD, JUNK)),
     "issue": mostly(st.just("I-1"), st.one_of(ODD, JUNK))},
    optional={"tset": JUNK})
QUARANTINE = mostly(
    st.fixed_dictionaries({"known": st.lists(KNOWN, max_size=4)}, optional={"knwon": JUNK}),
    st.dictionaries(st.sampled_from(["known", "x"]), JUNK, max_size=2))


# ------------------------------------------------------------------ TOML text of a structure


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) \
            else repr(v)
    if isinstance(v, str):  # a TOML basic string: control characters escaped, the rest as is
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def to_toml(doc: dict[str, Any]) -> str:
    """TOML text: lists of tables as [[name]] blocks (the form labs write), the rest inline."""
    lines = []
    for key, value in doc.items():
        if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            continue
        lines.append(f"{_toml_value(key)} = {_toml_value(value)}")
    for key, value in doc.items():
        if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            for table in value:
                lines += ["", f"[[{_toml_value(key)}]]"]
                lines += [f"{_toml_value(k)} = {_toml_value(x)}" for k, x in table.items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the properties


def assert_meaningful(inv: Any) -> None:
    """Every device of a loaded inventory means something."""
    ids = [d.id for d in inv.devices]
    assert len(ids) == len(set(ids)), ids
    seen = set()
    for d in inv.devices:
        dk = targets.device_kinds()[d.kind]
        env = dict(d.env)
        address = d.address or (env.get(dk.address_env) if dk.address_env else None)
        if d.kind in FORMATS and address is not None:
            assert re.fullmatch(FORMATS[d.kind], address, re.IGNORECASE), (d.kind, address)
            key = (d.kind, dk.canonical_address(address))
            assert key not in seen, key
            seen.add(key)
        cores = env.get("NEURON_RT_VISIBLE_CORES")
        if d.kind == "neuron" and cores is not None:
            parts = [re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", p) for p in cores.split(",")]
            assert all(m and int(m.group(1)) <= int(m.group(2) or m.group(1)) for m in parts), cores
            tp = json.loads(env.get("HIL_NEURON_ENGINE", "{}")).get("tensor_parallel_size", 1)
            count = sum(int(m.group(2) or m.group(1)) - int(m.group(1)) + 1 for m in parts if m)
            assert count >= tp, (cores, tp)
        # A Neuron device's engine table travels as HIL_NEURON_ENGINE, set by its kind.
        made = {"HIL_NEURON_ENGINE"} if d.kind == "neuron" else set()
        assert not (set(env) & set(owned_env(dk))) - made, env


def assert_names_file(err: Exception, path: Path) -> None:
    text = str(err)
    assert str(path) in text, text
    assert any(f in text for f in FIELDS), text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(doc=INVENTORY)
def test_random_inventory_loads_meaningfully_or_is_refused_by_name(tmp_path, doc):
    path = tmp_path / "inv.toml"
    path.write_text(to_toml(doc), encoding="utf-8")
    try:
        inv = load_inventory(path, root=tmp_path)
    except (InventoryError, ValueError) as e:
        assert_names_file(e, path)
        return
    assert_meaningful(inv)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(doc=QUARANTINE)
def test_random_quarantine_loads_meaningfully_or_is_refused_by_name(tmp_path, doc):
    path = tmp_path / "q.toml"
    path.write_text(to_toml(doc), encoding="utf-8")
    try:
        known = load_quarantine(path, required=True)
    except ValueError as e:
        assert str(path) in str(e), str(e)
        return
    tests = [k.test for k in known]
    assert len(tests) == len(set(tests)), tests
    assert all(isinstance(x, str) and x for k in known for x in (k.test, k.reason, k.issue))
