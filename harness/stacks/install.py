"""Installing a stack: create its venv, run its [[steps]], check versions, write the stamp.

Standard library only, like ``harness.stacks.spec`` (whose command line calls this).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from harness.stacks.locks import LockError, read_pins, write_hashed_lock
from harness.stacks.spec import (
    PLACEHOLDER,
    ROOT,
    WORK_NAME,
    Stack,
    StackError,
    Step,
    installed_stamp,
    load_stack,
    stamp_hash,
)


def find_python(version: str) -> str:
    """An interpreter of ``version`` (``3.11``): $HIL_PYTHON, pythonX.Y, python3."""
    want = tuple(int(x) for x in version.split("."))
    tried = []
    for cand in (os.environ.get("HIL_PYTHON"), f"python{version}", "python3"):
        if not cand:
            continue
        tried.append(cand)
        exe = shutil.which(cand)
        if exe is None:
            continue
        probe = subprocess.run(
            [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        got = tuple(int(x) for x in probe.stdout.strip().split(".")) if probe.stdout else ()
        if probe.returncode == 0 and got[: len(want)] == want:
            return exe
    raise StackError(
        f"no Python {version} found (tried {', '.join(tried)}); install it or set HIL_PYTHON"
    )


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _freeze_name(line: str) -> str:
    return _canon(re.split(r"\s*(?:==|===|@)\s*", line, maxsplit=1)[0])


@contextmanager
def _install_lock(stack: Stack) -> Iterator[None]:
    """One install of a stack at a time in this checkout (a kernel file lock)."""
    lock_path = ROOT / ".hil-cache" / "stacks" / f"{stack.name}.install-lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"==> [{stack.name}] another install of this stack is running; waiting", flush=True
            )
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


@contextmanager
def _checkout_build_lock() -> Iterator[None]:
    """One build of this checkout at a time (an editable install writes its metadata into the
    checkout): stacks installed side by side take turns for that step only."""
    lock_path = ROOT / ".hil-cache" / "stacks" / "checkout-build.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


class _Installer:
    def __init__(self, stack: Stack, relock: bool) -> None:
        self.stack = stack
        self.relock = relock
        self.work = stack.venv / WORK_NAME
        self.vars = {
            "root": str(ROOT),
            "venv": str(stack.venv),
            "python": str(stack.venv_python),
            "lock": str(stack.lock) if stack.lock else "",
            "work": str(self.work),
        }

    def expand(self, s: str) -> str:
        """Replace the known placeholders; any other brace is left as written."""
        return PLACEHOLDER.sub(lambda m: self.vars[m.group(1)], s)

    def run(self, cmd: list[str], env: dict[str, str]) -> int:
        full_env = {**os.environ, **{k: self.expand(v) for k, v in env.items()}}
        return subprocess.run(cmd, cwd=ROOT, env=full_env).returncode

    def do_step(self, step: Step) -> None:
        py = str(self.stack.venv_python)
        if step.kind == "pip":
            args = [self.expand(a) for a in step.args]
            cmd = [py, "-m", "pip", "--disable-pip-version-check", *args]
            if str(ROOT) in args:  # builds in the checkout: one stack at a time (setup.sh A,B)
                with _checkout_build_lock():
                    rc = self.run(cmd, step.env)
            else:
                rc = self.run(cmd, step.env)
        elif step.kind == "python":
            rc = self.run([py, *(self.expand(a) for a in step.args)], step.env)
        elif step.kind == "extract":
            self.extract(**{k: self.expand(v) for k, v in step.extract.items()})
            rc = 0
        else:
            self.freeze(step.exclude)
            rc = 0
        if rc != 0:
            raise StackError(f"exit {rc}")

    def extract(self, archive: str, member: str, to: str) -> None:
        dest = Path(to)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if archive.endswith((".whl", ".zip")):
            with zipfile.ZipFile(archive) as zf:
                data = zf.read(member)
        else:
            with tarfile.open(archive) as tf:
                fh = tf.extractfile(member)
                if fh is None:
                    raise StackError(f"{member} is not a file in {archive}")
                data = fh.read()
        dest.write_bytes(data)

    def freeze(self, exclude: tuple[str, ...]) -> None:
        lock = self.stack.lock
        if lock is None:
            raise StackError("a freeze step needs lock = ... in the stack file")
        out = subprocess.run(
            [
                str(self.stack.venv_python),
                "-m",
                "pip",
                "--disable-pip-version-check",
                "freeze",
                "--all",
                "--exclude-editable",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if out.returncode != 0:
            raise StackError(f"pip freeze failed: {out.stderr.strip()}")
        skip = {"pip", *(_canon(e) for e in exclude)}
        lines = sorted(
            (ln for ln in out.stdout.splitlines() if ln.strip() and _freeze_name(ln) not in skip),
            key=str.lower,
        )
        header = lock_header_for(self.stack, exclude)
        try:
            n = write_hashed_lock(lock, header, lines, str(self.stack.venv_python))
        except LockError as e:
            raise StackError(f"hashing the pins: {e}") from e
        print(f"    wrote {_rel(lock)} ({n} pins, each with its sha256)", flush=True)

    def check_versions(self) -> None:
        want = self.stack.versions
        if not want:
            return
        code = (
            "import importlib.metadata as md, json, sys\n"
            "want = json.loads(sys.argv[1])\n"
            "bad = []\n"
            "for d, v in want.items():\n"
            "    try:\n"
            "        got = md.version(d)\n"
            "    except md.PackageNotFoundError:\n"
            "        got = None\n"
            "    if got != v:\n"
            "        bad.append(f'{d} {got or \"missing\"} installed, {v} pinned')\n"
            "print('; '.join(bad) if bad else ', '.join(f'{d} {v}' for d, v in want.items()))\n"
            "sys.exit(1 if bad else 0)\n"
        )
        out = subprocess.run(
            [str(self.stack.venv_python), "-c", code, json.dumps(want)],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise StackError(out.stdout.strip() or out.stderr.strip())
        print(f"    {out.stdout.strip()}", flush=True)

    def install(self) -> bool:
        stack = self.stack
        resolve = self.relock or stack.lock is None or not stack.lock.is_file()
        want = stamp_hash(stack)
        if (
            not resolve
            and want is not None
            and installed_stamp(stack) == want
            and stack.venv_python.exists()
        ):
            print(
                f"==> [{stack.name}] {stack.venv.name} is up to date with the pins ({want});"
                " nothing to do",
                flush=True,
            )
            return False
        if self.relock and stack.venv.exists():
            # A lock must be the resolution of the steps alone, not of whatever the venv held.
            print(
                f"==> [{stack.name}] --relock: removing {stack.venv.name} to resolve afresh",
                flush=True,
            )
            shutil.rmtree(stack.venv)
        mode = "resolve" if resolve else "locked"
        steps = [s for s in stack.steps if s.when in ("always", mode)]
        plan = ["create the venv"] if not stack.venv_python.exists() else []
        total = len(plan) + len(steps) + 1
        t_start = time.monotonic()
        n = 0

        def announce(name: str) -> None:
            nonlocal n
            n += 1
            print(f"==> [{stack.name}] step {n}/{total}: {name}", flush=True)

        if plan:
            py = find_python(stack.python)
            announce(f"create {stack.venv.name} with {py}")
            if subprocess.run([py, "-m", "venv", str(stack.venv)]).returncode != 0:
                raise StackError(f"stack {stack.name}: step {n}/{total} 'create the venv' failed")
        # A stamp from an earlier install no longer describes the venv once a step runs.
        stack.stamp_path.unlink(missing_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        for step in steps:
            announce(step.name)
            if step.creates and Path(self.expand(step.creates)).exists():
                print(f"    {self.expand(step.creates)} exists; skipped", flush=True)
                continue
            t0 = time.monotonic()
            try:
                self.do_step(step)
            except StackError as e:
                raise StackError(
                    f"stack {stack.name}: step {n}/{total} {step.name!r} failed: {e}"
                ) from e
            print(f"    ({time.monotonic() - t0:.0f} s)", flush=True)
        announce("check the pinned versions")
        try:
            self.check_versions()
        except StackError as e:
            raise StackError(
                f"stack {stack.name}: step {n}/{total} 'check the pinned versions' failed: {e}"
            ) from e
        stamp = stamp_hash(stack)
        if stamp is None:
            missing = [str(p.relative_to(ROOT)) for p in stack.stamp_files if not p.is_file()]
            raise StackError(
                f"stack {stack.name}: installed, but stamp files are missing: {missing}"
            )
        stack.stamp_path.write_text(stamp + "\n")
        print(
            f"==> [{stack.name}] installed in {time.monotonic() - t_start:.0f} s ({stamp});"
            f" python: {_rel(stack.venv_python)}",
            flush=True,
        )
        return True


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def lock_header_for(stack: Stack, exclude: tuple[str, ...] = ()) -> list[str]:
    """The comment lines at the top of a stack's lock."""
    header = [
        f"# Exact pins of the {stack.name} stack (Linux x86_64, CPython {stack.python}), each with"
        " the sha256 of the file pip picks for it;",
        "# installed with --no-deps --require-hashes. Written by the freeze step of"
        f" {_rel(stack.path)}; regenerate with {stack.install_command()} --relock.",
    ]
    if exclude:
        header.append(f"# Not listed (installed by their own steps): {', '.join(exclude)}.")
    return header


def rehash_lock(name: str) -> int:
    """Re-hash the pins of a stack's lock as they are (no resolve); the pin count."""
    stack = load_stack(name)
    if stack.lock is None or not stack.lock.is_file():
        raise StackError(f"stack {name} has no lock yet: run {stack.install_command()} --relock")
    python = find_python(stack.python)  # its pip reads the same config as the venv's
    try:
        pins = read_pins(stack.lock)
        exclude = next((s.exclude for s in stack.steps if s.kind == "freeze"), ())
        return write_hashed_lock(stack.lock, lock_header_for(stack, exclude), pins, python)
    except LockError as e:
        raise StackError(f"{_rel(stack.lock)}: {e}") from e


def install_stack(name: str, relock: bool = False, venv: Path | None = None) -> bool:
    """Install stack ``name`` into its venv (or into ``venv``); True when something was
    installed.

    Idempotent: with the stamp matching, nothing costly runs. Raises StackError
    naming the failed step.
    """
    stack = load_stack(name)
    if venv is not None:
        stack = replace(stack, venv=venv.resolve())
    with _install_lock(stack):
        return _Installer(stack, relock).install()
