"""The value types of the harness's options and ``HIL_*`` variables, and the one function that
reads a raw string as one of them.

Each type is a pydantic ``TypeAdapter`` over an ``Annotated`` constraint (a probability in
(0, 1], seconds finite and above 0...) with the sentence that tells a user what it accepts.
``parse`` turns a string given for a named option or variable into its value, or raises
``SettingError``: one line naming the option (or the variable and its option), the value seen
and the accepted form, never pydantic's multi-line report.

The types that look at the disk (an existing file or folder, a folder the run can write in) are
checked in two steps: ``parse(..., on_disk=False)`` checks the text alone (what an argument
parser may do for any run, even one that only asks for ``--help``); ``on_disk=True`` also looks
at the path, once the run is known to use it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, TypeAdapter, ValidationError

# The most logprobs an engine returns per position: vLLM's max_logprobs, which the harness
# leaves at vLLM's default (the targets' llm_kwargs, harness/targets/base.py, do not set it).
# The near-tie rule's top-k is recorded from the engine, so it can be no larger.
MAX_LOGPROBS = 20

FLAG_TRUE = ("1", "true", "yes", "on")
FLAG_FALSE = ("0", "false", "no", "off")
_SHOWN = 200  # characters of a bad value quoted in a message (a path in full)


class SettingError(ValueError):
    """A value an option or variable does not accept. ``str()`` is the whole one-line message
    (``where: detail``); ``detail`` is the part after the name, for an argument parser that
    names the option itself."""

    def __init__(self, where: str, detail: str) -> None:
        self.where = where
        self.detail = detail
        super().__init__(f"{where}: {detail}")


def _flag(raw: Any) -> Any:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in FLAG_TRUE:
        return True
    if text in FLAG_FALSE:
        return False
    raise ValueError("is not a yes/no value")


def _shard(raw: str) -> str:
    i, sep, n = raw.partition("/")
    if not sep or not (i.strip().isdigit() and n.strip().isdigit()):
        raise ValueError("is not of the form I/N")
    if not 1 <= int(i) <= int(n):
        raise ValueError("is out of range: I must be between 1 and N")
    return f"{int(i)}/{int(n)}"




def _text(raw: str) -> str:
    if "\0" in raw:
        raise ValueError("contains a NUL character")
    return raw


def _path(raw: str) -> str:
    if not raw.strip():
        raise ValueError("is empty")
    return _text(raw)


@dataclass(frozen=True)
class ValueType:
    """One kind of value: its pydantic type, the sentence of what it accepts, and, for paths,
    the check of what the path names (run only when asked: ``parse(on_disk=True)``)."""

    name: str
    form: str  # what it accepts, as the end of "expected ...": "a number in (0, 1]"
    adapter: TypeAdapter[Any]
    disk_check: Callable[[Path], str | None] | None = None  # why the path is not usable


def _existing_file(p: Path) -> str | None:
    if not p.exists():
        return "does not exist"
    return None if p.is_file() else "is not a file"


def _existing_folder(p: Path) -> str | None:
    if not p.exists():
        return "does not exist"
    return None if p.is_dir() else "is a file, not a folder"


def _writable_folder(p: Path) -> str | None:
    """A folder the run may write in: one that exists and is writable, or one that can be
    made (its nearest existing parent is a writable folder). Nothing is created."""
    p = p.absolute()
    if p.exists():
        if not p.is_dir():
            return "is a file, not a folder"
        return None if _can_write(p) else "is a folder this user cannot write in"
    parent = next((a for a in p.parents if a.exists()), None)
    if parent is None or not parent.is_dir():
        return f"cannot be made: {parent} is a file, not a folder"
    return None if _can_write(parent) else f"cannot be made: {parent} is not writable"


def _can_write(folder: Path) -> bool:
    """Whether a file can be made in ``folder``: a real attempt, as the permission bits tell
    neither for root nor on a read-only file system. The probe file is removed at once."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    probe = folder / f".hil-write-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        return False
    os.close(fd)
    probe.unlink(missing_ok=True)
    return True


def _number(**limits: Any) -> TypeAdapter[Any]:
    return TypeAdapter(Annotated[float, Field(allow_inf_nan=False, **limits)])


def _integer(**limits: Any) -> TypeAdapter[Any]:
    return TypeAdapter(Annotated[int, Field(**limits)])


