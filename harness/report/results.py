"""Reading an allure-results folder defensively: every readable test result is kept, every
unreadable file is named with the reason, and nothing in the folder is changed."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("passed", "failed", "broken", "skipped", "unknown")
CONFIG_FILES = ("categories.json", "environment.properties", "executor.json")


@dataclass
class ResultsFolder:
    """What an allure-results folder holds, sorted into usable and rejected files."""

    path: Path
    results: dict[Path, dict[str, Any]] = field(default_factory=dict)
    containers: dict[Path, dict[str, Any]] = field(default_factory=dict)
    attachments: list[Path] = field(default_factory=list)
    config: dict[str, Path] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def tests(self) -> list[dict[str, Any]]:
        return list(self.results.values())


def _load_json(path: Path) -> tuple[Any, str | None]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return None, f"unreadable ({e.__class__.__name__}: {e})"
    if not text.strip():
        return None, "empty file"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, (f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno};"
                      f" {len(text)} bytes, truncated?)")


_TEXT_FIELDS = ("historyId", "testCaseId", "fullName", "description", "descriptionHtml")
_LIST_FIELDS = ("labels", "parameters", "links", "steps", "attachments")


def _shape_problem(node: dict[str, Any], where: str = "") -> str | None:
    """The first field of a result (or step) whose type is not Allure's, or None."""
    status = node.get("status")
    if status is not None and status not in STATUSES:
        return f"{where}status {status!r} (expected one of {', '.join(STATUSES)})"
    for key in ("start", "stop"):
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"{where}{key} {value!r} is not a number of milliseconds"
    for key in _TEXT_FIELDS:
        if node.get(key) is not None and not isinstance(node[key], str):
            return f"{where}{key} {node[key]!r} is not a string"
    details = node.get("statusDetails")
    if details is not None and not isinstance(details, dict):
        return f"{where}statusDetails is a JSON {type(details).__name__}, not an object"
    for key in _LIST_FIELDS:
        items = node.get(key)
        if items is None:
            continue
        if not isinstance(items, list):
            return f"{where}{key} is a JSON {type(items).__name__}, not a list"
        if not all(isinstance(i, dict) for i in items):
            return f"{where}{key} holds an item that is not an object"
    for i, step in enumerate(node.get("steps") or []):
        problem = _shape_problem(step, f"{where}steps[{i}].")
        if problem:
            return problem
    return None


def _result_problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return f"not an Allure test result (a JSON {type(data).__name__}, not an object)"
    missing = [k for k in ("uuid", "name") if not isinstance(data.get(k), str)]
    if missing:
        return f"not an Allure test result (no {' or '.join(missing)})"
    problem = _shape_problem(data)
    return f"not an Allure test result ({problem})" if problem else None


def _container_problem(data: Any) -> str | None:
    if not isinstance(data, dict) or not isinstance(data.get("uuid"), str):
        return "not an Allure result container (no uuid)"
    if not isinstance(data.get("children", []), list):
        return "not an Allure result container (children is not a list)"
    for key in ("befores", "afters"):
        items = data.get(key)
        if items is not None and (not isinstance(items, list)
                                  or not all(isinstance(i, dict) for i in items)):
            return f"not an Allure result container ({key} is not a list of objects)"
        for i, fixture in enumerate(items or []):
            problem = _shape_problem(fixture, f"{key}[{i}].")
            if problem:
                return f"not an Allure result container ({problem})"
    return None


def load_results(folder: Path) -> ResultsFolder:
    """Sort the files of ``folder``; a missing folder gives an empty result with a problem."""
    folder = Path(folder)
    out = ResultsFolder(path=folder)
    if not folder.is_dir():
        out.problems.append(f"{folder}: no such results folder (run `hil run` first)")
        return out
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        name = path.name
        if name in CONFIG_FILES:
            out.config[name] = path
        elif name.endswith("-result.json"):
            data, err = _load_json(path)
            err = err or _result_problem(data)
            if err:
                out.problems.append(f"{path}: skipped: {err}")
            else:
                out.results[path] = data
        elif name.endswith("-container.json"):
            data, err = _load_json(path)
            err = err or _container_problem(data)
            if err:
                out.problems.append(f"{path}: skipped: {err}")
            else:
                out.containers[path] = data
        elif "-attachment" in name:
            out.attachments.append(path)
        elif name.endswith(".json"):
            out.problems.append(f"{path}: skipped: not an Allure results file name"
                                " (expected *-result.json, *-container.json or *-attachment.*)")
        else:
            out.problems.append(f"{path}: skipped: not an Allure results file")
    present = {p.name for p in out.attachments}
    for path, data in out.results.items():
        for source in _attachment_sources(data):
            if source not in present:
                out.problems.append(f"{path}: test {data.get('name')!r} refers to a missing"
                                    f" attachment {source}")
    if not out.results:
        out.problems.append(f"{folder}: no test results (no readable *-result.json); the report"
                            " will show no tests")
    return out


def _attachment_sources(node: dict[str, Any]) -> list[str]:
    found = [a.get("source") for a in node.get("attachments", []) or [] if isinstance(a, dict)]
    for step in node.get("steps", []) or []:
        if isinstance(step, dict):
            found += _attachment_sources(step)
    return [s for s in found if isinstance(s, str)]


def labels_of(result: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for label in result.get("labels", []) or []:
        if isinstance(label, dict) and "name" in label:
            out.setdefault(str(label["name"]), []).append(str(label.get("value", "")))
    return out


def params_of(result: dict[str, Any]) -> dict[str, str]:
    out = {}
    for p in result.get("parameters", []) or []:
        if isinstance(p, dict) and "name" in p:
            value = str(p.get("value", ""))
            if len(value) >= 2 and value[0] == value[-1] == "'":
                value = value[1:-1]
            out[str(p["name"])] = value
    return out


def message_of(result: dict[str, Any]) -> str:
    details = result.get("statusDetails") or {}
    return str(details.get("message") or "") if isinstance(details, dict) else ""
