"""Device leases: each pytest process (xdist worker) holds its own device.

A lease is a kernel file lock (flock, ``harness.lab.lease_files``) on
``<lease dir>/<device id>.lock`` in a folder this user owns (mode 0700);
the kernel drops it when the holder dies, so a crashed worker never strands a
device. Exclusive access does not rely on xdist's scheduling. A worker keeps its
lease for the rest of the session (its engines live on that device).

A tensor-parallel engine of N ranks leases a group of N devices at once: a group the
inventory declares, else the first N free devices that serve it, in address order. A group is
taken all or none (every device's lock without waiting; on the first one held elsewhere, the
ones taken are let go), and a worker never waits while it holds a lease the wait could need:
before it waits for a group, or for a single device while it holds a group, it stops the
engines on what it holds (``on_release``) and lets those leases go. No worker holds a device
while waiting for another, so no two workers wait for each other.

Broken devices are recorded per run in ``<run dir>/<device id>.broken.json``
with the first error, so every worker skips the device with that error instead
of failing in a cascade.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.core.devices import CARDS_ENV, InventoryDevice
from harness.lab.inventory import Inventory, device_group
from harness.lab.lease_files import LockFile, clean_stale_holders, ensure_lease_dir, write_holder


class LeaseUnavailable(RuntimeError):
    """No device of the needed kind could be leased."""


@dataclass
class Lease:
    device: InventoryDevice  # a single device, or a group (``members``)
    worker: str
    exclusive: bool
    locks: tuple[LockFile, ...] = ()  # one per device held; none for a shared lease

    def env(self) -> dict[str, str]:
        """Variables set in every engine started under this lease."""
        env = dict(self.device.env)
        env["HIL_DEVICE_ID"] = self.device.id
        if self.device.members:  # the device ledger's one engine per card, across groups
            env[CARDS_ENV] = ",".join(self.device.cards)
        return env

    def describe(self) -> str:
        mode = "exclusive" if self.exclusive else "shared"
        what = (f"group {self.device.id} ({', '.join(self.device.cards)})"
                if self.device.members else self.device.id)
        return f"{self.worker} holds {what} ({self.device.kind}, {mode})"


class LeaseManager:
    """Leases devices from an inventory for one pytest process."""

    def __init__(self, inventory: Inventory, lease_dir: Path, run_dir: Path, worker: str,
                 wait_seconds: float = 0.0, share: bool = False) -> None:
        self.inventory = inventory
        self.lease_dir = lease_dir  # host-wide: every checkout on the host sees the locks
        self.run_dir = run_dir  # this run's broken-device records
        self.worker = worker
        self.wait_seconds = wait_seconds
        self.share = share
        self.held: dict[str, Lease] = {}
        # Called with a lease's device id before the lease is let go to wait for another (the
        # session stops the engines living there); a lease is never let go under a live engine.
        self.on_release: Callable[[str], None] | None = None
        self._dir_ready = False  # checked when a device is first leased: CPU-only runs never need it
        run_dir.mkdir(parents=True, exist_ok=True)

    def _lock(self, device: InventoryDevice) -> LockFile:
        if not self._dir_ready:
            ensure_lease_dir(self.lease_dir)
            clean_stale_holders(self.lease_dir)
            self._dir_ready = True
        return LockFile(self.lease_dir / f"{device.id}.lock")

    def leased_devices(self, target: str, backend: str | None,
                       mode: str | None) -> list[InventoryDevice]:
        """The devices an engine of this kind would lease ([]: it runs on the shared CPU);
        whether a device kind is leased is declared by its kind (harness/targets/)."""
        return [d for d in self.inventory.serving(target, backend, mode) if d.leased]

    def lease(self, target: str, backend: str | None, mode: str | None,
              ranks: int = 1) -> Lease | None:
        """The lease for an engine of this kind of ``ranks`` tensor-parallel ranks (a group
        of that many devices above 1), taking one if needed; None when the target runs on the
        shared CPU. Raises LeaseUnavailable with the reason."""
        candidates = self.leased_devices(target, backend, mode)
        if not candidates:
            return None
        if ranks > 1:
            return self._lease_group(target, backend, mode, candidates, ranks)
        for lease in self.held.values():
            if lease.device in candidates:
                return lease
        usable = [d for d in candidates if d.usable and not self.broken(d)]
        if not usable:
            reasons = "; ".join(
                self.broken(d) or d.why_unusable() for d in candidates)
            raise LeaseUnavailable(f"no usable device for {target} {backend or ''} {mode or ''}: {reasons}")
        lease = self._try_any(usable)  # first try every device without waiting
        if lease is None and (groups := self._held_groups()):
            self._let_go(groups)  # its own group may hold the devices it needs
            lease = self._try_any(usable)
        if lease is not None:
            return lease
        if self.share:
            d = usable[hash(self.worker) % len(usable)]
            return self._hold(Lease(d, self.worker, False))
        lease = self._wait(lambda: self._try_any(usable))
        if lease is not None:
            return lease
        raise LeaseUnavailable(
            f"all {len(usable)} device(s) for {target} are leased by other workers"
            f" ({', '.join(d.id for d in usable)}); waited {self.wait_seconds:.0f} s."
            " Use fewer workers, --lease-wait SECONDS, or --lease-share"
        )

    def _lease_group(self, target: str, backend: str | None, mode: str | None,
                     candidates: list[InventoryDevice], ranks: int) -> Lease:
        """A group of ``ranks`` devices serving this kind: a declared one, else formed from
        the free serving devices in address order; all or none, never waiting while holding."""
        declared = self.inventory.serving_groups(target, backend, mode, ranks)
        for lease in self.held.values():
            if lease.device.members and (lease.device in declared or (
                    not declared and all(m in candidates for m in lease.device.members)
                    and len(lease.device.members) == ranks)):
                return lease
        what = f"a TP {ranks} engine of {target} {backend or ''} {mode or ''}".replace("  ", " ")
        if declared:
            usable_groups = [g for g in declared if g.usable and not self._broken_member(g)]
            if not usable_groups:
                reasons = "; ".join(self._broken_member(g) or g.why_unusable() for g in declared)
                raise LeaseUnavailable(f"no usable group for {what}: {reasons}")

            def attempt() -> Lease | None:
                for g in usable_groups:
                    if (lease := self._try_group(g)) is not None:
                        return lease
                return None

            def shared() -> InventoryDevice:  # a shared lease's pick: usable, as a single's is
                return usable_groups[0]
        else:
            usable = sorted((d for d in candidates if d.usable and not self.broken(d)),
                            key=lambda d: (d.address or "", d.id))
            if len(usable) < ranks:
                raise LeaseUnavailable(
                    f"{what} needs a group of {ranks} devices, and the inventory lists"
                    f" {len(usable)} usable that serve it ({', '.join(d.id for d in usable)}"
                    f"{'' if len(usable) == len(candidates) else f' of {len(candidates)} listed'});"
                    " add devices, declare a [[group]], or run a smaller tensor_parallel_size")

            def attempt() -> Lease | None:
                return self._try_free(usable, ranks)

            def shared() -> InventoryDevice:
                try:
                    return device_group("+".join(d.id for d in usable[:ranks]), usable[:ranks])
                except ValueError as err:
                    raise LeaseUnavailable(str(err)) from None
        # A lease it holds on a device the group needs is let go first: the group is a new unit.
        wanted = {c for g in (declared or candidates) for c in g.cards}
        self._let_go([h for h in self.held.values() if set(h.device.cards) & wanted])
        lease = attempt()
        if lease is None and self.share:
            return self._hold(Lease(shared(), self.worker, False))
        if lease is None:
            self._let_go(list(self.held.values()))  # never wait while holding
            lease = self._wait(attempt)
        if lease is not None:
            return lease
        holders = self._holders(wanted)
        raise LeaseUnavailable(
            f"no group for {what} came free in {self.wait_seconds:.0f} s"
            f" ({holders or 'their devices are leased by other workers'}); use fewer workers,"
            " --lease-wait SECONDS, or more devices")

    def _try_group(self, group: InventoryDevice) -> Lease | None:
        """The group's every device locked without waiting, or none of them."""
        locks: list[LockFile] = []
        for m in group.members:
            lock = self._lock(m)
            if not lock.try_acquire():
                for taken in locks:
                    taken.release()
                return None
            locks.append(lock)
        return self._hold(Lease(group, self.worker, True, tuple(locks)))

    def _try_free(self, devices: list[InventoryDevice], ranks: int) -> Lease | None:
        """The first ``ranks`` of ``devices`` whose locks are free, as a group, or none."""
        taken: list[tuple[InventoryDevice, LockFile]] = []
        for d in devices:
            lock = self._lock(d)
            if lock.try_acquire():
                taken.append((d, lock))
                if len(taken) == ranks:
                    members = [t[0] for t in taken]
                    try:
                        group = device_group("+".join(m.id for m in members), members)
                    except ValueError as err:  # they cannot run one engine: let them go
                        for _, held in taken:
                            held.release()
                        raise LeaseUnavailable(f"{err}; or declare a [[group]] of devices that"
                                               " can run one engine") from None
                    return self._hold(Lease(group, self.worker, True, tuple(t[1] for t in taken)))
        for _, lock in taken:
            lock.release()
        return None

    def _wait(self, attempt: Callable[[], Lease | None]) -> Lease | None:
        deadline = time.monotonic() + self.wait_seconds
        while time.monotonic() < deadline:
            lease = attempt()
            if lease is not None:
                return lease
            time.sleep(0.3 + random.random() * 0.4)  # out of step with a worker trying the same
        return None

    def _held_groups(self) -> list[Lease]:
        return [h for h in self.held.values() if h.device.members]

    def _let_go(self, leases: list[Lease]) -> None:
        """Stop the engines on ``leases`` (``on_release``), then release them."""
        for lease in leases:
            if self.on_release is not None:
                self.on_release(lease.device.id)
            self._release(lease)

    def _broken_member(self, group: InventoryDevice) -> str | None:
        return next((b for m in group.members if (b := self.broken(m))), None) or self.broken(group)

    def _holders(self, cards: set[str]) -> str:
        """Who holds ``cards`` now, from their holder records."""
        out = []
        for card in sorted(cards):
            try:
                rec = json.loads((self.lease_dir / f"{card}.holder").read_text())
            except (OSError, ValueError):
                continue
            if isinstance(rec, dict):
                out.append(f"{card} held by {rec.get('worker')} (pid {rec.get('pid')})")
        return "; ".join(out)

    def _try_any(self, devices: list[InventoryDevice]) -> Lease | None:
        """An exclusive lease on the first of ``devices`` whose lock is free, or None."""
        for d in devices:
            lock = self._lock(d)
            if not lock.try_acquire():
                continue
            return self._hold(Lease(d, self.worker, True, (lock,)))
        return None

    def _hold(self, lease: Lease) -> Lease:
        self.held[lease.device.id] = lease
        if lease.locks:  # a shared lease holds no lock and writes no record
            for card in lease.device.cards:
                write_holder(self.lease_dir / f"{card}.holder",
                             {"worker": self.worker, "pid": os.getpid(), "since": time.time(),
                              "lease": lease.device.id})
        return lease

    def _release(self, lease: Lease) -> None:
        self.held.pop(lease.device.id, None)
        if lease.locks:
            for card in lease.device.cards:
                (self.lease_dir / f"{card}.holder").unlink(missing_ok=True)
            for lock in lease.locks:
                lock.release()

    def mark_broken(self, device: InventoryDevice, test: str, error: str) -> None:
        """Record the first failure of ``device``; later ones keep the first record."""
        path = self.run_dir / f"{device.id}.broken.json"
        if path.exists():
            return
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"test": test, "error": error, "worker": self.worker}))
        os.replace(tmp, path)

    def broken(self, device: InventoryDevice) -> str | None:
        """Why ``device`` is marked broken in this run, or None."""
        path = self.run_dir / f"{device.id}.broken.json"
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict):  # written by the harness as an object; damaged otherwise
            return f"device {device.id} marked broken (its record {path} is damaged)"
        error = rec.get("error")
        first = (error.strip().splitlines() or ["unknown error"])[0] \
            if isinstance(error, str) and error.strip() else "unknown error"
        return f"device {device.id} marked broken by {rec.get('test')}: {first}"

    def release_all(self) -> None:
        for lease in list(self.held.values()):
            self._release(lease)
