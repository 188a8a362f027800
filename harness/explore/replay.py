"""What a regression test of ``hil explore`` runs: its example on the test's engines, judged as
the search judged it, through the harness plugin's fixtures (``hil``, ``model``,
``target_variant``), so its failure reads and files as a suite test's does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest

from harness.explore.example import ExampleError, example_from_dict
from harness.explore.runner import REJECTED, ExampleRunner
from harness.geometry.catalog import GeometryError

if TYPE_CHECKING:
    from harness.scenario.catalog import Model
    from harness.session.facade import HilSession
    from harness.targets.variants import TargetVariant


def replay_example(hil: HilSession, model: Model, target_variant: TargetVariant,
                   example: Mapping[str, Any], recorded: Mapping[str, Any]) -> None:
    """Run ``example`` (``Example.to_dict``) on ``target_variant`` and expect every verdict
    the search expected; skip on another target variant or model than the one ``recorded``
    (the finding's), and where the target refuses the example now (quoting why). An engine
    that crashes, hangs or fails a call raises its error, as in a suite."""
    __tracebackhide__ = True
    if target_variant.id != recorded["target"]:
        pytest.skip(f"the finding was made on {recorded['target']}, not {target_variant.id}:"
                    f" run it with --target {recorded['target']}")
    if model.label != recorded["model"]:
        pytest.skip(f"the finding was made with model {recorded['model']}, not {model.label}:"
                    f" run it with --model {recorded['model']}")
    try:
        shaped = example_from_dict(example)
    except (ExampleError, GeometryError) as e:
        pytest.fail(f"this regression test's example cannot be read: {e}", pytrace=False)
    outcome = ExampleRunner(hil, model, target_variant, own_tests=False).run(shaped)
    if outcome.status == REJECTED:
        pytest.skip(f"{target_variant.id} refuses the example now: {outcome.reason}")
    if outcome.error is not None and outcome.failure is not None:
        raise outcome.error
    hil.expect(*outcome.judged, trace=outcome.trace)