_PATH = TypeAdapter(Annotated[str, AfterValidator(_path)])

TYPES: dict[str, ValueType] = {t.name: t for t in (
    ValueType("text", "any text", TypeAdapter(Annotated[str, AfterValidator(_text)])),
    ValueType("flag", f"a yes/no value, one of {', '.join(FLAG_TRUE + FLAG_FALSE)}",
              TypeAdapter(Annotated[bool, BeforeValidator(_flag)])),
    ValueType("probability", "a probability, a number in (0, 1]", _number(gt=0, le=1)),
    ValueType("top-k", f"a whole number from 1 to {MAX_LOGPROBS} (the most logprobs an engine"
              " returns per position)", _integer(ge=1, le=MAX_LOGPROBS)),
    ValueType("seconds", "seconds, a finite number above 0", _number(gt=0)),
    ValueType("tolerance", "a tolerance, a finite number, 0 or more", _number(ge=0)),
    ValueType("count", "a whole number, 1 or more", _integer(ge=1)),
    ValueType("whole", "a whole number, 0 or more", _integer(ge=0)),
    ValueType("port", "a port, a whole number from 0 to 65535 (0: any free port)",
              _integer(ge=0, le=65535)),
    ValueType("shard", "I/N, shard I of N with 1 <= I <= N (e.g. 1/2)",
              TypeAdapter(Annotated[str, AfterValidator(_shard)])),
    ValueType("path", "a path", _PATH),
    ValueType("file", "an existing file", _PATH, _existing_file),
    ValueType("folder", "an existing folder", _PATH, _existing_folder),
    ValueType("writable-folder", "a folder this user can write in (made when missing)", _PATH,
              _writable_folder),
)}


def choice(*options: str) -> ValueType:
    """A type of one of ``options`` (exactly as written)."""

    def one_of(raw: str) -> str:
        if raw.strip() not in options:
            raise ValueError("is not a known value")
        return raw.strip()

    return ValueType(f"one of {'/'.join(options)}", f"one of {', '.join(options)}",
                     TypeAdapter(Annotated[str, AfterValidator(one_of)]))


def value_type(kind: str | ValueType) -> ValueType:
    """The declared type ``kind`` (a name of ``TYPES``, or a type made by ``choice``)."""
    return kind if isinstance(kind, ValueType) else TYPES[kind]


def where(option: str | None = None, variable: str | None = None) -> str:
    """How a message names a setting: the option, the variable, or the variable and the option
    it sets (``VARIABLE (option --name)``)."""
    if variable and option:
        return f"{variable} (option {option})"
    return variable or option or "value"


def shown(raw: object) -> str:
    """A value quoted in a message, cut short when long."""
    text = repr(raw)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 4] + "...'"


# pydantic's error kinds, as the predicate of "VALUE ...; expected FORM".
_REASONS = {
    "finite_number": "is not finite",
    "greater_than": "is out of range", "greater_than_equal": "is out of range",
    "less_than": "is out of range", "less_than_equal": "is out of range",
    "int_parsing": "is not a whole number", "int_from_float": "is not a whole number",
    "int_parsing_size": "is not a whole number of a usable size",
    "float_parsing": "is not a number", "bool_parsing": "is not a yes/no value",
}


def _reason(err: ValidationError) -> str:
    first = err.errors(include_url=False)[0]
    if first["type"] == "value_error":
        return str(first.get("ctx", {}).get("error", "is not accepted"))
    return _REASONS.get(first["type"], "is not accepted")


def parse(kind: str | ValueType, raw: str, option: str | None = None,
          variable: str | None = None, on_disk: bool = True) -> Any:
    """``raw`` read as a value of type ``kind``, for the setting named by ``option`` and/or
    ``variable``; SettingError otherwise. With ``on_disk``, a path type also checks what the
    path names (an existing file, a writable folder...)."""
    t = value_type(kind)
    name = where(option, variable)
    try:
        value = t.adapter.validate_python(raw)
    except ValidationError as e:
        raise SettingError(name, f"{shown(raw)} {_reason(e)}; expected {t.form}") from None
    if on_disk and t.disk_check is not None:
        try:
            problem = t.disk_check(Path(value))
        except OSError as e:  # a name too long, a loop of links...
            problem = f"cannot be looked at ({e.strerror or e})"
        if problem:
            raise SettingError(name, f"{shown(raw)} {problem}; expected {t.form}")
    return value
