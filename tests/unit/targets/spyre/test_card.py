"""Card policy: environment, verification, one engine per card, ordering, tolerance (no engines)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.core.comparison import NearTiePolicy
from harness.core.config import EngineConfig
from harness.core.devices import InventoryDevice
from harness.core.errors import EngineRefused, EngineStartDefect, EngineStartError
from harness.core.paths import REPO_ROOT
from harness.engine.device_ledger import (
    DeviceLedger,
    append_device_summary,
    ledger_problems,
    ledger_summary_lines,
)
from harness.engine.order import order_tests_by_engine_config, save_record
from harness.engine.pool import start_timeout
from harness.lab.inventory import device_group
from harness.lab.leases import Lease
from harness.session.facade import HilSession, SessionOptions
from harness.targets import kind_of_label, target_for
from harness.targets.spyre import card

ROOT = REPO_ROOT
ADDR, OTHER = "0000:3b:00.0", "0000:3c:00.0"


def card_device(**kw: object) -> InventoryDevice:
    base: dict = dict(id="card0", kind="spyre", backend="sendnn", address=ADDR)
    base.update(kw)
    return InventoryDevice(**base)


def card_cfg(env: dict[str, str] | None = None, device: str = "card0") -> EngineConfig:
    env = env if env is not None else card.card_env(card_device(), Path("/cache"))
    return EngineConfig(target="spyre", model="/m", max_model_len=256, max_num_seqs=2, mode="cb",
                        backend="sendnn", device=device, stack="spyre-1.10", extra_env=tuple(sorted(env.items())))


def good_info() -> dict:
    return {"platform": "SpyrePlatform",
            "card": {"dynamo_backend": "sendnn", "env": {"FLEX_COMPUTE": "SENTIENT"}}}


def test_card_env_defaults_and_the_inventory_wins() -> None:
    env = card.card_env(card_device(), Path("/c"))
    assert env["FLEX_COMPUTE"] == "SENTIENT" and env["FLEX_DEVICE"] == "VFIO"
    assert env["AIU_WORLD_SIZE"] == "1" and env["AIU_WORLD_RANK_0"] == ADDR
    assert env["TORCH_SENDNN_CACHE_ENABLE"] == "1"
    assert env["TORCH_SENDNN_CACHE_DIR"] == "/c/sendnn/card0"
    assert env["DTLOG_LEVEL"] == "INFO"
    assert card.card_env(card_device(backend="eager"), Path("/c")) == {}
    assert card.card_env(InventoryDevice(id="n0", kind="neuron"), Path("/c")) == {}


def test_verification_passes_on_the_leased_card() -> None:
    log = f"x\n[DT INFO] Opened: SEN:VFIO:{ADDR} (iommu group 40)\n"
    assert card.verify_card_engine(card_cfg(), good_info(), log) is None


@pytest.mark.parametrize("log, info_change, wrong", [
    (f"Opened: SEN:VFIO:{OTHER}\n", {}, "opened"),
    ("Opened: SENULATOR (FLEX_COMPUTE=unset)\n", {"FLEX_COMPUTE": "SENULATOR"}, "FLEX_COMPUTE"),
    ("nothing opened\n", {}, "opened"),
    (f"Opened: SEN:VFIO:{ADDR}\n", {"platform": "CpuPlatform"}, "platform"),
    (f"Opened: SEN:VFIO:{ADDR}\n", {"dynamo_backend": "eager"}, "dynamo backend"),
])
def test_verification_fails_with_expected_and_seen(log: str, info_change: dict, wrong: str) -> None:
    info = good_info()
    if "platform" in info_change:
        info["platform"] = info_change["platform"]
    if "dynamo_backend" in info_change:
        info["card"]["dynamo_backend"] = info_change["dynamo_backend"]
    if "FLEX_COMPUTE" in info_change:
        info["card"]["env"]["FLEX_COMPUTE"] = info_change["FLEX_COMPUTE"]
    problem = card.verify_card_engine(card_cfg(), info, log)
    assert problem is not None
    assert f"wrong {wrong}" in problem.splitlines()[0] or wrong in problem.splitlines()[0]
    assert f"opened: expected SEN:VFIO:{ADDR}, seen" in problem


def test_cpu_engines_are_not_card_engines() -> None:
    cfg = EngineConfig(target="spyre", model="/m", max_model_len=256, max_num_seqs=2, mode="cb",
                       stack="spyre-1.10",
                       backend="eager")
    assert not target_for(cfg).holds_device() and target_for(card_cfg()).holds_device()
    assert not target_for(cfg.with_(device="card0")).holds_device()  # an eager stand-in
    runs_plugin = {"platform_module": "vllm_spyre.platform", "platform": "SpyrePlatform"}
    assert target_for(cfg).verify_device(runs_plugin, "") is None  # no card check on the CPU
    fell_back = {"platform_module": "vllm.platforms.cpu", "platform": "CpuPlatform"}
    assert "fell back" in (target_for(cfg).verify_device(fell_back, "") or "")
    assert start_timeout(target_for(cfg), None) == 600.0
    assert start_timeout(target_for(card_cfg()), None) == 1200.0
    assert start_timeout(target_for(card_cfg()), 42.0) == 42.0


def test_ledger_finds_two_live_engines_and_restarts() -> None:
    ledger = DeviceLedger()
    a = card_cfg()
    b = a.with_(max_num_seqs=4)
    ledger.started(a)
    ledger.started(b)  # a still live: a violation
    ledger.closed(a.key)
    ledger.closed(b.key)
    ledger.started(a)  # a second start of a: a violation
    problems = ledger_problems(ledger.to_list())
    assert any("still live" in p for p in problems)
    assert any(f"configuration {a.key} started 2 times" in p for p in problems)
    clean = DeviceLedger()
    clean.started(a)
    clean.closed(a.key)
    clean.started(b)
    assert ledger_problems(clean.to_list()) == []
    assert "card card0: 2 configuration(s)" in ledger_summary_lines(clean.to_list())[0]


def test_near_tie_tolerance_per_backend_states_dtypes() -> None:
    base = NearTiePolicy(top_k=5, prob_tol=0.05)
    sendnn = kind_of_label("spyre-sendnn-cb").near_tie_policy(base, "spyre-sendnn-cb", {})
    assert sendnn.prob_tol == card.NEAR_TIE_TOL_SENDNN and "reference fp32" in sendnn.describe()
    assert "device fp16" in sendnn.describe()
    wider = kind_of_label("x:spyre-sendnn-cb").near_tie_policy(base, "x:spyre-sendnn-cb",
                                                               {"sendnn": 0.2})
    assert wider.prob_tol == 0.2
    eager = kind_of_label("spyre-eager-cb").near_tie_policy(base, "spyre-eager-cb", {"sendnn": 0.2})
    assert eager.prob_tol == 0.05 and "device fp32" in eager.describe()
    for label in ("vllm-cpu", "neuron", "no-such-kind"):
        other = kind_of_label(label).near_tie_policy(base, label, {"sendnn": 0.2})
        assert other.prob_tol == 0.05 and "device the model's dtype (fp32)" in other.describe()
    for label, dtype in (("vllm-cpu-bf16", "bf16"),):
        other = kind_of_label(label).near_tie_policy(base, label, {"sendnn": 0.2})
        assert other.prob_tol == 0.05 and f"device {dtype}" in other.describe()


@dataclass
class Item:
    nodeid: str
    group: int


def test_tests_are_ordered_by_recorded_configuration(tmp_path: Path) -> None:
    items = [Item("t1[x]", 0), Item("t2[y]", 0), Item("t3[x]", 0), Item("t4", 0)]
    order_tests_by_engine_config(items, tmp_path, lambda i: i.group)
    assert [i.nodeid for i in items] == ["t1[x]", "t2[y]", "t3[x]", "t4"]  # no record: unchanged
    save_record(tmp_path, {"t1[x]": "cfg-a", "t2[y]": "cfg-b", "t3[x]": "cfg-a"})
    order_tests_by_engine_config(items, tmp_path, lambda i: i.group)
    assert [i.nodeid for i in items] == ["t1[x]", "t3[x]", "t2[y]", "t4"]


class RefusingPool:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def get(self, cfg: EngineConfig) -> None:
        raise self.error

    def release(self, cfg: EngineConfig) -> None:
        pass


def _session(tmp_path: Path, error: Exception) -> tuple[HilSession, list[str]]:
    s = HilSession(SessionOptions(cache_dir=tmp_path, reports_dir=tmp_path))
    s.engines.pool = RefusingPool(error)  # type: ignore[assignment]
    marked: list[str] = []
    s._mark_device_broken = lambda cfg, e: marked.append(str(e))  # type: ignore[method-assign]
    return s, marked


def test_expected_refusal_does_not_mark_the_card_broken(tmp_path: Path) -> None:
    s, marked = _session(tmp_path, EngineRefused("engine refused: Number of pages"))
    with s.expect_refusal(), pytest.raises(EngineStartError):
        s.engines._call(card_cfg(), "generate", {})
    assert marked == []
    with pytest.raises(EngineStartError):  # not expected: the card is marked
        s.engines._call(card_cfg(), "generate", {})
    assert len(marked) == 1


def test_a_programming_error_at_start_is_no_refusal(tmp_path: Path) -> None:
    # A configurator's TypeError is a defect of the stack: the block lets it out as a defect,
    # which a test expecting a refusal (pytest.raises(EngineRefused)) does not take.
    s, _ = _session(tmp_path, EngineRefused("engine refused: TypeError: bad operand", "tail",
                                            error_type="TypeError"))
    with pytest.raises(EngineStartDefect, match="a TypeError at start is a defect of the stack"):
        with s.expect_refusal():
            s.engines._call(card_cfg(), "generate", {})
    s, _ = _session(tmp_path, EngineRefused("engine refused: Number of pages", "",
                                            error_type="ValueError"))
    with pytest.raises(EngineRefused):
        with s.expect_refusal():
            s.engines._call(card_cfg(), "generate", {})


def test_crash_at_start_marks_the_card_broken_even_when_a_refusal_is_expected(tmp_path: Path) -> None:
    s, marked = _session(tmp_path, EngineStartError("engine died with exit code -9 while starting"))
    with s.expect_refusal(), pytest.raises(EngineStartError):
        s.engines._call(card_cfg(), "generate", {})
    assert len(marked) == 1


@pytest.fixture
def torch_sendnn_emulated(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.syspath_prepend(str(ROOT / "emulation" / "torch_sendnn"))
    for name in [m for m in sys.modules if m.startswith("torch_sendnn")]:
        monkeypatch.delitem(sys.modules, name)
    import torch_sendnn.device as device

    yield device
    for name in [m for m in sys.modules if m.startswith("torch_sendnn")]:
        del sys.modules[name]  # the emulation must not look installed to later tests


def _fake_tree(root: Path) -> None:
    sys.path.insert(0, str(ROOT / "tools" / "card-host"))
    try:
        import fake_device_tree
    finally:
        sys.path.pop(0)
    fake_device_tree.write_tree(root, 2)


def test_emulated_runtime_opens_the_card_it_is_told(tmp_path: Path, torch_sendnn_emulated,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    _fake_tree(tmp_path)
    monkeypatch.setenv("SENDNN_EMULATION_ROOT", str(tmp_path))
    monkeypatch.setenv("DTLOG_LEVEL", "INFO")
    monkeypatch.setenv("FLEX_COMPUTE", "SENTIENT")
    monkeypatch.setenv("FLEX_DEVICE", "VFIO")
    monkeypatch.setenv("AIU_WORLD_RANK_0", OTHER)
    assert torch_sendnn_emulated.open_device() == f"SEN:VFIO:{OTHER}"
    assert card.opened_devices(capsys.readouterr().err) == [f"SEN:VFIO:{OTHER}"]
    monkeypatch.setenv("AIU_WORLD_RANK_0", "0000:99:00.0")
    with pytest.raises(torch_sendnn_emulated.DeviceOpenError, match="no PCI device 0000:99:00.0"):
        torch_sendnn_emulated.open_device()
    monkeypatch.delenv("FLEX_COMPUTE")
    assert torch_sendnn_emulated.open_device() == "SENULATOR"


def test_discovery_reads_the_device_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.core.devices import device_root
    from harness.lab.inventory import discover_inventory
    from harness.targets.spyre.discovery import discover_spyre

    _fake_tree(tmp_path)
    monkeypatch.setenv("HIL_DEVICE_ROOT", str(tmp_path))
    assert [d.id for d in discover_spyre(device_root()).usable] == [ADDR, OTHER]
    inv = discover_inventory(device_root())
    assert [d.address for d in inv.devices if d.kind == "spyre"] == [ADDR, OTHER]


def test_missing_torch_sendnn_is_a_stack_problem_not_a_broken_card(tmp_path: Path) -> None:
    if card.torch_sendnn_status()[1] is None:
        pytest.skip("torch_sendnn is importable here")
    from tests.suite_runner import run_suite

    sys.path.insert(0, str(ROOT / "tools" / "card-host"))
    try:
        import fake_device_tree
    finally:
        sys.path.pop(0)
    addresses = fake_device_tree.write_tree(tmp_path / "root", 1)
    inv = tmp_path / "inv.toml"
    inv.write_text(fake_device_tree.inventory_text(addresses))
    run = run_suite(tmp_path, "suites/test_token_equality.py", "-m", "spyre", "--model", "tiny-llama",
                    "-k", "single and not one-token and cp", "--inventory", str(inv),
                    "--device-root", str(tmp_path / "root"), "--require-device")
    assert run.returncode == 1, run.output[-2000:]
    (message,) = run.messages.values()
    assert "stack default: torch_sendnn is not importable in this Python: a stack problem" in message
    assert not list((tmp_path / "reports" / "devices").glob("*.broken.json"))


def test_summary_gets_a_cards_section(tmp_path: Path) -> None:
    import json

    ledger = DeviceLedger()
    ledger.started(card_cfg())
    (tmp_path / "stats").mkdir()
    (tmp_path / "stats" / "gw0.json").write_text(json.dumps({"cards": ledger.to_list()}))
    (tmp_path / "summary.md").write_text("# run\n")
    section = append_device_summary(tmp_path / "stats", tmp_path / "summary.md")
    assert "card card0: 1 configuration(s): spyre-1.10:spyre-sendnn-cb" in section
    assert "## Cards" in (tmp_path / "summary.md").read_text()
    assert append_device_summary(tmp_path / "none", tmp_path / "summary.md") == ""


def test_inherited_card_variables_are_listed_with_what_they_do() -> None:
    from harness.report.run_config import inherited_env_properties
    from harness.targets.spyre.card import inherited_card_env

    environ = {"VLLM_DT_MAX_BATCH_TKV_LIMIT": "8192", "SENDNN_INFERENCE_DYNAMO_BACKEND": "eager",
               "FLEX_DEVICE": "PF", "HOME": "/root", "VLLM_SPYRE_USE_CB": "1"}
    found = {n: (v, what) for n, v, what in inherited_card_env(environ)}
    assert set(found) == {"VLLM_DT_MAX_BATCH_TKV_LIMIT", "SENDNN_INFERENCE_DYNAMO_BACKEND",
                          "FLEX_DEVICE", "VLLM_SPYRE_USE_CB"}
    assert found["VLLM_DT_MAX_BATCH_TKV_LIMIT"][1].startswith("changes every Spyre engine")
    assert found["SENDNN_INFERENCE_DYNAMO_BACKEND"][1].startswith("ignored: the harness sets it")
    assert found["FLEX_DEVICE"][1].startswith("ignored")
    props = inherited_env_properties(environ)
    assert props["env.VLLM_DT_MAX_BATCH_TKV_LIMIT"].startswith("8192 (changes every Spyre engine")


def test_a_card_engine_without_a_lease_is_refused() -> None:
    problem = card.verify_card_engine(card_cfg(device=""), good_info(), f"Opened: SEN:VFIO:{ADDR}\n")
    assert problem is not None and "with no leased card" in problem


def test_the_emulated_runtime_fails_unless_the_run_allows_it() -> None:
    info = good_info()
    info["card"].update(torch_sendnn="1.0.0", torch_sendnn_emulated=True)
    log = f"Opened: SEN:VFIO:{ADDR} (iommu group 40)\n"
    problem = card.verify_card_engine(card_cfg(), info, log)
    assert problem is not None and "wrong runtime" in problem.splitlines()[0]
    assert "--allow-emulated-card" in problem
    env = {**card.card_env(card_device(), Path("/c")), card.ALLOW_EMULATED_ENV: "1"}
    assert card.verify_card_engine(card_cfg(env), info, log) is None


def test_flex_device_from_the_inventory_is_what_the_verification_expects() -> None:
    info = good_info()
    info["card"]["env"]["FLEX_DEVICE"] = "PF"
    assert card.verify_card_engine(card_cfg(), info, f"Opened: SEN:PF:{ADDR}\n") is None
    problem = card.verify_card_engine(card_cfg(), info, f"Opened: SEN:VFIO:{ADDR}\n")
    assert problem is not None and f"expected SEN:PF:{ADDR}" in problem


def test_a_card_start_creates_its_compile_cache(tmp_path) -> None:
    env = card.card_env(card_device(), tmp_path)
    card.prepare_card_start(env)
    assert Path(env["TORCH_SENDNN_CACHE_DIR"]).is_dir()


# ------------------------------------------------------------------ card groups (tensor parallel)

QUAD = ("0000:3b:00.0", "0000:3c:00.0", "0000:3d:00.0", "0000:3e:00.0")


def quad() -> InventoryDevice:
    """A group of four cards as the inventory forms it (each member's env names its card)."""
    return device_group("quad0", [card_device(id=f"card{i}", address=a, env=(("AIU_WORLD_RANK_0", a),))
                                  for i, a in enumerate(QUAD)])


def quad_cfg() -> EngineConfig:
    """Its engine's configuration, its env as the fixture builds it (card_env, then the lease's)."""
    env = {**card.card_env(quad(), Path("/c")), **Lease(quad(), "gw0", True).env()}
    return card_cfg(env, device="quad0").with_(tensor_parallel_size=4)


def quad_info() -> dict:
    """What a good group engine reports: every rank's runtime variables, each its own RANK."""
    world = {k: v for k, v in card.card_env(quad(), Path("/c")).items() if k.startswith("AIU_WORLD_")}
    return {**good_info(), "ranks": [{"rank": i, "pid": 100 + i, "env": {**world, "RANK": str(i)}}
                                     for i in range(4)]}


def quad_log(opened: tuple[str, ...] = QUAD) -> str:
    return "".join(f"(Worker_TP{i} pid={100 + i}) [DT INFO] Opened: SEN:VFIO:{a} (iommu group 4{i})\n"
                   for i, a in enumerate(opened))


def test_card_env_of_a_group_gives_each_rank_its_card() -> None:
    env = card.card_env(quad(), Path("/c"))
    assert env["AIU_WORLD_SIZE"] == "4"
    assert [env[f"AIU_WORLD_RANK_{i}"] for i in range(4)] == list(QUAD)
    assert "AIU_WORLD_RANK_4" not in env
    assert env["HIL_CARD_ADDRESS"] == ",".join(QUAD)
    assert env["TORCH_SENDNN_CACHE_DIR"] == "/c/sendnn/quad0"  # the group's own compile cache
    assert not any(k.startswith("AIU_WORLD_") for k, _ in quad().env)  # the lease's env keeps it


def test_verification_passes_when_each_rank_opened_its_card() -> None:
    assert card.verify_card_engine(quad_cfg(), quad_info(), quad_log()) is None


@pytest.mark.parametrize("case, seen", [
    ("two ranks opened one card", f"rank 1 opened SEN:VFIO:{QUAD[0]}, expected SEN:VFIO:{QUAD[1]}"),
    ("RANK", "rank 1 runs with RANK=0"),
    ("AIU_WORLD_RANK_1", f"rank 1's runtime would open AIU_WORLD_RANK_1={QUAD[0]}, not its card"
                         f" {QUAD[1]}"),
])
def test_verification_of_a_group_names_the_rank_off_its_card(case: str, seen: str) -> None:
    info, log = quad_info(), quad_log()
    if case == "two ranks opened one card":
        log = quad_log((QUAD[0], QUAD[0], QUAD[2], QUAD[3]))
    else:
        info["ranks"][1]["env"][case] = {"RANK": "0", "AIU_WORLD_RANK_1": QUAD[0]}[case]
    problem = card.verify_card_engine(quad_cfg(), info, log)
    assert problem is not None, case
    assert "not the leased card group's Spyre sendnn engine (wrong opened)" in problem
    assert any(line.startswith(f"  {seen}") for line in problem.splitlines()), problem


def test_ledger_counts_a_group_engine_on_each_of_its_cards() -> None:
    group = quad_cfg()
    single = card_cfg(card.card_env(card_device(id="card1", address=QUAD[1]), Path("/c")), "card1")
    for first, second, where in ((group, single, "card1"), (single, group, "quad0 (card card1)")):
        ledger = DeviceLedger()
        ledger.started(first)
        ledger.started(second)
        assert ledger_problems(ledger.to_list()) == [
            f"{where}: {second.label} started while {[first.key]} still live"]
    ledger = DeviceLedger()
    ledger.started(group)
    assert ledger.events[0]["cards"] == ["card0", "card1", "card2", "card3"]
    ledger.started(card_cfg(device="card9"))  # a card outside the group
    ledger.closed(group.key)
    ledger.started(single)  # after the group engine closed
    assert ledger_problems(ledger.to_list()) == []
