"""Property-based tests of the lab's newer inventory surfaces: generated TOML inventories with
their own geometries (``[geometry.NAME]``, ``models``) and card groups (``[[group]]``) are
loaded exactly when every model is one a run can name and every group can be formed; else
refused with one InventoryError naming the file and the geometry or group, never another
exception, and nothing is written. A geometry the inventory could not give is never said as
"unknown geometry" when the file itself is at fault."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.geometry.catalog import GeometryError, add_lab_geometries, load_geometries
from harness.lab.inventory import InventoryError, load_inventory, read_inventory_document

TINY = ["tiny-llama", "tiny-granite"]
DEVICES = ["card0", "card1", "card2"]
SHAPE = 'description = "a lab shape"\nmax_model_len = 512\nmax_num_seqs = 4\nchunk_size = 128\n'


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def device(i: str) -> str:
    return f'[[device]]\nid = "{i}"\nkind = "spyre"\nbackend = "eager"\n'


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


MODELS = st.lists(st.sampled_from([*TINY, "nope-model", "{sound}", "{no-config}", "{missing}",
                                   "Tiny-Llama", "tiny-llama "]), min_size=1, max_size=3)
GROUPS = st.lists(st.lists(st.sampled_from([*DEVICES, "card9"]), max_size=4), max_size=2)


@pytest.fixture
def lab(tmp_path):
    sound = tmp_path / "models" / "sound"
    sound.mkdir(parents=True)
    (sound / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "models" / "no-config").mkdir()
    return tmp_path


def _model(m: str, lab: Path) -> str:
    return str(lab / "models" / m[1:-1]) if m.startswith("{") else m


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(geometries=st.lists(st.one_of(st.none(), MODELS), max_size=2), groups=GROUPS,
       twice=st.booleans())
def test_a_generated_lab_inventory_loads_exactly_when_its_geometries_and_groups_mean_something(
        lab, geometries, groups, twice):
    body = "".join(device(d) for d in DEVICES)
    if twice:  # a key twice: the TOML error is what every reader says, first
        body += 'kind = "spyre"\n'
    for n, models in enumerate(geometries):
        body += f"[geometry.lab{n}]\n{SHAPE}"
        if models is not None:
            body += f"models = {_toml_list([_model(m, lab) for m in models])}\n"
    for n, members in enumerate(groups):
        body += f'[[group]]\nid = "g{n}"\ndevices = {_toml_list(members)}\n'
    path = lab / "inv.toml"
    path.write_text(body)
    before = snapshot(lab)
    bad_model = next((m for ms in geometries if ms for m in ms
                      if m not in TINY and m != "{sound}"), None)
    bad_group = next((g for g in groups if len(g) < 2 or len(set(g)) < len(g) or "card9" in g),
                     None)
    try:
        load_inventory(path)
    except InventoryError as e:
        message = str(e)
        assert message.startswith(f"{path}") and "\n" not in message.strip(), message
        assert len(message) < 1200, message
        if twice:
            assert "invalid TOML" in message and "defined twice" in message, message
        elif bad_model is not None and "geometry" in message:
            assert f"models: {_model(bad_model, lab)!r}" in message, message
        else:
            assert bad_group is not None and "group #" in message, message
            assert "at least one entry" not in message
    else:
        assert not twice and bad_model is None and bad_group is None, body
    assert snapshot(lab) == before


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(models=MODELS)
def test_a_lab_geometry_is_read_exactly_when_a_run_can_name_its_models(lab, models):
    named = [_model(m, lab) for m in models]
    table = {"description": "d", "max_model_len": 512, "max_num_seqs": 4, "chunk_size": 128,
             "models": named}
    bad = [m for m in models if m not in TINY and m != "{sound}"]
    try:
        geometries = add_lab_geometries(load_geometries(), {"lab1": table}, "inv.toml")
    except GeometryError as e:
        assert bad, named
        assert str(e).startswith(f"inv.toml: geometry 'lab1': models: {_model(bad[0], lab)!r} ")
        assert "tiny-llama, tiny-granite" in str(e)
    else:
        assert not bad and geometries["lab1"].models == tuple(named)


def test_the_inventory_is_read_once_for_devices_and_geometries(tmp_path):
    path = tmp_path / "inv.toml"
    path.write_text(device("card0") + 'kind = "spyre"\n')
    with pytest.raises(InventoryError, match=r"inv.toml: invalid TOML: line 5, column 15: key"
                       r" 'kind' is defined twice"):
        read_inventory_document(path)
    with pytest.raises(InventoryError, match="inventory file not found"):
        read_inventory_document(tmp_path / "nope.toml")
