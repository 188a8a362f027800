"""Inventory and quarantine files refuse unsafe device ids, non-UTF-8 text, external faults
unless allowed, and a folder given as a file, naming the file."""

import json
from pathlib import Path

import pytest

from harness.lab.inventory import InventoryError, load_inventory
from harness.lab.quarantine import load_quarantine
from tests.bad_input import INV, write


@pytest.mark.parametrize("device_id", ["../escaped/card0", "card0/../../x", ".hidden", "-x", "a b",
                                       "c" * 65, "", "card\n0"])
def test_device_ids_are_restricted_to_a_safe_charset(tmp_path, device_id):
    inv = write(tmp_path, "inv.toml", INV.replace('"card0"', json.dumps(device_id)))
    with pytest.raises(InventoryError, match=r"inv\.toml: device #1.*(is not allowed|missing)"):
        load_inventory(inv)


def test_safe_device_ids_pass(tmp_path):
    inv = write(tmp_path, "inv.toml", INV.replace('"card0"', '"Spyre_0.a-1"'))
    assert load_inventory(inv).devices[0].id == "Spyre_0.a-1"


def test_inventory_and_quarantine_errors_name_the_file_for_non_utf8(tmp_path):
    q = write(tmp_path, "q.toml", b'[[known]]\ntest = "caf\xe9"\n')
    with pytest.raises(ValueError, match=r"q\.toml: quarantine file is not UTF-8 text: byte b'\\xe9' at line 2"):
        load_quarantine(q)
    y = write(tmp_path, "inv.yaml", b"device:\n  - id: caf\xe9\n")
    with pytest.raises(InventoryError, match=r"inv\.yaml: inventory file is not UTF-8"):
        load_inventory(y)


def test_inventory_external_fault_allowed_only_when_asked(tmp_path):
    inv = write(tmp_path, "inv.toml", INV + 'env = { HIL_FAULTS = "mylab.faults.flaky_card" }\n')
    with pytest.raises(InventoryError, match="pass --allow-external-faults"):
        load_inventory(inv)
    assert load_inventory(inv, allow_external_faults=True).devices[0].env == (
        ("HIL_FAULTS", "mylab.faults.flaky_card"),)
    own = write(tmp_path, "own.toml", INV + 'env = { HIL_FAULTS = "crash-engine:when=start" }\n')
    assert load_inventory(own).devices[0].id == "card0"


def test_quarantine_none_and_a_folder(tmp_path):
    assert load_quarantine(Path("/dev/null"), required=True) == []  # "no quarantine"
    with pytest.raises(ValueError, match=f"--quarantine: {tmp_path} is a folder"):
        load_quarantine(tmp_path, required=True)
