"""What a test is, for the report: suite, scenario, target, model, batch shape, device.

Everything here is derived from the test's own identity (module, function,
pytest callspec) and from what the session saw it run (scenario, engine
configuration, trace), never from suite code, so suites stay free of report
plumbing. Parameters that follow from the callspec are marked ``excluded`` so
that they never change a test's Allure history id: a test keeps its history
whether it ran, was skipped before its scenario was built, or ran on another card.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from harness.targets import device_env_vars

# Engine variables that name the physical device an engine was given, as the device kinds
# declare them (DeviceKind.device_env_vars).
DEVICE_ENV_VARS = device_env_vars()


def suite_name(module: str) -> str:
    """``suites/test_token_equality.py`` or ``test_token_equality`` -> ``token equality``."""
    base = module.rsplit("/", 1)[-1].removesuffix(".py").rsplit(".", 1)[-1]
    return base.removeprefix("test_").replace("_", " ")


def humanize(function: str) -> str:
    """``test_blocks_return_to_the_pool`` -> ``blocks return to the pool``."""
    return function.removeprefix("test_").replace("_", " ")


@dataclass(frozen=True)
class ReportParam:
    name: str
    value: str
    excluded: bool = True


def _variant_fields(variant: Any) -> dict[str, str]:
    if variant is None:
        return {}
    return {
        "target": str(getattr(variant, "target", variant)),
        "mode": str(getattr(variant, "mode", None) or "-"),
        "backend": str(getattr(variant, "backend", None) or "-"),
    }


def _shape(params: dict[str, Any]) -> str:
    skip = {"target_variant", "model", "geometry"}
    return ", ".join(f"{k}={v}" for k, v in params.items() if k not in skip)


def static_labels(module: str, function: str, params: dict[str, Any]) -> list[tuple[str, str]]:
    """Allure labels known before the test runs: epic = suite, feature = test,
    story = scenario (the case or scenario parameter, else the parameter shape);
    parentSuite/suite/subSuite = suite / target variant / model; tags."""
    suite = suite_name(module)
    feature = humanize(function)
    story = str(params.get("case") or params.get("name") or _shape(params) or feature)
    variant = params.get("target_variant")
    variant_id = str(getattr(variant, "id", variant)) if variant is not None else "no target"
    model = str(params.get("model", "no model"))
    labels = [
        ("epic", suite),
        ("feature", feature),
        ("story", story),
        ("parentSuite", suite),
        ("suite", variant_id),
        ("subSuite", model),
    ]
    if variant is not None:
        labels.append(("tag", variant_id))
    if "model" in params:
        labels.append(("tag", model))
    return labels


def static_params(params: dict[str, Any]) -> list[ReportParam]:
    """Display parameters from the callspec. ``target_variant`` is shown by its id;
    target, mode and backend are spelled out (excluded: they follow from it)."""
    out: list[ReportParam] = []
    variant = params.get("target_variant")
    if variant is not None:
        # Same name as the callspec parameter: only its shown value changes, and the
        # history id is computed from the original object, so it is unchanged.
        out.append(ReportParam("target_variant", str(getattr(variant, "id", variant)), False))
        out += [ReportParam(k, v) for k, v in _variant_fields(variant).items()]
    geometry = params.get("geometry")
    if geometry is not None:  # shown by its name, its values beside it
        out.append(ReportParam("geometry", str(getattr(geometry, "name", geometry)), False))
        describe = getattr(geometry, "describe", None)
        if describe is not None:
            out.append(ReportParam("geometry values", describe().split(": ", 1)[-1]))
    return out


def scenario_params(scenario: Any, config: Any = None) -> list[ReportParam]:
    """Parameters from the scenario the session ran: batch size, prompt set, max_num_seqs."""
    tags = dict(getattr(scenario, "tags", {}) or {})
    requests = list(getattr(scenario, "requests", []) or [])
    limits = getattr(scenario, "limits", None)
    max_num_seqs = getattr(config, "max_num_seqs", None) or getattr(limits, "max_num_seqs", None)
    prompt_set = tags.get("prompt_set") or f"shaped: {getattr(scenario, 'name', '?')}"
    out = [
        ReportParam("scenario", str(getattr(scenario, "name", "?"))),
        ReportParam("batch size", str(len(requests))),
        ReportParam("prompt set", str(prompt_set)),
    ]
    if max_num_seqs is not None:
        out.append(ReportParam("max_num_seqs", str(max_num_seqs)))
    # the engine's context: on a card, the one it compiles for the test's (256 runs at 512)
    max_model_len = getattr(config, "max_model_len", None) or getattr(limits, "max_model_len", None)
    if max_model_len is not None:
        out.append(ReportParam("max_model_len", str(max_model_len)))
    return out


def device_instance(
    variant: Any, info: dict[str, Any] | None = None, config: Any = None,
    env: dict[str, str] | None = None,
) -> str:
    """The physical device that ran the test, as precisely as known.

    In order: what the engine reported (``info["device_instance"]``), a device
    variable in the engine configuration (``DEVICE_ENV_VARS``), ``HIL_DEVICE_INSTANCE``;
    for runs on the CPU, ``cpu@<host>``; else ``unknown``.
    """
    info = info or {}
    env = os.environ if env is None else env
    if info.get("device_instance"):
        return str(info["device_instance"])
    extra = dict(getattr(config, "extra_env", ()) or ())
    for var in DEVICE_ENV_VARS:
        if extra.get(var):
            return f"{var}={extra[var]}"
    if env.get("HIL_DEVICE_INSTANCE"):
        return env["HIL_DEVICE_INSTANCE"]
    markers = tuple(getattr(variant, "markers", ()) or ())
    if "cpu" in markers or getattr(variant, "target", None) == "vllm-cpu":
        return f"cpu@{socket.gethostname()}"
    return "unknown"
