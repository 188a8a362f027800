"""What runs: the markers, the --target and --model values checked, and tests parametrized
over the selected target variants and models."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.models import MODEL_SPECS
from harness.plugin import stack_variants
from harness.plugin.options import option_value
from harness.scenario.model_folder import ModelFolderError, check_model_folder
from harness.targets import kind, kind_markers
from harness.targets.declarations import CAPABILITIES, unknown_capabilities
from harness.targets.variants import TargetVariant, select_variants

MARKERS = {
    **kind_markers(),  # cpu, spyre, neuron, sb, cb, cp: declared by the kinds (harness/targets/)
    "token_equality": "suite: greedy tokens equal the CPU reference",
    "no_recompute": "suite: no preemption/recompute at full batch",
    "block_freeing": "suite: padding and dummy KV blocks are freed",
    "capacity": "suite: KV block count can serve a full-length request",
    "hil_targets": "hil_targets(spec): limit a test's target variants (same syntax as --target)",
    "hil_needs": "hil_needs(capability, ...): run on the variants that have every one"
                 " (harness/targets/declarations.py CAPABILITIES)",
    "hil_controls": "hil_controls(capability, ...): run as well the opt-in controls that switch"
                    " one off (where --target names them)",
    "hil_lacks": "hil_lacks(capability, ...): run only on the variants that have none of them"
                 " (a test of what the others are held to more strictly elsewhere)",
    "hil_first_model": "run only on the first model of --model (a control whose cost is engine starts)",
    "nightly": "in the nightly selection (hil nightly)",
    "slow": "end to end: starts engines or child pytests (deselect with -m 'not slow')",
    "card_host": "end-to-end on the emulated card host (tools/card-host/run.sh; minutes)",
}


def register_markers(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")


def model_values(config: pytest.Config) -> list[str]:
    return [m.strip() for m in str(option_value(config, "--model")).split(",") if m.strip()]


def check_targets(config: pytest.Config) -> None:
    try:
        select_variants(option_value(config, "--target"))
    except ValueError as e:
        raise pytest.UsageError(f"--target: {e}") from None


def check_models(config: pytest.Config) -> None:
    if not model_values(config):
        raise pytest.UsageError(f"--model {option_value(config, '--model')!r} names no model; pass"
                                f" one of: {', '.join(MODEL_SPECS)}, or a local model folder")
    seen: dict[str, str] = {}
    for m in model_values(config):
        key = m if m in MODEL_SPECS else str(Path(m).resolve())
        if key in seen:  # the same tests twice, under new ids
            twice = "is named twice" if m == seen[key] else f"is the same folder as {seen[key]!r}"
            raise pytest.UsageError(f"--model: {m!r} {twice}; name each model once")
        seen[key] = m
        if m not in MODEL_SPECS and not Path(m).is_dir():
            raise pytest.UsageError(
                f"--model: model folder not found: {m}; pass a local model folder (containing"
                f" config.json) or one of: {', '.join(MODEL_SPECS)}"
            )
        if m not in MODEL_SPECS:
            try:
                check_model_folder(Path(m))
            except ModelFolderError as e:
                raise pytest.UsageError(f"--model: {e}") from None


def _model_id(model: str) -> str:
    return model if model in MODEL_SPECS else Path(model).name


def _start_allowance(metafunc: pytest.Metafunc, variant: TargetVariant) -> list[pytest.MarkDecorator]:
    """A device variant whose engine may take longer to start than the harness's default (a
    card compiles at start) gets its kind's start limit on top of the test's own timeout: no
    test may time out before its engine is allowed to have started."""
    start = kind(variant.target).start_limit(variant.backend)
    declared = metafunc.definition.get_closest_marker("timeout")
    if not start or declared is None:
        return []
    budget = declared.args[0] if declared.args else declared.kwargs.get("timeout")
    return [pytest.mark.timeout(float(budget) + start)] if budget is not None else []


def _capabilities(metafunc: pytest.Metafunc, marker: str) -> frozenset[str]:
    """The capabilities a test's ``marker`` markers name (the module's and its own, together);
    a name that is no capability is a usage error, as a marker's typo is."""
    names = [str(a) for m in metafunc.definition.iter_markers(marker) for a in m.args]
    unknown = unknown_capabilities(names)
    if unknown:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: {marker} names {', '.join(map(repr, unknown))}, no"
            f" capability; known: {', '.join(CAPABILITIES)}")
    return frozenset(names)


def parametrize(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``model`` over --model and ``target_variant`` over --target (each test's
    ``hil_first_model``, ``hil_targets`` and ``hil_needs`` / ``hil_controls`` / ``hil_lacks``
    markers narrowing
    them); the variants the run's stack lacks are left out (``stack_variants.offered``)."""
    config = metafunc.config
    if "model" in metafunc.fixturenames:
        models = model_values(config)
        if metafunc.definition.get_closest_marker("hil_first_model") is not None:
            models = models[:1]
        metafunc.parametrize("model", models, ids=[_model_id(m) for m in models], indirect=True,
                             scope="session")
    if "target_variant" in metafunc.fixturenames:
        variants = select_variants(option_value(config, "--target"))
        limit = metafunc.definition.get_closest_marker("hil_targets")
        if limit is not None:
            allowed = {v.id for v in select_variants(",".join(limit.args))}
            variants = [v for v in variants if v.id in allowed]
        needs, controls = _capabilities(metafunc, "hil_needs"), _capabilities(metafunc, "hil_controls")
        variants = [v for v in variants if v.admitted(needs, controls)]
        lacks = _capabilities(metafunc, "hil_lacks")
        variants = [v for v in variants if not any(v.has(c) for c in lacks)]
        # A variant for some suites only (vllm-cpu-bf16: token equality) runs where the test
        # carries one of their markers.
        variants = [v for v in variants if not v.suites
                    or any(metafunc.definition.get_closest_marker(s) for s in v.suites)]
        variants = stack_variants.offered(metafunc, variants)  # only what --stack's software has
        params = [
            pytest.param(v, id=v.id, marks=[*(getattr(pytest.mark, m) for m in v.markers),
                                             *_start_allowance(metafunc, v)])
            for v in variants
        ]
        metafunc.parametrize("target_variant", params, indirect=True)
