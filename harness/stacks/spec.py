"""Pinned stacks as data: read ``stacks/*.toml`` and install a stack into its own venv.

Runs before any virtual environment exists, so it uses the standard library only::

    python3.11 -m harness.stacks list
    python3.11 -m harness.stacks install legacy-spyre-0.4 [--relock] [--venv PATH]
    python3.11 -m harness.stacks python legacy-spyre-0.4   # the venv's python, if installed
    python3.11 -m harness.stacks rehash default           # re-hash the lock's pins, no resolve

The schema is documented at the top of every stack file. An installed stack has a
stamp file in its venv holding a hash of its stamp files (the stack file and its
pins); ``install`` with an unchanged stamp does nothing, and ``stack_python``
returns a venv's python only when its stamp matches the files in the repo.

Every stack, the default one included (``./setup.sh`` is a thin entry point over
this module), is installed here, step by step: on the first install (no lock file
yet) or with ``--relock`` the ``when = "resolve"`` steps resolve the pins and the
freeze step writes them, each with its hash (``harness.stacks.locks``), into the
lock; later installs run the ``when = "locked"`` steps, which install exactly the
lock with ``--no-deps --require-hashes``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.paths import REPO_ROOT, STACKS_DIR
from harness.core.strict_files import FileFormatError, read_toml
from harness.stacks import host as host_stack

ROOT = REPO_ROOT
STAMP_NAME = ".hil-stack-stamp"
WORK_NAME = ".hil-stack-work"  # downloads and extracted files, inside the venv
DEFAULT_STACK = "default"
INSTALLERS = ("steps",)
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
    previous: str | None = None  # the stack this one succeeds (triage re-runs a failure there)

    @property
    def venv_python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def stamp_path(self) -> Path:
        return self.venv / STAMP_NAME

    def install_command(self) -> str:
        """The command a user runs to install this stack (for skip messages)."""
        if self.name == DEFAULT_STACK:
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
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or name.endswith(".toml"):
        # A path would read a file outside stacks/ (and its name could never match).
        raise StackError(f"{name!r} is not a stack name: name one of the stacks in stacks/"
                         f" (stacks/NAME.toml), not a path: {list_stacks()}")
    path = stack_file(name)
    if not path.is_file():
        raise StackError(f"no stack {name!r}: {path} does not exist (known: {list_stacks()})")
    where = str(path.relative_to(ROOT))
    try:  # strictly: a key twice, a byte-order mark or JSON is refused naming the line
        raw = read_toml(path, "stack file", where)
    except FileFormatError as e:
        raise StackError(str(e)) from None
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
    if name == DEFAULT_STACK:
        # The default stack's engines run in this process's venv with the kinds' own
        # environment and arguments (harness/targets/): a copy here would never be read.
        copies = [k for k in ("env", "engine") if raw.get(k)] + (
            ["targets.env"] if targets.get("env") else [])
        if copies:
            raise StackError(
                f"{where}: {', '.join(copies)} set, but the default stack's engine environment"
                " and arguments are the target kinds' (harness/targets/<kind>.py); change them"
                " there, or describe a stack of its own")
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
        previous=_previous(raw.get("previous"), where),
    )


def _previous(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise StackError(f"{where}: previous must be a stack name, got {value!r}")
    return value.strip()


# -- stamps ----------------------------------------------------------------------------


def stamp_hash(stack: Stack) -> str | None:
    """sha256 of the stamp files' bytes, concatenated in order (first 16 hex digits).

    (``cat FILES | sha256sum | cut -c1-16``.) None when a stamp file is missing
    (for example a lock not yet resolved).
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


def variant_problem(stack: Stack, variant_id: str) -> str | None:
    """Why ``stack`` cannot run the target variant ``variant_id`` here (it declares the variant
    unsupported, lists targets without it, or is not installed), or None."""
    if variant_id in stack.unsupported:
        return f"{variant_id} does not run on stack {stack.name}: {stack.unsupported[variant_id]}"
    if stack.targets and variant_id not in stack.targets:
        return f"{variant_id} is not among the targets of stack {stack.name}"
    if stack_python(stack.name) is None:
        return f"stack {stack.name} is not installed: run ./setup.sh --stack {stack.name}"
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


# -- command line ----------------------------------------------------------------------


def stack_version(name: str, *dists: str) -> tuple[int, ...] | None:
    """The release (numbers only: ``0.28.0`` -> (0, 28, 0)) of the first of ``dists`` that
    stack ``name`` pins in its [versions] (the host stack: has installed); None if none."""
    for dist in dists:
        if name == host_stack.HOST:
            version = host_stack.installed_version(dist)
        else:
            try:
                version = load_stack(name).versions.get(dist)
            except Exception:  # an unknown stack is refused elsewhere with its own message
                return None
        if version:
            return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])
    return None
