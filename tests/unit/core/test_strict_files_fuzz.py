"""Property-based tests of the strict reader (harness/core/strict_files.py) and the readers
that use it: random TOML and YAML documents, written as they are or with a key written twice,
a byte-order mark, or as JSON, are read back equal, or refused with a FileFormatError naming
the file, the line and what is wrong (a duplicate as a duplicate); an inventory or quarantine
file damaged at random (a line written twice, a BOM, a JSON rewrite) is refused with the
reader's own error naming the file, never another exception.

Bounded (hypothesis max_examples): a few seconds in all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.core.strict_files import FileFormatError, parse_toml, parse_yaml, read_text
from harness.lab.inventory import InventoryError, load_inventory
from harness.lab.quarantine import load_quarantine

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
KEYS = st.sampled_from(["id", "kind", "address", "a", "b", "health"])
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=8)
SCALARS = st.one_of(st.integers(-10**6, 10**6), st.booleans(), TEXT)
TABLE = st.dictionaries(KEYS, SCALARS, min_size=1, max_size=4)
DOCS = st.dictionaries(st.sampled_from(["name", "venv", "x", "y"]), SCALARS, max_size=3).flatmap(
    lambda top: st.dictionaries(st.sampled_from(["device", "known", "t"]), TABLE, max_size=2)
    .map(lambda tables: {**top, **tables}))


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return json.dumps(v, ensure_ascii=False)  # a JSON string is a TOML basic string


def toml_lines(doc: dict) -> list[str]:
    """``doc`` as TOML lines: its scalars first, then one [table] per table."""
    lines = [f"{k} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for name, table in doc.items():
        if isinstance(table, dict):
            lines += [f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in table.items())]
    return lines


@FUZZ
@given(doc=DOCS, damage=st.sampled_from(["none", "duplicate", "bom", "json"]),
       pick=st.integers(0, 100))
def test_a_random_toml_document_is_read_back_or_refused_naming_the_line(tmp_path, doc, damage,
                                                                         pick):
    lines = toml_lines(doc)
    path = tmp_path / "f.toml"
    keyed = [i for i, ln in enumerate(lines) if " = " in ln]
    if damage == "duplicate" and keyed:
        i = keyed[pick % len(keyed)]
        # The same key again, right after the line: in the same table.
        lines.insert(i + 1, lines[i].split(" = ")[0] + " = 1")
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        with pytest.raises(FileFormatError) as refused:
            parse_toml(read_text(path, "f"), str(path))
        key = lines[i].split(" = ")[0]
        assert str(refused.value).startswith(f"{path}: invalid TOML: line {i + 2}, column ")
        assert f"key {key!r} is defined twice" in str(refused.value)
        return
    if damage == "bom":
        path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode())
        with pytest.raises(FileFormatError, match="line 1: f starts with a byte-order mark"):
            read_text(path, "f")
        return
    if damage == "json" and doc:
        path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
        with pytest.raises(FileFormatError) as refused:
            parse_toml(read_text(path, "f"), str(path))
        assert str(refused.value).startswith(
            f"{path}: invalid TOML: line 1, column 1: this is JSON, not TOML")
        return
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert parse_toml(read_text(path, "f"), str(path)) == doc


@FUZZ
@given(doc=DOCS, duplicate=st.booleans(), pick=st.integers(0, 100))
def test_a_random_yaml_document_is_read_back_or_refused_naming_the_line(doc, duplicate, pick):
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    if not duplicate:
        assert parse_yaml(text, "f.yaml") == doc
        return
    lines = text.splitlines()
    # A top-level key again at the end: a mapping key written twice.
    tops = [ln.split(":")[0] for ln in lines if ln and not ln.startswith((" ", "-"))
            and ":" in ln and not ln.startswith(("'", '"'))]
    if not tops:
        return
    key = tops[pick % len(tops)]
    text += f"{key}: 1\n"
    with pytest.raises(FileFormatError) as refused:
        parse_yaml(text, "f.yaml")
    assert str(refused.value).startswith(f"f.yaml: invalid YAML at line {len(lines) + 1},"
                                         " column 1: ")
    assert "is defined twice in one mapping" in str(refused.value)


GOOD_INVENTORY = ('[[device]]\nid = "card0"\nkind = "spyre"\nbackend = "eager"\n'
                  '[[device]]\nid = "card1"\nkind = "cpu"\n')
GOOD_QUARANTINE = ('[[known]]\ntest = "suites/x.py::a"\nreason = "r"\nissue = "i"\n'
                   '[[known]]\ntest = "suites/x.py::b"\nreason = "r"\nissue = "i"\n')


@FUZZ
@given(which=st.sampled_from(["inventory.toml", "inventory.yaml", "quarantine.toml"]),
       damage=st.lists(st.sampled_from(["twice", "bom", "json", "swap"]), min_size=1,
                       max_size=2),
       pick=st.integers(0, 100))
def test_a_damaged_lab_file_is_refused_with_its_readers_error(tmp_path, which, damage, pick):
    good = GOOD_QUARANTINE if which.startswith("quarantine") else GOOD_INVENTORY
    original = tomllib_loads(good)
    text = yaml.safe_dump(original, sort_keys=False) if which.endswith(".yaml") else good
    lines = text.splitlines()
    data: bytes | None = None
    for d in damage:
        if d == "twice":
            i = pick % len(lines)
            lines.insert(i + 1, lines[i])
        elif d == "swap":
            i = pick % len(lines)
            lines[i], lines[-1] = lines[-1], lines[i]
        elif d == "json":
            lines = json.dumps(original, indent=1).splitlines()
    data = "\n".join(lines).encode() + b"\n"
    if "bom" in damage:
        data = b"\xef\xbb\xbf" + data
    path = Path(tmp_path / which)
    path.write_bytes(data)
    errors = (ValueError,) if which.startswith("quarantine") else (InventoryError,)
    try:
        load_quarantine(path) if which.startswith("quarantine") else load_inventory(path)
    except errors as e:
        assert str(e).startswith(str(path)), str(e)
        if "bom" in damage:
            assert "byte-order mark" in str(e) and "line 1" in str(e)
    else:
        assert "bom" not in damage, "a byte-order mark was accepted"
        if "json" in damage and not which.endswith(".yaml"):
            pytest.fail("JSON was accepted as TOML")


def tomllib_loads(text: str) -> dict:
    import tomllib

    return tomllib.loads(text)
