"""Schemas of the files a person writes (inventory, quarantine), checked with jsonschema.

``check(data, schema, source)`` raises ``SchemaError`` with one message that names the
file, where in it (``device #2 ('card0') field 'address'``), the value seen and what to
do. Unknown keys are errors: a typo (``[[knwon]]``) must not silently do nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from harness.targets import device_kinds

# Device ids name lock files and reports: no path separators, no dots at the start.
DEVICE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

INVENTORY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["device"],
    "properties": {
        "device": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["id", "kind"],
                "properties": {
                    "id": {"type": "string", "pattern": DEVICE_ID_PATTERN},
                    # kind, backend and each kind's own keys (before env): filled from the
                    # kind registry by inventory_schema()
                    "kind": {"enum": []},
                    "backend": {"enum": []},
                    "address": {"type": "string", "minLength": 1},
                    "features": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                    "health": {"enum": ["ok", "broken", "maintenance"]},
                    "env": {
                        "type": "object",
                        "propertyNames": {"pattern": ENV_NAME_PATTERN},
                        "additionalProperties": {"type": ["string", "integer", "boolean"]},
                    },
                },
            },
        },
        # Groups of devices a tensor-parallel engine leases together ([[group]] in TOML): rank
        # i on devices[i]; checked against the devices by harness.lab.inventory.
        "group": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["id", "devices"],
                "properties": {
                    "id": {"type": "string", "pattern": DEVICE_ID_PATTERN},
                    "devices": {"type": "array", "minItems": 2, "uniqueItems": True,
                                "items": {"type": "string", "pattern": DEVICE_ID_PATTERN}},
                },
            },
        },
        # A lab's own geometries ([geometry.NAME] in TOML), each checked key by key by
        # harness.geometry.catalog.parse_geometry when --geometry reads them.
        "geometry": {
            "type": "object",
            "propertyNames": {"pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"},
            "additionalProperties": {"type": "object"},
        },
    },
}

def inventory_schema() -> dict[str, Any]:
    """The inventory schema with what the kind registry's device kinds declare: their names
    (``kind``), their backends (``backend``) and their own keys with their schemas, placed
    before ``env`` (a key several kinds declare takes the first one's schema)."""
    schema = copy.deepcopy(INVENTORY_SCHEMA)
    fields = schema["properties"]["device"]["items"]["properties"]
    kinds = device_kinds().values()
    fields["kind"]["enum"] = [dk.name for dk in kinds]
    fields["backend"]["enum"] = list(dict.fromkeys(b for dk in kinds for b in dk.backends))
    env = fields.pop("env")
    for dk in kinds:
        for key in dk.inventory_keys:
            fields.setdefault(key, copy.deepcopy(dict(dk.inventory_key_schemas.get(key, {}))))
    fields["env"] = env
    return schema


QUARANTINE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "known": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                # test or check (or both): harness.lab.quarantine says which one is missing
                "required": ["reason", "issue"],
                "properties": {
                    "test": {"type": "string", "minLength": 1},
                    "reason": {"type": "string", "minLength": 1},
                    "issue": {"type": "string", "minLength": 1},
                    "stacks": {"type": "array", "minItems": 1,
                               "items": {"type": "string", "minLength": 1}},
                    "cpu_lacks": {"type": "array", "minItems": 1, "uniqueItems": True,
                                  "items": {"type": "string", "pattern": r"^[a-z0-9_]+$"}},
                    # an explorer verdict (hil explore): its check, the target variants (id
                    # prefixes), a regex of its first line, named conditions of its example;
                    # their meaning is checked by harness.lab.quarantine
                    "check": {"type": "string", "minLength": 1},
                    "targets": {"type": "array", "minItems": 1, "uniqueItems": True,
                                "items": {"type": "string", "minLength": 1}},
                    "why": {"type": "string", "minLength": 1},
                    "when": {"type": "array", "minItems": 1, "uniqueItems": True,
                             "items": {"type": "string", "minLength": 1}},
                },
            },
        },
    },
}

# What to do, per schema keyword, said once at the end of the message.
_HINTS = {
    "additionalProperties": "remove it or fix its spelling",
    "required": "add it",
    "pattern": "use letters, digits, '.', '_' and '-' only (at most 64, not starting with"
               " '.' or '-')",
    "enum": "use one of the values listed",
    "type": "change it to that type",
    "minLength": "give it a value",
    "uniqueItems": "list each value once",
}


class SchemaError(ValueError):
    """A file that does not match its schema; the message names file, place, value and fix."""


