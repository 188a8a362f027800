"""pytest fixtures: the session facade, the target variant, the model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.engine.order import planned_configs, save_configs, save_record
from harness.engine.prestart import start_ahead
from harness.geometry.catalog import Geometry
from harness.lab.lease_files import LeaseDirError
from harness.lab.leases import LeaseUnavailable
from harness.plugin.faults_declared import device_faults
from harness.plugin.options import option_value
from harness.plugin.ordering import file_warnings
from harness.session.build import open_session, session_inventory, session_options
from harness.session.facade import HilSession, Model
from harness.targets import kind
from harness.targets.variants import TargetVariant


def _worker_id(config: pytest.Config) -> str:
    return getattr(config, "workerinput", {}).get("workerid", "main")


@pytest.fixture(scope="session")
def hil(pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> Iterator[HilSession]:
    """The harness session of this pytest process (one per xdist worker)."""

    def opt(name: str) -> Any:
        return option_value(pytestconfig, name)

    # The one way every session is built (harness.session.build): the settings were checked
    # at pytest_configure by the same functions, so nothing is refused here.
    opts = session_options(opt, device_faults=tuple(device_faults(pytestconfig)))
    inventory = session_inventory(opt("--inventory"), opt("--allow-external-faults"))
    session = open_session(opts, inventory, opt, _worker_id(pytestconfig))
    cache_dir = opts.cache_dir
    if not opts.plan_only:  # the fork parents of the engines earlier runs saw these tests start
        start_ahead(planned_configs(cache_dir, [it.nodeid for it in request.session.items],
                                    opts.stack))
    try:
        yield session
    finally:
        try:  # the device ledger records each engine's stop before the statistics carry it
            session.stop_engines()
        finally:
            session.write_stats(_worker_id(pytestconfig), file_warnings(pytestconfig))
            save_record(cache_dir, session.test_configs)
            save_configs(cache_dir, session.configs_seen)
            session.close()


@pytest.fixture(scope="session")
def model(request: pytest.FixtureRequest, hil: HilSession) -> Model:
    """The model under test (parametrized by --model)."""
    try:
        return hil.model(request.param)
    except ValueError as e:
        pytest.fail(str(e), pytrace=False)


def _missing(request: pytest.FixtureRequest, reason: str) -> None:
    if option_value(request.config, "--require-device"):
        pytest.fail(f"device required but missing: {reason}", pytrace=False)
    pytest.skip(reason)


def _ranks(request: pytest.FixtureRequest, variant: TargetVariant, stack: str) -> int:
    """The devices the test's engine holds: its geometry's tensor-parallel ranks where the
    variant's kind runs that many (else 1: the geometry fixture skips, quoting the kind)."""
    callspec = getattr(request.node, "callspec", None)
    g = callspec.params.get("geometry") if callspec is not None else None
    n = getattr(g, "tensor_parallel_size", 1)
    if n > 1 and kind(variant.target).tensor_parallel_problem(variant, n, stack) is None:
        return n
    return 1


@pytest.fixture
def target_variant(request: pytest.FixtureRequest, hil: HilSession) -> TargetVariant:
    """The device variant under test, bound to a leased device where the inventory has one;
    skips (or fails with --require-device) when the device is absent or marked broken."""
    variant: TargetVariant = request.param
    hil.begin_test(request.node.nodeid)
    markers = tuple(m.name for m in request.node.iter_markers())
    stack_problem = hil.stack_problem(variant, markers)
    if stack_problem:
        pytest.skip(stack_problem)
    target_cls = kind(variant.target)
    lacking = target_cls.stack_feature_problem(variant, hil.opts.stack)
    if lacking:
        pytest.skip(lacking)
    stack_missing = target_cls.stack_probe(variant, hil.opts.stack)
    if stack_missing:
        _missing(request, stack_missing)
    if "model" in request.fixturenames:
        unsupported = target_cls.model_probe(request.getfixturevalue("model").path)
        if unsupported:
            pytest.skip(unsupported)
    leases = hil.leases
    if not leases or not leases.leased_devices(variant.target, variant.backend, variant.mode):
        probe = target_cls.availability_probe(variant)
        if probe is not None:
            _missing(request, probe)
        if target_cls.needs_device(variant):  # never unleased: it would open what its env names
            _missing(request, f"{variant.id} runs only on a leased device that serves it, and"
                     " the inventory (HIL_INVENTORY, else discovery) lists none that is free"
                     f" and serves {variant.id}: add one (features/backend) or narrow --target")
        return variant
    assert leases is not None
    device_problem = target_cls.device_stack_problem(variant, hil.opts.stack)
    if device_problem:  # a stack that cannot drive a card is not a broken card: never leased
        _missing(request, device_problem)
    try:
        lease = leases.lease(variant.target, variant.backend, variant.mode,
                             ranks=_ranks(request, variant, hil.opts.stack))
    except LeaseUnavailable as e:
        _missing(request, str(e))
    except LeaseDirError as e:  # a setting to fix, not a missing device: never a skip
        pytest.fail(str(e), pytrace=False)
    assert lease is not None
    request.node.user_properties.append(("device", lease.device.id))
    broken = leases.broken(lease.device)
    if broken:
        _missing(request, broken)
    # The kind's defaults for the device first; the inventory's env for it (in lease.env()) wins.
    cache_dir = Path(option_value(request.config, "--hil-cache-dir"))
    env = {**target_cls.device_env(lease.device, cache_dir), **lease.env()}
    emulated = target_cls.emulated_runtime(variant)
    if emulated and option_value(request.config, "--allow-emulated-card"):
        env.update(target_cls.allow_emulated_env())
        request.node.user_properties.append(("emulated", emulated))
    return variant.on_device(lease.device.id, env)


@pytest.fixture
def geometry(request: pytest.FixtureRequest, hil: HilSession) -> Geometry:
    """The named engine geometry under test (parametrized by --geometry); skips where the
    target variant's kind cannot run in it, quoting the kind's reason."""
    g: Geometry = request.param
    callspec = getattr(request.node, "callspec", None)
    model = callspec.params.get("model") if callspec is not None else None
    if g.models and model is not None and model not in g.models:
        pytest.skip(f"geometry {g.name!r} ({g.source}) is for models {', '.join(g.models)},"
                    f" not {model}")
    if "target_variant" in request.fixturenames:
        variant: TargetVariant = request.getfixturevalue("target_variant")
        problem = kind(variant.target).geometry_problem(variant, g, hil.opts.stack)
        if problem:
            pytest.skip(problem)
    return g
