"""Faults are named from the harness's own unless external ones are allowed, also when
HIL_FAULTS reaches the engine process from an inventory."""

import os

import pytest

from harness.in_engine.faults import ALLOW_EXTERNAL_ENV, apply_faults, parse_fault


def test_faults_by_name_only_unless_allowed(monkeypatch):
    with pytest.raises(ValueError, match="pass --allow-external-faults"):
        parse_fault("os.system:command=id")
    fn, kwargs = parse_fault("os.path.join:a=b", allow_external=True)
    assert fn is os.path.join and kwargs == {"a": "b"}
    # In the engine process: HIL_FAULTS from an inventory obeys the same rule.
    monkeypatch.setenv("HIL_FAULTS", "os.getpid")
    monkeypatch.delenv(ALLOW_EXTERNAL_ENV, raising=False)
    with pytest.raises(ValueError, match="pass --allow-external-faults"):
        apply_faults([], {})