def _where(path: Sequence[Any], data: Any, item_names: dict[str, str]) -> tuple[str, str]:
    """(``device #2 ('card0')``, ``env.NAME``) for the path ['device', 1, 'env', 'NAME']:
    the entry the value is in, and the dotted key of the value inside it."""
    entry_parts: list[str] = []
    keys: list[str] = []
    node = data
    path = list(path)
    i = 0
    while i < len(path):
        key = path[i]
        if isinstance(key, str) and key in item_names and i + 1 < len(path) \
                and isinstance(path[i + 1], int) and not keys:
            n = path[i + 1]
            entry = node[key][n] if isinstance(node, dict) else None
            label = entry.get(item_names[key]) if isinstance(entry, dict) else None
            entry_parts.append(f"{key} #{n + 1}" + (f" ({label!r})" if isinstance(label, str) else ""))
            node = entry
            i += 2
            continue
        keys.append(str(key) if isinstance(key, str) else f"[{key}]")
        node = node[key] if isinstance(node, (dict, list)) else None
        i += 1
    return " ".join(entry_parts), ".".join(keys).replace(".[", "[")


def _describe(err: ValidationError, data: Any, item_names: dict[str, str]) -> str:
    where, key = _where(err.absolute_path, data, item_names)
    name = f"{key} " if key else ""
    scope = f" in {key}" if key else ""
    value = err.instance
    hint = _HINTS.get(str(err.validator), "fix it")
    if err.validator == "additionalProperties":
        extra = sorted(set(value) - set(err.schema.get("properties", {})))
        known = ", ".join(err.schema.get("properties", {}))
        what = f"unknown field(s) {extra}{scope} (known: {known})"
    elif err.validator == "required":
        missing = [k for k in err.validator_value if k not in value]
        what = f"missing {', '.join(map(repr, missing))}{scope}"
    elif err.validator == "enum":
        what = f"{name}{value!r} is not one of {', '.join(map(str, err.validator_value))}"
    elif err.validator == "type":
        wants = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        seen = _TYPE_NAMES.get(type(value).__name__, type(value).__name__)
        what = f"{name}{value!r} is {seen}, expected {' or '.join(_WANT_NAMES.get(w, w) for w in wants)}"
        last = key.rsplit(".", 1)[-1] or "it"
        if wants == ["array"]:
            hint = f"write a list ({last} = [...], or [[{last}]] tables in TOML)"
        elif wants == ["object"]:
            hint = f"write a table ([{last}] or {last} = {{...}} in TOML)"
        elif wants == ["string"]:
            hint = f'quote it ({last} = "...")'
        else:
            hint = "write a value of that type"
    elif err.validator == "minItems":  # the schema's own minimum (a group holds 2 or more)
        least = err.validator_value
        what = f"{name}{value!r} lists {len(value)}, at least {least} needed"
        hint = f"list {least} or more"
    elif err.validator == "pattern":
        what = f"{name}{value!r} is not allowed"
        if err.validator_value == ENV_NAME_PATTERN:
            hint = "use a variable name: letters, digits and '_', not starting with a digit"
    else:
        what = f"{name}{value!r}: {err.message}"
    return f"{where + ': ' if where else ''}{what}; {hint}"


_TYPE_NAMES = {"int": "a number", "str": "a string", "dict": "a table", "list": "a list",
               "float": "a number", "bool": "a boolean"}
_WANT_NAMES = {"string": "a string", "array": "a list", "object": "a table",
               "integer": "a whole number", "boolean": "true or false", "number": "a number"}


def check(data: Any, schema: dict[str, Any], source: str,
          item_names: dict[str, str] | None = None) -> None:
    """Raise SchemaError naming ``source`` and every problem (first ones first)."""
    validator = Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)),
                                                               str(e.validator)))
    if not errors:
        return
    names = item_names or {}
    lines = list(dict.fromkeys(_describe(e, data, names) for e in errors))
    more = f" (and {len(lines) - 5} more)" if len(lines) > 5 else ""
    lines = lines[:5]
    raise SchemaError(f"{source}: " + "; ".join(lines) + more)


def read_utf8(path: Any, what: str) -> str:
    """The text of ``path``; SchemaError naming the file and the byte for non-UTF-8 bytes."""
    data = open(path, "rb").read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise SchemaError(
            f"{path}: {what} is not UTF-8 text: byte {data[e.start:e.start + 1]!r} at line {line}"
            f" (offset {e.start}); save the file as UTF-8"
        ) from None
