"""Write a fake card host's device tree: Spyre PCI functions bound to vfio-pci with VFIO groups.

    python fake_device_tree.py ROOT [--cards N] [--inventory FILE] [--group N]

ROOT gets ``sys/bus/pci/devices/<address>/{vendor,device,iommu_group,driver}`` and
``dev/vfio/<group>``, laid out as the kernel does; discovery (``HIL_DEVICE_ROOT=ROOT``) and the
emulated runtime (``SENDNN_EMULATION_ROOT=ROOT``) read it. With ``--inventory`` it also writes an
inventory listing the cards (ids card0.., backend sendnn, address), as a lab would, and with
``--group N`` a group of the first N cards (id ``group0``) a tensor-parallel engine leases whole.
Stdlib only.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def card_address(i: int) -> str:
    return f"0000:{0x3b + i:02x}:00.0"


def write_tree(root: Path, cards: int) -> list[str]:
    addresses = []
    for i in range(cards):
        address, group = card_address(i), str(40 + i)
        dev = root / "sys/bus/pci/devices" / address
        dev.mkdir(parents=True, exist_ok=True)
        (dev / "vendor").write_text("0x1014\n")
        (dev / "device").write_text("0x06a7\n")
        for link, target in (("iommu_group", root / "sys/kernel/iommu_groups" / group),
                             ("driver", root / "sys/bus/pci/drivers/vfio-pci")):
            target.mkdir(parents=True, exist_ok=True)
            if not (dev / link).is_symlink():
                (dev / link).symlink_to(target)
        node = root / "dev/vfio" / group
        node.parent.mkdir(parents=True, exist_ok=True)
        node.touch()
        addresses.append(address)
    return addresses


def inventory_text(addresses: list[str], group: int = 0) -> str:
    lines = ["# A fake card host's inventory (tools/card-host/fake_device_tree.py)"]
    for i, address in enumerate(addresses):
        lines += ["", "[[device]]", f'id = "card{i}"', 'kind = "spyre"', 'backend = "sendnn"',
                  f'address = "{address}"']
    if group:
        members = ", ".join(f'"card{i}"' for i in range(group))
        lines += ["", "[[group]]", 'id = "group0"', f"devices = [{members}]"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--cards", type=int, default=2)
    ap.add_argument("--inventory", type=Path)
    ap.add_argument("--group", type=int, default=0, help="declare a group of the first N cards")
    a = ap.parse_args()
    if a.group and not 2 <= a.group <= a.cards:
        ap.error(f"--group {a.group}: a group takes 2 to --cards ({a.cards}) cards")
    addresses = write_tree(a.root, a.cards)
    if a.inventory:
        a.inventory.write_text(inventory_text(addresses, a.group))
    print(" ".join(addresses))


if __name__ == "__main__":
    main()
