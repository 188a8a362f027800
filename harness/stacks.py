"""Pinned stacks as data: read ``stacks/*.toml`` and install a stack into its own venv.

Runs before any virtual environment exists, so it uses the standard library only::

    python3.11 -m harness.stacks list
    python3.11 -m harness.stacks install legacy-spyre-0.4 [--relock]
    python3.11 -m harness.stacks python legacy-spyre-0.4   # the venv's python, if installed

The schema is documented at the top of every stack file. An installed stack has a
stamp file in its venv holding a hash of its stamp files (the stack file and its
pins); ``install`` with an unchanged stamp does nothing, and ``stack_python``
returns a venv's python only when its stamp matches the files in the repo.

Stacks with ``installer = "steps"`` are installed here, step by step: on the first
install (no lock file yet) or with ``--relock`` the ``when = "resolve"`` steps
resolve the pins and freeze them into the lock; later installs run the
``when = "locked"`` steps, which install exactly the lock with ``--no-deps``.
The default stack has ``installer = "setup.sh"``: ``install default`` runs setup.sh.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STACKS_DIR = ROOT / "stacks"
STAMP_NAME = ".hil-stack-stamp"
WORK_NAME = ".hil-stack-work"  # downloads and extracted files, inside the venv
DEFAULT_STACK = "default"
INSTALLERS = ("steps", "setup.sh")
WHEN = ("always", "resolve", "locked")
STEP_KINDS = ("pip", "python", "extract", "freeze")
PLACEHOLDER = re.compile(r"\{(root|venv|python|lock|work)\}")


class StackError(Exception):
    """A stack file that is wrong, or an install step that failed (named in the message)."""


@dataclass(frozen=True)
class Step:
    """One install step; exactly one of ``pip``, ``python``, ``extract``, ``freeze``."""

    name: str
    kind: str
    when: str = "always"
    args: tuple[str, ...] = ()  # pip / python arguments
    extract: dict[str, str] = field(default_factory=dict)  # archive, member, to
    exclude: tuple[str, ...] = ()  # freeze: distributions left out of the lock
    creates: str | None = None  # skip the step when this path exists
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Stack:
    """One pinned stack, as read from ``stacks/<name>.toml`` (paths made absolute)."""

    name: str
    path: Path
    description: str
    python: str
    venv: Path
    installer: str
    lock: Path | None
    stamp_files: tuple[Path, ...]
    versions: dict[str, str]
    env: dict[str, str]
    engine: dict[str, Any]
    targets: tuple[str, ...]
    unsupported: dict[str, str]
    target_env: dict[str, dict[str, str]]
    unsupported_suites: dict[str, str]
    notes: tuple[str, ...]
    steps: tuple[Step, ...]

    @property
    def venv_python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def stamp_path(self) -> Path:
        return self.venv / STAMP_NAME

    def install_command(self) -> str:
        """The command a user runs to install this stack (for skip messages)."""
        if self.installer == "setup.sh":
            return "./setup.sh"
        return f"./setup.sh --stack {self.name}"


# -- reading stack files ---------------------------------------------------------------


def _str_map(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise StackError(f"{where} must be a table of strings")
    return {str(k): v for k, v in raw.items()}


def _str_list(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise StackError(f"{where} must be a list of strings")
    return tuple(raw)


def _step(raw: Any, index: int, where: str) -> Step:
    if not isinstance(raw, dict):
        raise StackError(f"{where}: steps[{index}] must be a table")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise StackError(f"{where}: steps[{index}] has no name")
    kinds = [k for k in STEP_KINDS if k in raw]
    if len(kinds) != 1:
        raise StackError(
            f"{where}: step {name!r} must have exactly one of {', '.join(STEP_KINDS)}"
            f" (has {', '.join(kinds) or 'none'})"
        )
    kind = kinds[0]
    when = raw.get("when", "always")
    if when not in WHEN:
        raise StackError(f"{where}: step {name!r}: when = {when!r}, known: {', '.join(WHEN)}")
    known = {"name", "when", "creates", "env", *STEP_KINDS}
    extra = sorted(set(raw) - known)
    if extra:
        raise StackError(f"{where}: step {name!r}: unknown keys {extra}")
    step = Step(
        name=name,
        kind=kind,
        when=when,
        creates=raw.get("creates"),
        env=_str_map(raw.get("env"), f"{where}: step {name!r} env"),
    )
    if kind in ("pip", "python"):
        return dataclasses.replace(step, args=_str_list(raw[kind], f"{where}: step {name!r}"))
    if kind == "extract":
        ex = _str_map(raw["extract"], f"{where}: step {name!r} extract")
        if set(ex) != {"archive", "member", "to"}:
            raise StackError(f"{where}: step {name!r}: extract needs archive, member and to")
        return dataclasses.replace(step, extract=ex)
    fr = raw["freeze"]
    if not isinstance(fr, dict):
        raise StackError(f"{where}: step {name!r}: freeze must be a table (exclude = [...])")
    exclude = _str_list(fr.get("exclude"), f"{where}: step {name!r} freeze.exclude")
    return dataclasses.replace(step, exclude=exclude)


def stack_file(name: str) -> Path:
    return STACKS_DIR / f"{name}.toml"


def list_stacks() -> list[str]:
    """Names of the stacks in ``stacks/``, the default first."""
    names = sorted(p.stem for p in STACKS_DIR.glob("*.toml"))
    return sorted(names, key=lambda n: (n != DEFAULT_STACK, n))


def load_stack(name: str) -> Stack:
    """Read and check ``stacks/<name>.toml``; StackError names what is wrong."""
    path = stack_file(name)
    if not path.is_file():
        raise StackError(f"no stack {name!r}: {path} does not exist (known: {list_stacks()})")
    where = str(path.relative_to(ROOT))
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise StackError(f"{where}: {e}") from e
    if raw.get("name") != name:
        raise StackError(f"{where}: name = {raw.get('name')!r}, expected {name!r} (the file name)")
    installer = raw.get("installer", "steps")
    if installer not in INSTALLERS:
        raise StackError(f"{where}: installer = {installer!r}, known: {', '.join(INSTALLERS)}")
    for key in ("venv", "python"):
        if not isinstance(raw.get(key), str):
            raise StackError(f"{where}: {key} is missing")
    steps = tuple(_step(s, i, where) for i, s in enumerate(raw.get("steps", [])))
    if installer == "steps" and not steps:
        raise StackError(f"{where}: installer = 'steps' but no [[steps]]")
    lock = raw.get("lock")
    targets = raw.get("targets", {})
    if not isinstance(targets, dict):
        raise StackError(f"{where}: [targets] must be a table")
    target_env = {
        label: _str_map(env, f"{where}: targets.env.{label}")
        for label, env in (targets.get("env") or {}).items()
    }
    stamp_files = _str_list(raw.get("stamp_files"), f"{where}: stamp_files")
    if not stamp_files:
        raise StackError(f"{where}: stamp_files is empty")
    return Stack(
        name=name,
        path=path,
        description=str(raw.get("description", "")),
        python=raw["python"],
        venv=ROOT / raw["venv"],
        installer=installer,
        lock=ROOT / lock if isinstance(lock, str) else None,
        stamp_files=tuple(ROOT / p for p in stamp_files),
        versions=_str_map(raw.get("versions"), f"{where}: [versions]"),
        env=_str_map(raw.get("env"), f"{where}: [env]"),
        engine=dict(raw.get("engine", {})),
        targets=_str_list(targets.get("supported"), f"{where}: targets.supported"),
        unsupported=_str_map(targets.get("unsupported"), f"{where}: targets.unsupported"),
        target_env=target_env,
        unsupported_suites=_str_map((raw.get("suites") or {}).get("unsupported"),
                                    f"{where}: suites.unsupported"),
        notes=_str_list(raw.get("notes"), f"{where}: notes"),
        steps=steps,
    )


# -- stamps ----------------------------------------------------------------------------


def stamp_hash(stack: Stack) -> str | None:
    """sha256 of the stamp files' bytes, concatenated in order (first 16 hex digits).

    The same recipe as setup.sh (``cat FILES | sha256sum | cut -c1-16``), so the
    default stack's stamp written by setup.sh is read here unchanged. None when a
    stamp file is missing (for example a lock not yet resolved).
    """
    h = hashlib.sha256()
    for p in stack.stamp_files:
        if not p.is_file():
            return None
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def installed_stamp(stack: Stack) -> str | None:
    try:
        return stack.stamp_path.read_text().strip() or None
    except OSError:
        return None


def stack_python(name: str) -> Path | None:
    """The stack venv's python when it is installed and its stamp matches the repo's files."""
    stack = load_stack(name)
    want = stamp_hash(stack)
    if want is None or installed_stamp(stack) != want or not stack.venv_python.exists():
        return None
    return stack.venv_python


def stack_status(stack: Stack) -> str:
    """``installed``, ``not installed``, ``stale (pins changed)`` or ``not resolved (no lock)``."""
    want = stamp_hash(stack)
    have = installed_stamp(stack)
    if not stack.venv_python.exists() or have is None:
        return "not installed" if want is not None else "not installed (no lock yet)"
    if want is None:
        return "not resolved (a stamp file is missing)"
    return "installed" if have == want else "stale (pins changed since install)"


# -- installing ------------------------------------------------------------------------


def find_python(version: str) -> str:
    """An interpreter of ``version`` (``3.11``; ``3`` takes any 3.x): $HIL_PYTHON, pythonX.Y, python3."""
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
            rc = self.run([py, "-m", "pip", "--disable-pip-version-check", *args], step.env)
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
        rel = self.stack.path.relative_to(ROOT)
        header = [
            f"# Exact pins of the {self.stack.name} stack (Linux x86_64, CPython"
            f" {self.stack.python}), installed with --no-deps.",
            f"# Written by the freeze step of {rel}; regenerate with"
            f" ./setup.sh --stack {self.stack.name} --relock.",
        ]
        if exclude:
            header.append(f"# Not listed (installed by their own steps): {', '.join(exclude)}.")
        tmp = lock.with_suffix(lock.suffix + ".new")
        tmp.write_text("\n".join(header + lines) + "\n")
        tmp.replace(lock)
        print(f"    wrote {lock.relative_to(ROOT)} ({len(lines)} pins)", flush=True)

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
            f" python: {stack.venv_python.relative_to(ROOT)}",
            flush=True,
        )
        return True


def install_stack(name: str, relock: bool = False) -> bool:
    """Install stack ``name`` into its venv; True when something was installed.

    Idempotent: with the stamp matching, nothing costly runs. Raises StackError
    naming the failed step.
    """
    stack = load_stack(name)
    if stack.installer == "setup.sh":
        cmd = ["bash", str(ROOT / "setup.sh"), *(["--relock"] if relock else [])]
        print(f"==> [{stack.name}] installed by setup.sh: {' '.join(cmd)}", flush=True)
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        if rc != 0:
            raise StackError(f"stack {stack.name}: setup.sh failed (exit {rc})")
        return True
    with _install_lock(stack):
        return _Installer(stack, relock).install()


# -- command line ----------------------------------------------------------------------


def _cmd_list() -> int:
    for name in list_stacks():
        try:
            stack = load_stack(name)
        except StackError as e:
            print(f"{name:<22} BROKEN: {e}")
            continue
        print(f"{name:<22} {stack_status(stack):<14} {stack.venv.name:<26} {stack.description}")
        if stack.targets:
            print(f"{'':<22} targets: {', '.join(stack.targets)}")
        for label, why in stack.unsupported.items():
            print(f"{'':<22} not {label}: {why}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.stacks", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the stacks and whether each is installed")
    p_inst = sub.add_parser("install", help="install a stack into its venv (idempotent)")
    p_inst.add_argument("name")
    p_inst.add_argument(
        "--relock", action="store_true", help="resolve the pins afresh and rewrite the stack's lock"
    )
    p_py = sub.add_parser("python", help="print the python of an installed stack")
    p_py.add_argument("name")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "list":
            return _cmd_list()
        if args.cmd == "python":
            py = stack_python(args.name)
            if py is None:
                stack = load_stack(args.name)
                print(
                    f"stack {args.name} is {stack_status(stack)}; run {stack.install_command()}",
                    file=sys.stderr,
                )
                return 1
            print(py)
            return 0
        install_stack(args.name, relock=args.relock)
        return 0
    except StackError as e:
        print(f"harness.stacks: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
