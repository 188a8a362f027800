"""What the engines run with, checked before any test: the faults to inject (and whether
outside code may be one; none inherited from the environment), the device root and host Python
they inherit, the stack, the inventory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.in_engine.faults import (
    ALLOW_EXTERNAL_ENV,
    check_fault_rank,
    check_fault_spec,
    env_fault_specs,
)
from harness.plugin import geometries
from harness.plugin.faults_declared import note_run_start, remember_device_faults
from harness.plugin.options import option_value
from harness.session import build
from harness.stacks.host import HOST
from harness.stacks.spec import list_stacks
from harness.targets import all_variants

FAULTS_ENV = "HIL_FAULTS"


def check_faults(config: pytest.Config) -> None:
    """Refuse a ``HIL_FAULTS`` the run inherited, and every ``--inject-fault`` spec that would
    not install as written (``check_fault_spec``): a fault is installed only when the run
    asks for it, and only where it asked."""
    allow_external = bool(option_value(config, "--allow-external-faults"))
    adopt_ambient_faults(config, allow_external)
    note_run_start(config)
    # Engines install the faults and inherit this; only the option may allow outside code.
    if allow_external:
        os.environ[ALLOW_EXTERNAL_ENV] = "1"
    else:
        os.environ.pop(ALLOW_EXTERNAL_ENV, None)
    variants = list(all_variants())
    stacks = [*list_stacks(), HOST]
    # The ranks per engine of this run: its geometries' (check_geometries has read them).
    sizes = [g.tensor_parallel_size for g in geometries.selected(config)]
    for spec in option_value(config, "--inject-fault"):
        try:
            check_fault_spec(spec, variants, stacks, allow_external=allow_external)
            check_fault_rank(spec, sizes)
        except (ValueError, ImportError, AttributeError) as e:
            raise pytest.UsageError(f"--inject-fault: {e}") from None


def check_no_ambient_faults(allowed_by: str = "") -> None:
    """Refuse a ``HIL_FAULTS`` in this run's environment: every engine would install it while
    no report names it, so its failures would read as the stack's own bugs. The run's faults
    come from ``--inject-fault`` and an inventory device's ``env.HIL_FAULTS`` (which reaches
    only that device's engines); ``hil selftest`` and ``hil triage`` pass theirs as options.
    ``allowed_by``: the option of this command that declares them instead (named as a fix)."""
    value = os.environ.get(FAULTS_ENV, "")
    if not value.strip():
        return
    options = " ".join(f"--inject-fault '{s}'" for s in env_fault_specs(value))
    also = f", or add {allowed_by} to declare it for this run" if allowed_by else ""
    raise pytest.UsageError(
        f"env {FAULTS_ENV}={value!r}: a fault from the environment would be installed in every"
        f" engine of this run and named in no report; pass it as {options or '--inject-fault'}"
        f"{also}, or unset {FAULTS_ENV}")


def adopt_ambient_faults(config: pytest.Config, allowed: bool) -> None:
    """An inherited ``HIL_FAULTS``: refused, or with ``--allow-external-faults`` declared as
    this run's ``--inject-fault`` specs (checked, named in the header, summary, Allure and
    every failure as those are) and taken out of the environment, so that no engine installs
    it a second time, unnamed."""
    if not allowed:
        check_no_ambient_faults("--allow-external-faults")
        return
    specs = env_fault_specs(os.environ.pop(FAULTS_ENV, ""))
    if specs:
        config.option.inject_fault = [*(config.option.inject_fault or []), *specs]


def export_engine_env(config: pytest.Config) -> None:
    """Engines and discovery read these from the environment (children inherit them)."""
    if option_value(config, "--device-root"):
        os.environ["HIL_DEVICE_ROOT"] = str(Path(option_value(config, "--device-root")).resolve())
    if option_value(config, "--python"):
        os.environ["HIL_HOST_PYTHON"] = option_value(config, "--python")


def check_stack(config: pytest.Config) -> None:
    """A named stack must exist and, when it has a venv of its own, be installed as pinned: a
    run on a missing stack would skip every test and pass for the wrong reason."""
    try:
        build.check_stack(option_value(config, "--stack"))
    except build.BadSetting as e:
        raise pytest.UsageError(str(e)) from None


def check_inventory(config: pytest.Config) -> None:
    """Load --inventory once (below the exported device root), to refuse a bad one at once."""
    inv = option_value(config, "--inventory")
    if not inv:
        return
    try:
        inventory = build.session_inventory(inv, bool(option_value(config,
                                                                   "--allow-external-faults")))
    except build.BadSetting as e:
        raise pytest.UsageError(str(e)) from None
    remember_device_faults(config, inventory)
