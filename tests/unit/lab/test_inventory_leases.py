"""Inventory files, discovery on fake trees, leases between workers, shards, quarantine."""

import subprocess
import sys
import time

import pytest

from harness.lab.inventory import InventoryError, discover_inventory, load_inventory
from harness.lab.leases import LeaseManager, LeaseUnavailable
from harness.lab.quarantine import KnownFailure, load_quarantine
from harness.lab.shard import in_shard, parse_shard
from harness.targets import device_kinds

TWO_CARDS = """
[[device]]
id = "card0"
kind = "spyre"
backend = "eager"
env = { A = "1" }

[[device]]
id = "card1"
kind = "spyre"
backend = "eager"
"""


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_toml_inventory_is_read(tmp_path):
    inv = load_inventory(write(tmp_path, "inv.toml", TWO_CARDS))
    assert [d.id for d in inv.devices] == ["card0", "card1"]
    assert inv.devices[0].env == (("A", "1"),)
    assert [d.id for d in inv.serving("spyre", "eager", "cb")] == ["card0", "card1"]
    assert inv.serving("spyre", "sendnn", "cb") == []


def test_malformed_toml_names_the_line(tmp_path):
    p = write(tmp_path, "inv.toml", '[[device]]\nid = "card0"\nkind = spyre\n')
    with pytest.raises(InventoryError, match=r"inv.toml: invalid TOML: .*line 3"):
        load_inventory(p)


def test_malformed_yaml_names_the_line(tmp_path):
    p = write(tmp_path, "inv.yaml", "device:\n  - id: card0\n    kind: [spyre\n")
    with pytest.raises(InventoryError, match=r"invalid YAML at line \d+"):
        load_inventory(p)


@pytest.mark.parametrize("body,message", [
    ('[[device]]\nkind = "spyre"\n', "device #1: missing 'id'"),
    ('[[device]]\nid = "x"\nkind = "not-a-kind"\n',
     f"kind 'not-a-kind' is not one of {', '.join(device_kinds())}"),
    ('[[device]]\nid = "x"\nkind = "spyre"\nhealth = "meh"\n', "health 'meh'"),
    ('[[device]]\nid = "x"\nkind = "spyre"\ncolour = 1\n', "unknown field(s) ['colour']"),
    ('[[device]]\nid = "x"\nkind = "cpu"\n[[device]]\nid = "x"\nkind = "cpu"\n', "id listed twice"),
    ('title = "none"\n', "no devices"),
])
def test_schema_errors_are_clear(tmp_path, body, message):
    with pytest.raises(InventoryError) as e:
        load_inventory(write(tmp_path, "inv.toml", body))
    assert message in str(e.value)


def test_device_listed_but_absent(tmp_path):
    body = '[[device]]\nid = "card9"\nkind = "spyre"\naddress = "0000:99:00.0"\n'
    inv = load_inventory(write(tmp_path, "inv.toml", body), root=tmp_path)
    (dev,) = inv.devices
    assert not dev.present and not dev.usable
    assert "listed but absent: looked for" in dev.why_unusable()
    assert "sys/bus/pci/devices/0000:99:00.0" in dev.why_unusable()


def test_discovery_on_a_fake_tree(tmp_path):
    pci = tmp_path / "sys/bus/pci/devices/0000:3b:00.0"
    pci.mkdir(parents=True)
    (pci / "vendor").write_text("0x1014\n")
    (pci / "device").write_text("0x06a7\n")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/neuron0").write_text("")
    inv = discover_inventory(tmp_path)
    kinds = [d.kind for d in inv.devices]
    assert kinds == ["spyre", "neuron", "cpu"]
    spyre = inv.devices[0]
    assert spyre.address == "0000:3b:00.0" and ("AIU_WORLD_RANK_0", "0000:3b:00.0") in spyre.env


def manager(tmp_path, worker, inv, **kw):
    return LeaseManager(inv, tmp_path / "locks", tmp_path / "run", worker, **kw)


def test_two_workers_lease_different_devices_and_a_third_waits(tmp_path):
    inv = load_inventory(write(tmp_path, "inv.toml", TWO_CARDS))
    a, b, c = (manager(tmp_path, w, inv, wait_seconds=1) for w in ("gw0", "gw1", "gw2"))
    la = a.lease("spyre", "eager", "cb")
    lb = b.lease("spyre", "eager", "cb")
    assert {la.device.id, lb.device.id} == {"card0", "card1"}
    assert a.lease("spyre", "eager", "cp") is la  # a worker keeps its device
    assert la.env()["HIL_DEVICE_ID"] == la.device.id
    with pytest.raises(LeaseUnavailable, match="all 2 device.* are leased by other workers"):
        c.lease("spyre", "eager", "cb")
    shared = manager(tmp_path, "gw3", inv, share=True).lease("spyre", "eager", "cb")
    assert not shared.exclusive
    a.release_all()
    assert c.lease("spyre", "eager", "cb").device.id == la.device.id
    assert a.lease("vllm-cpu", None, None) is None  # the CPU is shared, never leased


