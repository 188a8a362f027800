"""Device leases: each pytest process (xdist worker) holds its own device.

A lease is a kernel file lock (flock, ``harness.lab.lease_files``) on
``<lease dir>/<device id>.lock`` in a folder this user owns (mode 0700);
the kernel drops it when the holder dies, so a crashed worker never strands a
device. Exclusive access does not rely on xdist's scheduling. A worker keeps its
lease for the rest of the session (its engines live on that device).

Broken devices are recorded per run in ``<run dir>/<device id>.broken.json``
with the first error, so every worker skips the device with that error instead
of failing in a cascade.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from harness.core.devices import InventoryDevice
from harness.lab.inventory import Inventory
from harness.lab.lease_files import LockFile, clean_stale_holders, ensure_lease_dir, write_holder


class LeaseUnavailable(RuntimeError):
    """No device of the needed kind could be leased."""


@dataclass
class Lease:
    device: InventoryDevice
    worker: str
    exclusive: bool
    lock: LockFile | None

    def env(self) -> dict[str, str]:
        """Variables set in every engine started under this lease."""
        env = dict(self.device.env)
        env["HIL_DEVICE_ID"] = self.device.id
        return env

    def describe(self) -> str:
        mode = "exclusive" if self.exclusive else "shared"
        return f"{self.worker} holds {self.device.id} ({self.device.kind}, {mode})"


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

    def lease(self, target: str, backend: str | None, mode: str | None) -> Lease | None:
        """The lease for an engine of this kind, taking one if needed; None when the
        target runs on the shared CPU. Raises LeaseUnavailable with the reason."""
        candidates = self.leased_devices(target, backend, mode)
        if not candidates:
            return None
        for lease in self.held.values():
            if lease.device in candidates:
                return lease
        usable = [d for d in candidates if d.usable and not self.broken(d)]
        if not usable:
            reasons = "; ".join(
                self.broken(d) or d.why_unusable() for d in candidates)
            raise LeaseUnavailable(f"no usable device for {target} {backend or ''} {mode or ''}: {reasons}")
        lease = self._try_any(usable)  # first try every device without waiting
        if lease is not None:
            return lease
        if self.share:
            d = usable[hash(self.worker) % len(usable)]
            return self._hold(Lease(d, self.worker, False, None))
        deadline = time.monotonic() + self.wait_seconds
        while time.monotonic() < deadline:
            lease = self._try_any(usable)
            if lease is not None:
                return lease
            time.sleep(0.5)
        raise LeaseUnavailable(
            f"all {len(usable)} device(s) for {target} are leased by other workers"
            f" ({', '.join(d.id for d in usable)}); waited {self.wait_seconds:.0f} s."
            " Use fewer workers, --lease-wait SECONDS, or --lease-share"
        )

    def _try_any(self, devices: list[InventoryDevice]) -> Lease | None:
        """An exclusive lease on the first of ``devices`` whose lock is free, or None."""
        for d in devices:
            lock = self._lock(d)
            if not lock.try_acquire():
                continue
            return self._hold(Lease(d, self.worker, True, lock))
        return None

    def _hold(self, lease: Lease) -> Lease:
        self.held[lease.device.id] = lease
        if lease.lock is not None:  # a shared lease holds no lock and writes no record
            write_holder(self.lease_dir / f"{lease.device.id}.holder",
                         {"worker": self.worker, "pid": os.getpid(), "since": time.time()})
        return lease

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
        for lease in self.held.values():
            if lease.lock is not None:
                (self.lease_dir / f"{lease.device.id}.holder").unlink(missing_ok=True)
                lease.lock.release()
        self.held.clear()
