"""Allure test results and a results folder with good and bad files, for the report tests."""

from __future__ import annotations

import json
from pathlib import Path


def allure_result(name: str, status: str, message: str = "", uuid: str = "u1",
                  check: str | None = None) -> dict:
    labels = [{"name": "nodeid", "value": f"suites/t.py::{name}"}]
    if check:
        labels.append({"name": "check", "value": check})
    return {"uuid": uuid, "name": name, "fullName": f"suites.t#{name}", "status": status,
            "historyId": f"h-{name}", "statusDetails": {"message": message},
            "labels": labels,
            "parameters": [{"name": "target_variant", "value": "'vllm-cpu'"},
                           {"name": "model", "value": "'tiny-llama'"}],
            "attachments": [{"name": "token diff", "source": f"{uuid}-a-attachment.html",
                             "type": "text/html"}]}


def results_folder(tmp_path: Path) -> Path:
    d = tmp_path / "allure-results"
    d.mkdir(parents=True)
    good = allure_result("test_ok", "failed", "VerdictFailed: [check token_equality] token mismatch:"
                         " request 'r0'", check="token_equality")
    (d / "u1-result.json").write_text(json.dumps(good))
    (d / "u1-a-attachment.html").write_text("<html></html>")
    (d / "u2-result.json").write_text(json.dumps(good)[:57])  # truncated mid-write
    (d / "u3-result.json").write_text(json.dumps({"total": 3, "passed": 3}))  # foreign JSON
    (d / "notes.txt").write_text("hello")
    return d
