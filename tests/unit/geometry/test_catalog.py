"""The geometry catalog: the shipped file reads, every key and value is checked, a selection
names known geometries once, and a geometry the machine cannot hold is refused with its need."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core.config import ConfigError
from harness.geometry.catalog import (
    DEFAULT_GEOMETRY,
    KEYS,
    GeometryError,
    add_lab_geometries,
    load_geometries,
    parse_geometry,
    select_geometries,
)
from harness.geometry.fit import GIB, fit_problem, kv_need
from harness.targets import registry_geometry
from harness.targets.spyre.registry_entry import MODEL_CONFIG_FILE_ENV, entry_geometry

BASE = {"description": "d", "max_model_len": 256, "max_num_seqs": 4, "chunk_size": 128}


def test_the_shipped_geometries_read_and_hold_what_their_names_promise():
    g = load_geometries()
    assert DEFAULT_GEOMETRY in g and {"card", "tight", "tkv-bound"} <= set(g)
    assert g["small"].pool_holds_batch is True and not g["small"].tkv_binds
    assert g["tight"].pool_holds_batch is False  # admission limited by blocks
    assert g["tkv-bound"].tkv_binds
    card = g["card"]  # what a card compiles: context >= 512, batch a power of two >= 4
    assert card.max_model_len >= 512 and card.max_num_seqs >= 4
    assert card.max_num_seqs & (card.max_num_seqs - 1) == 0 and card.pool == "device"


def test_small_is_the_suites_own_shape():
    small = load_geometries()["small"]
    assert (small.max_model_len, small.max_num_seqs, small.chunk_size) == (256, 4, 128)


@pytest.mark.parametrize("table, words", [
    ({**BASE, "max_model_len": "256"}, "max_model_len = '256' must be an integer"),
    ({**BASE, "max_num_seqs": 0}, "max_num_seqs = 0 must be positive"),
    ({**BASE, "max_num_seqs": True}, "must be an integer"),
    ({**BASE, "bogus": 1}, "unknown key(s) 'bogus'"),
    ({k: v for k, v in BASE.items() if k != "chunk_size"}, "chunk_size (tokens per prefill chunk) is required"),
    ({**BASE, "pool": "huge"}, "pool = 'huge'; known: full-batch, device"),
    ({**BASE, "pool": "device", "num_blocks": 9}, "give one of pool, pool_requests, num_blocks"),
    ({**BASE, "pool_requests": 5}, "pool_requests = 5 is more than max_num_seqs = 4"),
    ({**BASE, "chunk_size": 512}, "chunk_size = 512 is longer than max_model_len = 256"),
    ({**BASE, "prefix_caching": "yes"}, "prefix_caching = 'yes' must be true or false"),
])
def test_a_bad_key_or_value_is_refused_naming_it(table, words):
    with pytest.raises(GeometryError) as e:
        parse_geometry("mine", table, "lab.toml")
    assert "lab.toml: geometry 'mine'" in str(e.value) and words in str(e.value)


def test_selection_names_known_geometries_once_in_order():
    known = load_geometries()
    assert [g.name for g in select_geometries("", known)] == [DEFAULT_GEOMETRY]
    assert [g.name for g in select_geometries("tight, small", known)] == ["tight", "small"]
    with pytest.raises(GeometryError, match="unknown geometry 'huge'; known: small, card"):
        select_geometries("huge", known)
    with pytest.raises(GeometryError, match="named twice"):
        select_geometries("tight,tight", known)


def test_a_bom_and_a_bad_file_are_refused_naming_the_file(tmp_path):
    bom = tmp_path / "g.toml"
    bom.write_bytes(b"\xef\xbb\xbf[small]\n")
    with pytest.raises(GeometryError, match="byte-order mark"):
        load_geometries(bom)
    dup = tmp_path / "dup.toml"
    dup.write_text('[a]\ndescription = "x"\ndescription = "y"\n')
    with pytest.raises(GeometryError, match=r"dup\.toml: .*line 3"):
        load_geometries(dup)


def test_a_geometry_the_machine_cannot_hold_is_refused_with_its_need():
    config = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096}
    lab = parse_geometry("lab-32k", {**BASE, "max_model_len": 32768, "max_num_seqs": 32,
                                     "chunk_size": 1024}, "inventory")
    need = kv_need(lab, config)
    assert need == 32768 * 32 * 2 * 32 * 8 * 128 * 4  # tokens x K,V x layers x kv heads x dim x fp32
    problem = fit_problem(lab, "granite-8b", config, available=24 * GIB)
    assert problem and "needs about 256.0 GiB of KV cache for model granite-8b" in problem
    assert "at least 1024 GiB available" in problem
    small = load_geometries()["small"]
    assert fit_problem(small, "tiny", {"num_hidden_layers": 2, "num_attention_heads": 4,
                                       "hidden_size": 128}, available=24 * GIB) is None


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from([*KEYS, "other"]),
                       st.one_of(st.integers(-3, 5000), st.text(max_size=8), st.booleans()),
                       max_size=len(KEYS) + 1))
def test_any_table_parses_or_is_refused_with_a_geometry_error(table):
    try:
        g = parse_geometry("fuzz", table, "fuzz.toml")
    except GeometryError as e:
        assert str(e).startswith("fuzz.toml: geometry 'fuzz'")
        return
    assert g.max_model_len > 0 and g.max_num_seqs > 0 and 0 < g.chunk_size <= g.max_model_len
    assert sum(x is not None for x in (g.pool, g.pool_requests, g.num_blocks)) == 1


GRANITE = "ibm-granite/granite-3.3-8b-instruct"


def test_a_lab_geometry_takes_its_shape_from_a_registry_entry(monkeypatch):
    monkeypatch.delenv(MODEL_CONFIG_FILE_ENV, raising=False)
    try:
        entry = entry_geometry(GRANITE, {"tensor_parallel_size": 4})  # what the registry says
    except ConfigError as e:
        pytest.skip(f"no plugin registry with {GRANITE} here: {e}")
    table = {"from_registry": GRANITE, "tensor_parallel_size": 4, "chunk_size": 1024}
    g = add_lab_geometries({}, {"lab-8b": table}, "lab.toml", resolve=registry_geometry)["lab-8b"]
    assert {k: getattr(g, k) for k in entry} == entry and entry["pool"] == "device"
    assert g.chunk_size == 1024 and g.source == "lab.toml"
    assert g.description == f"the shape registry entry {GRANITE} is served at"
    with pytest.raises(GeometryError, match="lab.toml: geometry 'lab-x': from_registry ="
                       " 'lab/none': the registry .* has no entry 'lab/none'"):
        add_lab_geometries({}, {"lab-x": {**table, "from_registry": "lab/none"}}, "lab.toml",
                           resolve=registry_geometry)


def test_a_registry_entry_the_resolver_refuses_names_the_file_the_geometry_and_the_entry():
    def refuse(entry, chosen):
        raise ConfigError(f"no entry {entry!r} here (asked {dict(chosen)})")

    table = {"from_registry": "lab/none", "max_num_seqs": 4, "chunk_size": 64}
    with pytest.raises(GeometryError) as e:
        add_lab_geometries({}, {"lab-x": table}, "lab.toml", resolve=refuse)
    assert str(e.value) == ("lab.toml: geometry 'lab-x': from_registry = 'lab/none': no entry"
                            " 'lab/none' here (asked {'max_num_seqs': 4})")
    with pytest.raises(GeometryError, match="no installed kind reads a model registry"):
        add_lab_geometries({}, {"lab-x": table}, "lab.toml")


def test_a_shipped_geometry_may_not_take_its_shape_from_a_registry():
    with pytest.raises(GeometryError, match="unknown key\\(s\\) 'from_registry'"):
        parse_geometry("card", {**BASE, "from_registry": GRANITE}, "fixtures/geometries.toml")
    assert parse_geometry("lab", {**BASE, "models": ["tiny-llama"]}, "lab.toml",
                          lab=True).models == ("tiny-llama",)
    with pytest.raises(GeometryError, match="models: 'm' is neither a tiny model nor a folder"):
        parse_geometry("lab", {**BASE, "models": ["m"]}, "lab.toml", lab=True)
