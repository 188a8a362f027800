"""Groups of devices a tensor-parallel engine leases at once: [[group]] in an inventory file,
group leases between workers (all or none, never waiting while holding), no engines."""

import threading
import time

import pytest

from harness.lab.inventory import InventoryError, load_inventory
from harness.lab.lease_files import LockFile
from harness.lab.leases import LeaseManager, LeaseUnavailable

ADDRS = ("0000:3b:00.0", "0000:3c:00.0", "0000:3d:00.0", "0000:3e:00.0")


def dev(i, extra=""):
    return f'[[device]]\nid = "card{i}"\nkind = "spyre"\nbackend = "eager"\n{extra}\n'


def eager(n):
    """``n`` spyre eager stand-ins card0..card<n-1> (no address: leased in id order)."""
    return "".join(dev(i) for i in range(n))


FOUR = eager(4)


def write(tmp_path, text, name="inv.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def fake_pci(root, *addrs):
    for a in addrs:
        (root / "sys/bus/pci/devices" / a).mkdir(parents=True)
    return root


def manager(tmp_path, worker, inv, **kw):
    return LeaseManager(inv, tmp_path / "locks", tmp_path / "run", worker, **kw)


def lease2(m, **kw):
    return m.lease("spyre", "eager", "cb", ranks=2, **kw)


# ------------------------------------------------------------------ the inventory


def test_a_declared_group_is_read_with_its_members_in_rank_order(tmp_path):
    body = "".join(
        f'[[device]]\nid = "c{i}"\nkind = "spyre"\nbackend = "sendnn"\naddress = "{a}"\n'
        f'env = {{ AIU_WORLD_RANK_0 = "{a}", AIU_WORLD_SIZE = "1", DTLOG_LEVEL = "INFO" }}\n'
        for i, a in enumerate(ADDRS[:3]))
    body += '[[group]]\nid = "pair"\ndevices = ["c2", "c0"]\n'
    inv = load_inventory(write(tmp_path, body), root=fake_pci(tmp_path, *ADDRS[:3]))
    (g,) = inv.groups
    assert g.id == "pair" and g.cards == ("c2", "c0")
    assert [m.address for m in g.members] == [ADDRS[2], ADDRS[0]]
    assert (g.kind, g.backend) == ("spyre", "sendnn") and g.usable
    assert g.env == (("DTLOG_LEVEL", "INFO"),)  # each member's AIU_WORLD_* left out
    assert inv.serving_groups("spyre", "sendnn", "cb", 2) == [g]
    assert inv.serving_groups("spyre", "sendnn", "cb", 3) == []
    assert [d.id for d in inv.devices] == ["c0", "c1", "c2"]  # the group is no device


@pytest.mark.parametrize("devices, group, message", [
    (eager(2), '["card0", "card9"]', "device 'card9' is not listed under [[device]]"),
    # The schema's minimum, said as it is (it said "add at least one entry" to a list of one).
    (eager(2), '["card0"]', "group #1 ('g'): devices ['card0'] lists 1, at least 2 needed;"
     " list 2 or more"),
    (eager(2).replace('"eager"', '"sendnn"', 1), '["card0", "card1"]',
     "its devices are of different kinds or backends (card0: spyre sendnn, card1: spyre eager)"),
    (dev(0, 'env = { A = "1" }') + dev(1, 'env = { A = "2" }'),
     '["card0", "card1"]', "env A is '1' on one device and '2' on card1"),
])
def test_a_group_that_cannot_be_formed_is_refused(tmp_path, devices, group, message):
    body = devices + f'[[group]]\nid = "g"\ndevices = {group}\n'
    with pytest.raises(InventoryError) as e:
        load_inventory(write(tmp_path, body))
    assert message in str(e.value)
    assert "inv.toml" in str(e.value)


def test_a_group_id_that_names_a_device_is_refused(tmp_path):
    body = eager(2) + '[[group]]\nid = "card1"\ndevices = ["card0", "card1"]\n'
    with pytest.raises(InventoryError, match=r"group #1 \('card1'\): id already names a device"):
        load_inventory(write(tmp_path, body))


def test_a_group_member_absent_on_this_host_is_refused(tmp_path):
    body = (dev(0) + dev(9, 'address = "0000:99:00.0"')
            + '[[group]]\nid = "g"\ndevices = ["card0", "card9"]\n')
    with pytest.raises(InventoryError) as e:
        load_inventory(write(tmp_path, body), root=tmp_path)
    assert "group #1 ('g'): card9 is not on this host" in str(e.value)
    assert "sys/bus/pci/devices/0000:99:00.0" in str(e.value)


# ------------------------------------------------------------------ group leases


def test_two_workers_take_two_groups_and_a_third_is_told_who_holds_them(tmp_path):
    inv = load_inventory(write(tmp_path, FOUR))
    a, b, c = (manager(tmp_path, w, inv) for w in ("gw0", "gw1", "gw2"))
    la = lease2(a)
    assert la.device.cards == ("card0", "card1") and la.exclusive and len(la.locks) == 2
    assert la.env()["HIL_DEVICE_CARDS"] == "card0,card1"
    assert la.env()["HIL_DEVICE_ID"] == la.device.id
    assert lease2(a) is la  # a worker keeps its group
    assert lease2(b).device.cards == ("card2", "card3")
    with pytest.raises(LeaseUnavailable) as e:
        lease2(c)
    assert "no group for a TP 2 engine of spyre eager cb came free in 0 s" in str(e.value)
    assert "card0 held by gw0" in str(e.value) and "card3 held by gw1" in str(e.value)


def test_groups_are_formed_in_address_order(tmp_path):
    order = (ADDRS[3], ADDRS[0], ADDRS[2], ADDRS[1])  # card1, card3, card2, card0 by address
    body = "".join(dev(i, f'address = "{a}"') for i, a in enumerate(order))
    inv = load_inventory(write(tmp_path, body), root=fake_pci(tmp_path, *ADDRS))
    assert lease2(manager(tmp_path, "gw0", inv)).device.cards == ("card1", "card3")


def test_a_group_larger_than_the_inventory_names_both_numbers(tmp_path):
    inv = load_inventory(write(tmp_path, FOUR))
    with pytest.raises(LeaseUnavailable, match="needs a group of 5 devices, and the inventory"
                       " lists 4 usable that serve it"):
        manager(tmp_path, "gw0", inv).lease("spyre", "eager", "cb", ranks=5)


@pytest.mark.parametrize("declared", [False, True])
def test_a_group_is_taken_all_or_none(tmp_path, declared):
    body = eager(2) + ('[[group]]\nid = "pair"\ndevices = ["card1", "card0"]\n' if declared else "")
    inv = load_inventory(write(tmp_path, body))
    other = manager(tmp_path, "gw1", inv)
    assert other.lease("spyre", "eager", "cb").device.id == "card0"
    with pytest.raises(LeaseUnavailable):
        lease2(manager(tmp_path, "gw0", inv))
    free = LockFile(tmp_path / "locks" / "card1.lock")
    assert free.try_acquire()  # the attempt left no lock of the group behind
    free.release()
    assert manager(tmp_path, "gw2", inv).lease("spyre", "eager", "cb").device.id == "card1"


def test_a_held_single_device_is_let_go_before_taking_the_group(tmp_path):
    inv = load_inventory(write(tmp_path, eager(2)))
    m = manager(tmp_path, "gw0", inv)
    released = []
    m.on_release = lambda dev: released.append((dev, sorted(m.held)))
    assert m.lease("spyre", "eager", "cb").device.id == "card0"
    group = lease2(m)
    assert released == [("card0", ["card0"])]  # told while it still held it
    assert group.device.cards == ("card0", "card1") and list(m.held) == [group.device.id]


def test_a_single_lease_lets_its_own_group_go_when_nothing_else_is_free(tmp_path):
    inv = load_inventory(write(tmp_path, eager(2)))
    m = manager(tmp_path, "gw0", inv)
    released = []
    m.on_release = released.append
    group = lease2(m)
    single = m.lease("spyre", "eager", "cb")
    assert released == [group.device.id]
    assert single.device.id == "card0" and list(m.held) == ["card0"]


def test_declared_groups_are_preferred_to_forming_one(tmp_path):
    body = FOUR + '[[group]]\nid = "pair"\ndevices = ["card3", "card2"]\n'
    inv = load_inventory(write(tmp_path, body))
    lease = lease2(manager(tmp_path, "gw0", inv))
    assert lease.device.id == "pair" and lease.device.cards == ("card3", "card2")
    with pytest.raises(LeaseUnavailable, match="card3 held by gw0"):
        lease2(manager(tmp_path, "gw1", inv))  # card0 and card1 are free, but not a group


def test_a_worker_lets_go_of_everything_before_it_waits_for_a_group(tmp_path):
    body = eager(3) + '[[group]]\nid = "pair"\ndevices = ["card0", "card1"]\n'
    inv = load_inventory(write(tmp_path, body))
    assert lease2(manager(tmp_path, "gw0", inv)).device.id == "pair"
    m = manager(tmp_path, "gw1", inv)
    released = []
    m.on_release = released.append
    assert m.lease("spyre", "eager", "cb").device.id == "card2"  # no group needs it
    with pytest.raises(LeaseUnavailable, match="card0 held by gw0"):
        lease2(m)
    assert released == ["card2"] and m.held == {}
    assert manager(tmp_path, "gw2", inv).lease("spyre", "eager", "cb").device.id == "card2"


def test_shared_group_lease_holds_usable_devices_and_no_lock(tmp_path):
    body = FOUR.replace('backend = "eager"\n', 'backend = "eager"\nhealth = "maintenance"\n', 1)
    inv = load_inventory(write(tmp_path, body))
    assert lease2(manager(tmp_path, "gw0", inv)).device.cards == ("card1", "card2")
    assert manager(tmp_path, "gw1", inv).lease("spyre", "eager", "cb").device.id == "card3"
    shared = lease2(manager(tmp_path, "gw2", inv, share=True))
    assert not shared.exclusive and shared.locks == ()
    assert len(shared.device.members) == 2 and all(m.usable for m in shared.device.members)


def test_two_workers_each_holding_one_device_do_not_deadlock_over_a_group(tmp_path):
    inv = load_inventory(write(tmp_path, eager(2)))
    wait = 3.0
    ms = [manager(tmp_path, w, inv, wait_seconds=wait) for w in ("gw0", "gw1")]
    released = {m.worker: [] for m in ms}
    for m in ms:
        m.on_release = released[m.worker].append
    assert [m.lease("spyre", "eager", "cb").device.id for m in ms] == ["card0", "card1"]
    barrier = threading.Barrier(2)
    outcome = {}

    def ask(m):
        barrier.wait()
        t0 = time.monotonic()
        try:
            lease2(m)
        except LeaseUnavailable:
            outcome[m.worker] = ("timed out", t0, time.monotonic())
            return
        outcome[m.worker] = ("got", t0, time.monotonic())
        time.sleep(0.5)
        m.release_all()
        outcome[m.worker] += (time.monotonic(),)

    threads = [threading.Thread(target=ask, args=(m,), daemon=True) for m in ms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=wait + 5)
    assert not any(t.is_alive() for t in threads), "a worker hung waiting for the group"
    got = sorted((o for o in outcome.values() if o[0] == "got"), key=lambda o: o[2])
    assert got, f"neither worker got the group: {outcome}"
    assert released == {"gw0": ["card0"], "gw1": ["card1"]}  # each gave up its single
    assert all(o[2] - o[1] < wait + 1.5 for o in outcome.values())  # none past its deadline
    if len(got) == 2:  # the second took it only after the first let it go
        assert got[1][2] >= got[0][3]


def test_devices_that_cannot_form_a_group_are_refused_keeping_no_lock(tmp_path):
    inv = load_inventory(write(tmp_path, dev(0, 'env = { A = "1" }') + dev(1, 'env = { A = "2" }')))
    with pytest.raises(LeaseUnavailable, match="env A is '1' on one device and '2' on card1"):
        lease2(manager(tmp_path, "gw0", inv))
    assert [manager(tmp_path, w, inv).lease("spyre", "eager", "cb").device.id
            for w in ("gw1", "gw2")] == ["card0", "card1"]  # both locks were let go
