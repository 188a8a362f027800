"""What the engines run with, checked before any test: the faults to inject (and whether
outside code may be one), the device root and host Python they inherit, the stack, the
inventory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.core.devices import device_root
from harness.in_engine.faults import ALLOW_EXTERNAL_ENV, parse_fault
from harness.lab.inventory import load_inventory
from harness.plugin.options import option_value
from harness.stacks.host import HOST, is_unpinned
from harness.stacks.spec import StackError, load_stack, stack_python


def check_faults(config: pytest.Config) -> None:
    allow_external = bool(option_value(config, "--allow-external-faults"))
    # Engines install the faults and inherit this; only the option may allow outside code.
    if allow_external:
        os.environ[ALLOW_EXTERNAL_ENV] = "1"
    else:
        os.environ.pop(ALLOW_EXTERNAL_ENV, None)
    for spec in option_value(config, "--inject-fault"):
        try:
            parse_fault(spec, allow_external=allow_external)
        except (ValueError, ImportError, AttributeError) as e:
            raise pytest.UsageError(f"--inject-fault: {e}") from None


def export_engine_env(config: pytest.Config) -> None:
    """Engines and discovery read these from the environment (children inherit them)."""
    if option_value(config, "--device-root"):
        os.environ["HIL_DEVICE_ROOT"] = str(Path(option_value(config, "--device-root")).resolve())
    if option_value(config, "--python"):
        os.environ["HIL_HOST_PYTHON"] = option_value(config, "--python")


def check_stack(config: pytest.Config) -> None:
    """A named stack must exist and, when it has a venv of its own, be installed as pinned: a
    run on a missing stack would skip every test and pass for the wrong reason."""
    name = option_value(config, "--stack")
    if name == HOST:
        return
    try:
        load_stack(name)
    except StackError as e:
        raise pytest.UsageError(f"--stack: {e}") from None
    if not is_unpinned(name) and stack_python(name) is None:
        raise pytest.UsageError(f"--stack {name}: not installed, or its pins changed since it was"
                                f" installed: run ./setup.sh --stack {name}")


def check_inventory(config: pytest.Config) -> None:
    """Load --inventory once (below the exported device root), to refuse a bad one at once."""
    inv = option_value(config, "--inventory")
    if not inv:
        return
    try:
        load_inventory(Path(inv), device_root(),
                       allow_external_faults=bool(option_value(config, "--allow-external-faults")))
    except ValueError as e:  # InventoryError among them
        raise pytest.UsageError(str(e)) from None
