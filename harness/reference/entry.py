"""The shape a cached reference output must have before it is trusted.

A cache entry is a ``RequestTrace.to_dict()`` of one greedy reference run: as many
steps as ``max_tokens`` asked for, each with its token, log-probability and top-k.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator

_NUMBER = {"type": "number"}
REFERENCE_VALUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["request_id", "prompt_token_ids", "steps"],
    "properties": {
        "prompt_token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "steps": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["token_id", "logprob", "top_logprobs"],
                "properties": {
                    "token_id": {"type": "integer", "minimum": 0},
                    "logprob": _NUMBER,
                    "top_logprobs": {
                        "type": "object",
                        "propertyNames": {"pattern": "^[0-9]+$"},
                        "additionalProperties": _NUMBER,
                        "minProperties": 1,
                    },
                },
            },
        },
    },
}
_VALIDATOR = Draft202012Validator(REFERENCE_VALUE_SCHEMA)


def reference_entry_problem(value: Any, prompt_token_ids: list[int], max_tokens: int) -> str | None:
    """Why ``value`` is not the reference output of this prompt and length, or None."""
    err = next(iter(_VALIDATOR.iter_errors(value)), None)
    if err is not None:
        where = "/".join(map(str, err.absolute_path)) or "the entry"
        return f"wrong shape at {where}: {err.message}"
    if list(value["prompt_token_ids"]) != list(prompt_token_ids):
        return "its prompt is not the one asked for"
    if len(value["steps"]) != max_tokens:
        return f"{len(value['steps'])} steps stored, {max_tokens} asked for"
    return None
