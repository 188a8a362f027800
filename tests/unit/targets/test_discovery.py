"""Device discovery on fake sysfs and /dev trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.core.devices import CPU_HINT
from harness.targets.neuron.discovery import discover_neuron
from harness.targets.spyre.discovery import discover_spyre


def pci_device(
    root: Path,
    address: str,
    vendor: str,
    device: str,
    group: str | None = None,
    driver: str | None = None,
) -> Path:
    """A sysfs PCI function, with ``iommu_group`` and ``driver`` links like the kernel's."""
    d = root / "sys/bus/pci/devices" / address
    d.mkdir(parents=True)
    (d / "vendor").write_text(f"{vendor}\n")
    (d / "device").write_text(f"{device}\n")
    if group is not None:
        target = root / "sys/kernel/iommu_groups" / group
        target.mkdir(parents=True, exist_ok=True)
        (d / "iommu_group").symlink_to(target)
    if driver is not None:
        target = root / "sys/bus/pci/drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        (d / "driver").symlink_to(target)
    return d


def vfio_node(root: Path, group: str) -> Path:
    node = root / "dev/vfio" / group
    node.parent.mkdir(parents=True, exist_ok=True)
    node.touch()
    return node


def spyre_card(root: Path, address: str, group: str, with_vfio: bool = True) -> None:
    pci_device(root, address, "0x1014", "0x06a7", group=group, driver="vfio-pci")
    if with_vfio:
        vfio_node(root, group)


def test_no_devices_on_empty_tree(tmp_path: Path) -> None:
    for scan in (discover_spyre(tmp_path), discover_neuron(tmp_path)):
        assert scan.devices == [] and scan.usable == []
        assert scan.why_none() is not None


def test_spyre_message_says_what_was_looked_for(tmp_path: Path) -> None:
    scan = discover_spyre(tmp_path)
    assert scan.kind == "spyre"
    assert scan.looked_for == (
        f"PCI vendor:device 1014:06a7, 1014:06a8 under {tmp_path}/sys/bus/pci/devices "
        f"and VFIO groups under {tmp_path}/dev/vfio"
    )
    assert scan.why_none() == (
        f"no Spyre device found: looked for {scan.looked_for}; {CPU_HINT}"
    )
    assert "use -m cpu" in scan.why_none()


def test_neuron_message_says_what_was_looked_for(tmp_path: Path) -> None:
    scan = discover_neuron(tmp_path)
    assert scan.kind == "neuron"
    assert scan.why_none() == (
        f"no Neuron device found: looked for {tmp_path}/dev/neuron*; {CPU_HINT}"
    )


def test_one_spyre_card_with_vfio(tmp_path: Path) -> None:
    spyre_card(tmp_path, "0000:3b:00.0", "42")
    scan = discover_spyre(tmp_path)
    assert [d.id for d in scan.usable] == ["0000:3b:00.0"]
    (card,) = scan.devices
    assert card.kind == "spyre"
    assert card.iommu_group == "42"
    assert card.vfio_path == tmp_path / "dev/vfio/42"
    assert card.path == tmp_path / "sys/bus/pci/devices/0000:3b:00.0"
    assert "IOMMU group 42" in card.detail and "driver vfio-pci" in card.detail
    assert scan.why_none() is None


def test_spyre_card_without_vfio_node_is_unusable(tmp_path: Path) -> None:
    spyre_card(tmp_path, "0000:3b:00.0", "42", with_vfio=False)
    scan = discover_spyre(tmp_path)
    (card,) = scan.devices
    assert not card.usable and scan.usable == []
    assert f"{tmp_path}/dev/vfio/42 missing" in card.detail
    msg = scan.why_none()
    assert msg is not None
    assert msg.startswith("no usable Spyre device: found 1 but none usable")
    assert "0000:3b:00.0: IOMMU group 42" in msg and "1014:06a7" in msg


def test_spyre_card_without_iommu_group_is_unusable(tmp_path: Path) -> None:
    pci_device(tmp_path, "0000:3b:00.0", "0x1014", "0x06a7")
    (card,) = discover_spyre(tmp_path).devices
    assert not card.usable and card.iommu_group is None
    assert "no iommu_group link (no driver bound)" in card.detail


def test_spyre_card_on_another_driver_says_to_bind_vfio(tmp_path: Path) -> None:
    pci_device(tmp_path, "0000:3b:00.0", "0x1014", "0x06a7", "42", driver="aiu")
    (card,) = discover_spyre(tmp_path).devices
    assert not card.usable
    assert card.detail.endswith(
        "missing (driver aiu); the card must be bound to vfio-pci"
    )


def test_unrelated_pci_devices_are_ignored(tmp_path: Path) -> None:
    pci_device(tmp_path, "0000:00:1f.0", "0x8086", "0x06a7", group="1")
    pci_device(tmp_path, "0000:01:00.0", "0x1014", "0x0001", group="2")
    vfio_node(tmp_path, "1")
    vfio_node(tmp_path, "2")
    scan = discover_spyre(tmp_path)
    assert scan.devices == []
    assert scan.why_none().startswith("no Spyre device found:")


def test_mixed_cards_listed_in_address_order(tmp_path: Path) -> None:
    spyre_card(tmp_path, "0000:af:00.0", "7", with_vfio=False)
    spyre_card(tmp_path, "0000:3b:00.0", "42")
    pci_device(tmp_path, "0000:00:02.0", "0x8086", "0x3e92", group="3")
    scan = discover_spyre(tmp_path)
    assert [(d.id, d.usable) for d in scan.devices] == [
        ("0000:3b:00.0", True),
        ("0000:af:00.0", False),
    ]
    assert scan.why_none() is None


def test_sysfs_ids_are_matched_case_insensitively(tmp_path: Path) -> None:
    pci_device(tmp_path, "0000:3b:00.0", "0x1014", "0x06A7", group="42")
    vfio_node(tmp_path, "42")
    assert len(discover_spyre(tmp_path).usable) == 1


def test_two_neuron_devices(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("neuron10", "neuron2", "neuron_monitor", "neuronx", "nvme0"):
        (dev / name).touch()
    scan = discover_neuron(tmp_path)
    assert [d.id for d in scan.devices] == ["neuron2", "neuron10"]
    assert [d.path for d in scan.usable] == [dev / "neuron2", dev / "neuron10"]
    assert all(d.kind == "neuron" for d in scan.devices)
    assert scan.why_none() is None


def test_unwritable_neuron_node_is_unusable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/neuron0").touch()
    # Simulated so the test holds when run as root, which bypasses file modes.
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    scan = discover_neuron(tmp_path)
    assert scan.usable == []
    msg = scan.why_none()
    assert msg is not None and "not readable and writable" in msg


def test_spyre_virtual_functions_are_discovered(tmp_path: Path) -> None:
    """SR-IOV virtual functions (1014:06a8), what a container or VM is given, are cards too."""
    pci_device(tmp_path, "0000:3b:00.1", "0x1014", "0x06a8", group="43", driver="vfio-pci")
    vfio_node(tmp_path, "43")
    scan = discover_spyre(tmp_path)
    assert [d.id for d in scan.usable] == ["0000:3b:00.1"]
    assert "virtual function, driver vfio-pci" in scan.devices[0].detail
