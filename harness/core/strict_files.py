"""Input files read strictly: the one reader of every TOML and YAML file a user or a lab writes
(inventories, quarantine files, stack files).

A file is refused, naming the file, the line and what is wrong, when it

- is not UTF-8 text, or starts with a byte-order mark (a UTF-8 one, which tomllib refuses as
  an "Invalid statement" and PyYAML skips unseen; a UTF-16 or UTF-32 one: text of another
  encoding);
- defines one key twice (PyYAML keeps the last one silently, so a second device of one id
  or address would replace the first without a word; tomllib refuses it, said here as the
  duplicate it is);
- is JSON where TOML is expected (tomllib says "Invalid statement" at line 1).

Every refusal is a ``FileFormatError`` (a ValueError): its readers turn it into their own
error type, with the message as it is.
"""

from __future__ import annotations

import functools
import json
import re
import tomllib
from pathlib import Path
from typing import Any

# Byte-order marks, longest first (UTF-32's begins with UTF-16's).
BOMS = (
    (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\xef\xbb\xbf", "UTF-8"), (b"\xfe\xff", "UTF-16"), (b"\xff\xfe", "UTF-16"),
)
_AT = re.compile(r"^(?P<what>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$", re.S)
_AT_END = re.compile(r"^(?P<what>.*) \(at end of document\)$", re.S)
YAML_MERGE = "tag:yaml.org,2002:merge"


class FileFormatError(ValueError):
    """A file its reader refuses; the message names the file, the line and what is wrong."""


def read_text(path: Path, what: str, shown: str | None = None) -> str:
    """The UTF-8 text of ``path`` (``what``: "inventory file"...; ``shown``: how messages
    name the file, by default its path). FileFormatError for a byte-order mark or bytes that
    are not UTF-8; OSError as ``open`` raises it."""
    name = str(path) if shown is None else shown
    with open(path, "rb") as f:
        data = f.read()
    for mark, encoding in BOMS:
        if data.startswith(mark):
            if encoding == "UTF-8":
                raise FileFormatError(
                    f"{name}: line 1: {what} starts with a byte-order mark (U+FEFF, bytes"
                    " EF BB BF); save the file as UTF-8 without a BOM")
            raise FileFormatError(
                f"{name}: line 1: {what} is {encoding} text (it starts with a {encoding}"
                " byte-order mark); save the file as UTF-8 without a BOM")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise FileFormatError(
            f"{name}: {what} is not UTF-8 text: byte {data[e.start:e.start + 1]!r} at line"
            f" {line} (offset {e.start}); save the file as UTF-8") from None


def read_toml(path: Path, what: str, shown: str | None = None) -> dict[str, Any]:
    """``path`` read as TOML, strictly (see the module doc)."""
    name = str(path) if shown is None else shown
    return parse_toml(read_text(path, what, name), name)


def read_yaml(path: Path, what: str, shown: str | None = None) -> Any:
    """``path`` read as YAML (safe types only), strictly: a key twice in one mapping is
    refused. None for an empty document."""
    name = str(path) if shown is None else shown
    return parse_yaml(read_text(path, what, name), name)


# ------------------------------------------------------------------ TOML


def parse_toml(text: str, name: str) -> dict[str, Any]:
    """``text`` (the file ``name``) as TOML; FileFormatError naming the line and what is
    wrong, a duplicate and JSON said as such."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise FileFormatError(_toml_problem(text, name, str(e))) from None


def _toml_problem(text: str, name: str, raw: str) -> str:
    json_line = _json_start(text)
    if json_line:
        return (f"{name}: invalid TOML: line {json_line}, column 1: this is JSON, not TOML;"
                " write it as TOML (key = value lines, [table] and [[array]] headers)")
    at = _AT.match(raw)
    if at is None:
        end = _AT_END.match(raw)
        last = max(1, len(text.splitlines()))
        return (f"{name}: invalid TOML: line {last}, at the end of the file:"
                f" {end['what'] if end else raw}")
    line, col, what = int(at["line"]), int(at["col"]), at["what"]
    return f"{name}: invalid TOML: line {line}, column {col}: {_toml_meaning(what, text, line)}"


def _json_start(text: str) -> int:
    """The line a JSON document starts on, when ``text`` is one (or starts as one: a line of
    TOML never starts with ``{``); 0 when it is not."""
    stripped = text.lstrip()
    if not stripped:
        return 0
    line = text[: len(text) - len(stripped)].count("\n") + 1
    if stripped.startswith("{"):
        return line
    try:
        return line if isinstance(json.loads(text), (dict, list)) else 0
    except ValueError:
        return 0


def _toml_meaning(what: str, text: str, line: int) -> str:
    """tomllib's message ``what`` at ``line``, said as what is wrong when it is a key or table
    defined twice; else as tomllib says it."""
    source = text.splitlines()[line - 1].strip() if 0 < line <= len(text.splitlines()) else ""
    header = re.match(r"^\[\[?\s*(.*?)\s*\]\]?", source)
    thing = (f"table [{header.group(1)}]" if header else
             f"key {source.partition('=')[0].strip()!r}" if "=" in source else "a key")
    if what == "Cannot overwrite a value" or what.startswith("Cannot redefine namespace"):
        return f"{thing} is defined twice (a key or table of that name came before); keep one"
    if what.startswith("Cannot declare"):
        return f"{thing} is declared twice; keep one table of that name, with all its keys"
    if what.startswith("Cannot mutate immutable namespace"):
        return (f"{thing} adds to {_dotted(what)!r}, which is already defined whole before (an"
                " inline table or an array); define it in one place")
    if what.startswith("Duplicate inline table key"):
        return (f"key {what.rpartition(' ')[2]} is defined twice in one inline table;"
                " keep one")
    return what


def _dotted(what: str) -> str:
    """The key path at the end of a tomllib message (``('a', 'b')``) as TOML writes it."""
    parts = re.findall(r"'((?:[^'\\]|\\.)*)'", what.partition("(")[2])
    return ".".join(parts) or what.rpartition(" ")[2]


# ------------------------------------------------------------------ YAML


@functools.cache
def strict_yaml_loader() -> type:
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the
    last one silently). Keys a ``<<`` merge brings in may be overridden, as YAML means. Made
    on first use: the stack files' reader runs before any venv exists (standard library
    only), and this module is imported there."""
    import yaml

    class StrictYamlLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}  # key -> the mark of its first definition
                for key_node, _ in node.value:
                    if key_node.tag == YAML_MERGE:
                        continue
                    try:
                        key = self.construct_object(key_node, deep=True)
                        first = seen.get(key)
                    except TypeError:  # an unhashable key: the base loader says so
                        continue
                    if first is not None:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key!r} is defined twice in one mapping (also at"
                            f" line {first.line + 1}); keep one", key_node.start_mark)
                    seen[key] = key_node.start_mark
            return super().construct_mapping(node, deep)

    return StrictYamlLoader


def parse_yaml(text: str, name: str) -> Any:
    """``text`` (the file ``name``) as YAML with ``strict_yaml_loader``; FileFormatError naming
    the line and what is wrong."""
    import yaml

    try:
        return yaml.load(text, Loader=strict_yaml_loader())  # noqa: S506 (a safe loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown line"
        raise FileFormatError(f"{name}: invalid YAML at {where}: {e.problem}") from None
    except yaml.YAMLError as e:  # an error without a position (rare: a reader error)
        raise FileFormatError(f"{name}: invalid YAML: {e}") from None
