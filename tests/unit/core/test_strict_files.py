"""Files are read strictly (harness/core/strict_files.py), by every reader of a TOML or YAML
file: a key twice, a byte-order mark, JSON where TOML is expected are refused naming the file,
the line and what is wrong."""

from __future__ import annotations

import pytest

from harness.core.strict_files import FileFormatError, parse_toml, parse_yaml, read_text
from harness.lab.inventory import InventoryError, load_inventory
from harness.lab.quarantine import load_quarantine
from harness.stacks import spec
from tests.bad_input import INV, write

CARD = '[[device]]\nid = "card0"\nkind = "spyre"\nbackend = "eager"\n'
YAML_TWO = ("device:\n"
            "  - id: card0\n    kind: spyre\n    backend: eager\n"
            "device:\n"
            "  - id: card1\n    kind: spyre\n    backend: eager\n")


@pytest.mark.parametrize("text, line, says", [
    ('a = 1\na = 2\n', "line 2, column 6", "key 'a' is defined twice"),
    ('[x]\na = 1\n[x]\nb = 2\n', "line 3, column 3", "table [x] is declared twice"),
    ('[[known]]\ntest = "a"\ntest = "b"\n', "line 3", "key 'test' is defined twice"),
    ('a = {b = 1, b = 2}\n', "line 1", "key 'b' is defined twice in one inline table"),
    ('a = {b = 1}\na.c = 2\n', "line 2", "key 'a.c' adds to 'a', which is already defined"),
    ('{"known": []}\n', "line 1, column 1", "this is JSON, not TOML"),
    ('\n\n[{"test": "x"}]\n', "line 3, column 1", "this is JSON, not TOML"),
    ('{"known": [\n', "line 1, column 1", "this is JSON, not TOML"),
    ('kind = spyre\n', "line 1, column 8", "Invalid value"),
    ('a = ', "line 1, at the end of the file", "Invalid value"),
])
def test_toml_is_refused_naming_the_line_and_what_is_wrong(text, line, says):
    with pytest.raises(FileFormatError) as refused:
        parse_toml(text, "f.toml")
    assert str(refused.value).startswith(f"f.toml: invalid TOML: {line}")
    assert says in str(refused.value)


@pytest.mark.parametrize("text, line, says", [
    (YAML_TWO, "line 5, column 1", "key 'device' is defined twice in one mapping (also at line"
                                   " 1); keep one"),
    ("device:\n  - id: a\n    kind: spyre\n    id: b\n", "line 4, column 5",
     "key 'id' is defined twice"),
    ("a: 1\nb: [1\n", "line 3, column 1", "expected ',' or ']'"),
])
def test_yaml_is_refused_naming_the_line_and_what_is_wrong(text, line, says):
    with pytest.raises(FileFormatError) as refused:
        parse_yaml(text, "f.yaml")
    assert str(refused.value).startswith(f"f.yaml: invalid YAML at {line}: ")
    assert says in str(refused.value)


def test_yaml_merge_keys_may_be_overridden():
    """``<<: *base`` then a key of the base is YAML's override, not a duplicate."""
    text = "base: &b {kind: spyre, backend: eager}\ndev:\n  <<: *b\n  backend: sendnn\n"
    assert parse_yaml(text, "f.yaml")["dev"] == {"kind": "spyre", "backend": "sendnn"}


@pytest.mark.parametrize("data, says", [
    (b"\xef\xbb\xbfa = 1\n", "line 1: inventory file starts with a byte-order mark (U+FEFF,"
                             " bytes EF BB BF); save the file as UTF-8 without a BOM"),
    (b"\xff\xfea\x00", "line 1: inventory file is UTF-16 text (it starts with a UTF-16"
                       " byte-order mark); save the file as UTF-8 without a BOM"),
    (b"# caf\xff\n", "inventory file is not UTF-8 text: byte b'\\xff' at line 1 (offset 5);"
                     " save the file as UTF-8"),
])
def test_a_byte_order_mark_or_another_encoding_is_refused(tmp_path, data, says):
    path = write(tmp_path, "inv.toml", data)
    with pytest.raises(FileFormatError) as refused:
        read_text(path, "inventory file")
    assert str(refused.value) == f"{path}: {says}"