def test_a_dead_holder_frees_its_lease(tmp_path):
    inv = load_inventory(write(tmp_path, "inv.toml", TWO_CARDS.split("[[device]]")[0] + "[[device]]" + TWO_CARDS.split("[[device]]")[1]))
    lock = tmp_path / "locks" / "card0.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c",
                               "import filelock,sys,time; l=filelock.FileLock(sys.argv[1]); l.acquire();"
                               " print('held', flush=True); time.sleep(600)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    m = manager(tmp_path, "gw0", inv, wait_seconds=0)
    with pytest.raises(LeaseUnavailable):
        m.lease("spyre", "eager", "cb")
    holder.kill()
    holder.wait()
    deadline = time.time() + 5
    while True:
        try:
            assert m.lease("spyre", "eager", "cb").device.id == "card0"
            break
        except LeaseUnavailable:
            assert time.time() < deadline
            time.sleep(0.1)


def test_broken_device_keeps_its_first_error(tmp_path):
    inv = load_inventory(write(tmp_path, "inv.toml", TWO_CARDS))
    m = manager(tmp_path, "gw0", inv)
    lease = m.lease("spyre", "eager", "cb")
    m.mark_broken(lease.device, "test_a", "engine died with exit code 3\nlog...")
    m.mark_broken(lease.device, "test_b", "a later error")
    assert m.broken(lease.device) == f"device {lease.device.id} marked broken by test_a: engine died with exit code 3"
    other = manager(tmp_path, "gw1", inv)
    assert other.lease("spyre", "eager", "cb").device.id != lease.device.id


def test_shards_partition_every_key():
    keys = [f"variant{i}|model{j}" for i in range(8) for j in range(2)]
    for n in (1, 2, 3):
        slices = [{k for k in keys if in_shard(k, (i, n))} for i in range(1, n + 1)]
        assert set().union(*slices) == set(keys)
        assert sum(len(s) for s in slices) == len(keys)


@pytest.mark.parametrize("spec,message", [("3/2", "between 1 and N"), ("0/2", "between 1 and N"),
                                          ("a/b", "expected I/N"), ("1-2", "expected I/N")])
def test_bad_shard_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_shard(spec)


def test_quarantine_file(tmp_path):
    p = write(tmp_path, "q.toml", '[[known]]\ntest = "suites/x.py::t[*-cb-*]"\nreason = "r"\nissue = "I-1"\n')
    (k,) = load_quarantine(p)
    assert k.matches("suites/x.py::t[a-cb-b]") and not k.matches("suites/x.py::t[a-cp-b]")
    assert load_quarantine(tmp_path / "missing.toml") == []
    bad = write(tmp_path, "bad.toml", '[[known]]\ntest = "x"\n')
    with pytest.raises(ValueError, match="known #1 \\('x'\\): missing 'reason', 'issue'"):
        load_quarantine(bad)
    assert KnownFailure("a", "b", "c").matches("a")


@pytest.mark.parametrize("record", ["[1, 2]", '{"error": 5}', '{"error": ""}', '"x"'])
def test_a_damaged_broken_record_still_marks_its_device_broken(tmp_path, record):
    inv = load_inventory(write(tmp_path, "inv.toml", TWO_CARDS))
    m = manager(tmp_path, "gw0", inv)
    device = inv.devices[0]
    (tmp_path / "run").mkdir(parents=True, exist_ok=True)
    (tmp_path / "run" / f"{device.id}.broken.json").write_text(record)
    why = m.broken(device)
    assert why is not None and why.startswith(f"device {device.id} marked broken")


def test_a_holder_file_of_another_shape_is_cleaned_not_a_crash(tmp_path):
    from harness.lab.lease_files import clean_stale_holders

    for name, body in (("a", '{"pid": [1]}'), ("b", "[3]"), ("c", '{"pid": "x"}')):
        (tmp_path / f"{name}.holder").write_text(body)
    assert sorted(clean_stale_holders(tmp_path)) == ["a", "b", "c"]
