"""Stack locks with hashes: each pin carries the sha256 of the file pip installs for it.

Standard library only (it runs before any venv exists). The hashes are pip's own
choice on this machine kind (Linux x86_64, CPython 3.11): a dry-run install of
the pins (``--ignore-installed --no-deps --report``) names the file pip picks for
each pin and the hash the index gives for it (PyPI and local indexes serve one;
for a local file without one the file itself is hashed), so nothing is
downloaded but metadata. Locks are installed with ``--require-hashes``.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)")


class LockError(Exception):
    """A lock that cannot be hashed or read; the message names the pin or the file."""


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(lock: Path) -> list[str]:
    """The ``name==version`` pins of a lock, without comments and hashes."""
    pins = []
    for n, raw in enumerate(lock.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("--") else ""
        line = line.split(" --hash", 1)[0].rstrip(" \\")
        if not line:
            continue
        m = PIN.match(line)
        if not m:
            raise LockError(f"{lock}:{n}: {raw.strip()!r} is not a name==version pin")
        pins.append(f"{m.group(1)}=={m.group(2)}")
    return pins


def _file_sha256(url: str) -> str:
    path = Path(unquote(urlparse(url).path))
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pin_hashes(python: str, pins: list[str]) -> dict[str, str]:
    """Canonical name -> sha256 of the file pip picks for each pin with ``python``'s pip."""
    for p in pins:
        if not PIN.match(p):
            raise LockError(f"{p!r} is not a name==version pin; a hashed lock needs exact pins")
    with tempfile.TemporaryDirectory(prefix="hil-lock-") as tmp:
        req, report = Path(tmp) / "pins.txt", Path(tmp) / "report.json"
        req.write_text("\n".join(pins) + "\n")
        cmd = [python, "-m", "pip", "--disable-pip-version-check", "install", "--dry-run",
               "--ignore-installed", "--no-deps", "--quiet", "--report", str(report), "-r", str(req)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            tail = "\n".join(out.stderr.strip().splitlines()[-5:])
            raise LockError(f"pip could not choose files for the pins (exit {out.returncode}): {tail}")
        data = json.loads(report.read_text())
    return hashes_from_report(data, pins)


def hashes_from_report(report: dict[str, Any], pins: list[str]) -> dict[str, str]:
    """Canonical name -> sha256 from a pip installation report (``pip install --report``)."""
    hashes: dict[str, str] = {}
    for item in report.get("install", []):
        name = canon(item["metadata"]["name"])
        info = item.get("download_info", {})
        sha = (info.get("archive_info") or {}).get("hashes", {}).get("sha256")
        url = str(info.get("url", ""))
        if not sha and url.startswith("file://"):
            sha = _file_sha256(url)
        if not sha:
            raise LockError(f"{name}: pip picked {url or 'a file'} with no sha256 to pin")
        hashes[name] = sha
    missing = [p for p in pins if canon(p.split("==")[0]) not in hashes]
    if missing:
        raise LockError(f"pip chose no file for {', '.join(missing)}")
    return hashes


def lock_text(header: list[str], pins: list[str], hashes: dict[str, str]) -> str:
    """The lock file: the header comments, then one ``name==version --hash=sha256:...`` a line."""
    lines = [f"{p} --hash=sha256:{hashes[canon(p.split('==')[0])]}" for p in pins]
    return "\n".join(header + lines) + "\n"


def write_hashed_lock(lock: Path, header: list[str], pins: list[str], python: str) -> int:
    """Hash ``pins`` with ``python``'s pip and write the lock atomically; the pin count."""
    text = lock_text(header, pins, pin_hashes(python, pins))
    tmp = lock.with_suffix(lock.suffix + ".new")
    tmp.write_text(text)
    tmp.replace(lock)
    return len(pins)


def lock_header(lock: Path) -> list[str]:
    """The leading comment lines of an existing lock."""
    header = []
    for line in lock.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    return header