# ------------------------------------------------------------------ the readers use it


def test_a_yaml_inventory_with_a_key_twice_no_longer_drops_a_device(tmp_path):
    """Before: PyYAML kept the second ``device:`` list, card0 was gone without a word."""
    path = write(tmp_path, "inv.yaml", YAML_TWO)
    with pytest.raises(InventoryError, match=r"inv.yaml: invalid YAML at line 5, column 1: key"
                                             r" 'device' is defined twice"):
        load_inventory(path)
    write(tmp_path, "ok.yaml", YAML_TWO.replace("device:\n  - id: card1", "  - id: card1"))
    assert [d.id for d in load_inventory(tmp_path / "ok.yaml").devices] == ["card0", "card1"]


@pytest.mark.parametrize("body, says", [
    (b"\xef\xbb\xbf" + CARD.encode(), "line 1: inventory file starts with a byte-order mark"),
    (CARD.replace('backend = "eager"', 'backend = "eager"\nbackend = "sendnn"').encode(),
     "invalid TOML: line 5, column 19: key 'backend' is defined twice"),
    (b'{"device": [{"id": "card0", "kind": "spyre"}]}', "invalid TOML: line 1, column 1: this"
                                                       " is JSON, not TOML"),
])
def test_a_toml_inventory_is_read_strictly(tmp_path, body, says):
    path = write(tmp_path, "inv.toml", body)
    with pytest.raises(InventoryError) as refused:
        load_inventory(path)
    assert str(refused.value).startswith(f"{path}: {says}")
    assert load_inventory(write(tmp_path, "ok.toml", INV)).devices


@pytest.mark.parametrize("body, says", [
    (b'\xef\xbb\xbf[[known]]\ntest = "a"\nreason = "r"\nissue = "i"\n',
     "line 1: quarantine file starts with a byte-order mark"),
    (b'[[known]]\ntest = "a"\nreason = "r"\nreason = "s"\nissue = "i"\n',
     "invalid TOML: line 4, column 13: key 'reason' is defined twice"),
    (b'{"known": [{"test": "a", "reason": "r", "issue": "i"}]}',
     "invalid TOML: line 1, column 1: this is JSON, not TOML"),
])
def test_a_quarantine_file_is_read_strictly(tmp_path, body, says):
    path = write(tmp_path, "q.toml", body)
    with pytest.raises(ValueError) as refused:
        load_quarantine(path)
    assert str(refused.value).startswith(f"{path}: {says}")


def test_a_stack_file_is_read_strictly(tmp_path, monkeypatch):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    monkeypatch.setattr(spec, "STACKS_DIR", stacks)
    monkeypatch.setattr(spec, "ROOT", tmp_path)
    write(stacks, "x.toml", 'name = "x"\nname = "y"\n')
    with pytest.raises(spec.StackError, match=r"^stacks/x.toml: invalid TOML: line 2, column"
                                              r" 11: key 'name' is defined twice"):
        spec.load_stack("x")
    write(stacks, "x.toml", b'\xef\xbb\xbfname = "x"\n')
    with pytest.raises(spec.StackError, match=r"^stacks/x.toml: line 1: stack file starts with a"
                                              r" byte-order mark"):
        spec.load_stack("x")
    write(stacks, "x.toml", b'name = "x\xe9"\n')  # latin-1: a traceback before
    with pytest.raises(spec.StackError, match=r"^stacks/x.toml: stack file is not UTF-8 text:"
                                              r" byte b'\\xe9' at line 1 \(offset 9\)"):
        spec.load_stack("x")
