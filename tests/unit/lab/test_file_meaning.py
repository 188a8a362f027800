"""Meaning, not only shape, for the files a run reads: an inventory's ids, addresses, core
ranges and env; a quarantine's duplicates and entries that match nothing; the engine-order
record, the durations file and the statistics files the harness wrote itself (unreadable:
named, then ignored or rebuilt, never an error)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness import targets
from harness.engine.order import RECORD, order_tests_by_engine_config, read_record, save_record
from harness.lab.inventory import InventoryError, load_inventory
from harness.lab.quarantine import KnownFailure, judge_quarantine, load_quarantine
from harness.lab.shard_plan import DurationsError, durations_for, load_durations, plan_shards
from harness.plugin.outputs import RUN_BEGUN

SPYRE = '[[device]]\nid = "{id}"\nkind = "spyre"\n'
NEURON = '[[device]]\nid = "{id}"\nkind = "neuron"\n'


def load(tmp_path: Path, body: str):
    path = tmp_path / "inv.toml"
    path.write_text(body)
    return load_inventory(path, root=tmp_path)


def refused(tmp_path: Path, body: str) -> str:
    with pytest.raises(InventoryError) as e:
        load(tmp_path, body)
    assert str(tmp_path / "inv.toml") in str(e.value)
    return str(e.value)


# ------------------------------------------------------------------ inventory: ids, addresses


def test_two_devices_with_one_address_are_refused(tmp_path):
    body = (SPYRE.format(id="a") + 'address = "0000:1a:00.0"\n'
            + SPYRE.format(id="b") + 'address = "0000:1A:00.0"\n')
    msg = refused(tmp_path, body)
    assert "device #2 ('b'): address '0000:1A:00.0' is also the address of device #1 ('a'" in msg
    assert "two workers could lease one Spyre device at once; list each device once" in msg


@pytest.mark.parametrize("first, second", [
    ('address = "/dev/neuron0"', 'address = "neuron0"'),
    ('address = "neuron1"', 'address = "neuron1"'),
])
def test_neuron_addresses_are_compared_as_devices(tmp_path, first, second):
    body = NEURON.format(id="a") + first + "\n" + NEURON.format(id="b") + second + "\n"
    assert "is also the address of device #1" in refused(tmp_path, body)


def test_an_address_given_as_the_card_variable_counts_too(tmp_path):
    body = (SPYRE.format(id="a") + 'address = "0000:1a:00.0"\n'
            + SPYRE.format(id="b") + 'env = { AIU_WORLD_RANK_0 = "0000:1a:00.0" }\n')
    assert "device #2 ('b'): env AIU_WORLD_RANK_0 '0000:1a:00.0' is also the address" \
        in refused(tmp_path, body)


def test_address_and_card_variable_must_name_one_card(tmp_path):
    body = SPYRE.format(id="a") + ('address = "0000:1a:00.0"\n'
                                   'env = { AIU_WORLD_RANK_0 = "0000:3b:00.0" }\n')
    msg = refused(tmp_path, body)
    assert "address '0000:1a:00.0' and env AIU_WORLD_RANK_0 '0000:3b:00.0' name different" \
        " devices; give the device's address once" in msg
    ok = SPYRE.format(id="a") + ('address = "0000:1a:00.0"\n'
                                 'env = { AIU_WORLD_RANK_0 = "0000:1A:00.0" }\n')
    assert len(load(tmp_path, ok).devices) == 1


def test_duplicate_ids_stay_refused_naming_the_first(tmp_path):
    msg = refused(tmp_path, SPYRE.format(id="a") + SPYRE.format(id="a"))
    assert "device #2 ('a'): id listed twice (also device #1); give each device its own id" in msg


@pytest.mark.parametrize("kind, address, form", [
    ("spyre", "/etc", "a PCI address domain:bus:device.function in hex, like 0000:1a:00.0"),
    ("spyre", "1a:00.0", "a PCI address"),
    ("spyre", "0000:1a:00.8", "a PCI address"),
    ("spyre", "/sys/bus/pci/devices/0000:1a:00.0", "a PCI address"),
    ("neuron", "/etc", "a Neuron device node, like neuron0 or /dev/neuron0"),
    ("neuron", "3", "a Neuron device node"),
])
def test_an_address_must_have_its_kinds_format(tmp_path, kind, address, form):
    body = (SPYRE if kind == "spyre" else NEURON).format(id="d") + f'address = "{address}"\n'
    msg = refused(tmp_path, body)
    assert f"device #1 ('d'): address {address!r} is not {form}" in msg
    assert "as discovery lists it (`hil devices`)" in msg


def test_addresses_discovery_lists_are_accepted(tmp_path):
    from harness.targets.neuron.discovery import discover_neuron
    from harness.targets.spyre.discovery import discover_spyre

    card = tmp_path / "sys/bus/pci/devices/0000:3b:00.0"
    card.mkdir(parents=True)
    (card / "vendor").write_text("0x1014\n")
    (card / "device").write_text("0x06a7\n")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/neuron2").write_text("")
    found = [*discover_spyre(tmp_path).devices, *discover_neuron(tmp_path).devices]
    assert [d.id for d in found] == ["0000:3b:00.0", "neuron2"]
    for d in found:
        assert targets.device_kinds()[d.kind].address_problem(d.id) is None
    body = (SPYRE.format(id="c") + 'address = "0000:3b:00.0"\n'
            + NEURON.format(id="n") + 'address = "/dev/neuron2"\ncores = "0-1"\n')
    assert [d.present for d in load(tmp_path, body).devices] == [True, True]


# ------------------------------------------------------------------ inventory: core ranges


@pytest.mark.parametrize("cores", ["1-0", "0,0", "0-1,1", "0--1", "٣", "0 - 1"])
def test_a_malformed_core_range_is_refused(tmp_path, cores):
    msg = refused(tmp_path, NEURON.format(id="n") + f'cores = "{cores}"\n')
    assert "device #1 ('n'): cores" in msg and repr(cores) in msg


def test_a_core_range_narrower_than_tensor_parallel_is_refused(tmp_path):
    body = NEURON.format(id="n") + 'cores = "0-1"\nengine = { tensor_parallel_size = 4 }\n'
    msg = refused(tmp_path, body)
    assert ("cores (NEURON_RT_VISIBLE_CORES) '0-1' are 2 NeuronCore(s), fewer than"
            " engine.tensor_parallel_size 4; list at least 4 cores or lower"
            " tensor_parallel_size") in msg
    ok = NEURON.format(id="n") + 'cores = "0-1,4-5"\nengine = { tensor_parallel_size = 4 }\n'
    assert dict(load(tmp_path, ok).devices[0].env)["NEURON_RT_VISIBLE_CORES"] == "0-1,4-5"


def test_cores_in_env_are_checked_and_must_agree_with_the_field(tmp_path):
    bad = NEURON.format(id="n") + 'env = { NEURON_RT_VISIBLE_CORES = "x" }\n'
    assert "cores (NEURON_RT_VISIBLE_CORES) 'x' must be like" in refused(tmp_path, bad)
    narrow = NEURON.format(id="n") + ('env = { NEURON_RT_VISIBLE_CORES = "0" }\n'
                                      'engine = { tensor_parallel_size = 2 }\n')
    assert "are 1 NeuronCore(s), fewer than engine.tensor_parallel_size 2" \
        in refused(tmp_path, narrow)
    both = NEURON.format(id="n") + 'cores = "0-1"\nenv = { NEURON_RT_VISIBLE_CORES = "2-3" }\n'
    assert "env NEURON_RT_VISIBLE_CORES='2-3' disagrees with what the entry's cores, engine" \
        " give ('0-1'); set it once" in refused(tmp_path, both)


# ------------------------------------------------------------------ inventory: owned env keys


@pytest.mark.parametrize("kind, key, why", [
    ("spyre", "HIL_DEVICE_ID", "the lease sets it to the leased device's id"),
    ("neuron", "HIL_ENGINE_AUTHKEY", "the engine host sets each engine's connection key"),
    ("cpu", "HIL_ALLOW_EXTERNAL_FAULTS", "only --allow-external-faults allows external faults"),
    ("spyre", "HIL_CARD_ADDRESS", "the on-card check compares the card the engine opened"),
    ("spyre", "VLLM_PLUGINS", "the harness loads the plugin of the stack's generation"),
    ("spyre", "SENDNN_INFERENCE_USE_CB", "from the test's target variant"),
    ("spyre", "VLLM_SPYRE_DYNAMO_BACKEND", "from the test's target variant"),
    ("spyre", "MASTER_PORT", "a free port"),
    ("neuron", "NEURON_COMPILED_ARTIFACTS", "each compiled shape its own folder"),
    ("neuron", "HIL_NEURON_ENGINE", "write engine = { ... }"),
    ("neuron", "VLLM_ENABLE_V1_MULTIPROCESSING", "the engine read in process"),
])
def test_env_keys_the_harness_sets_are_refused(tmp_path, kind, key, why):
    body = f'[[device]]\nid = "d"\nkind = "{kind}"\nenv = {{ {key} = "x" }}\n'
    msg = refused(tmp_path, body)
    assert f"device #1 ('d'): env {key}='x': " in msg and why in msg
    assert f"remove {key} from the device's env" in msg


def test_env_keys_a_lab_decides_are_kept(tmp_path):
    body = SPYRE.format(id="d") + ('env = { AIU_WORLD_RANK_0 = "0000:1a:00.0", FLEX_DEVICE ='
                                   ' "PF", TORCH_SENDNN_CACHE_DIR = "/c", A = 1 }\n')
    env = dict(load(tmp_path, body).devices[0].env)
    assert env == {"AIU_WORLD_RANK_0": "0000:1a:00.0", "FLEX_DEVICE": "PF",
                   "TORCH_SENDNN_CACHE_DIR": "/c", "A": "1"}


# ------------------------------------------------------------------ quarantine


def write_quarantine(tmp_path: Path, *tests: str) -> Path:
    path = tmp_path / "q.toml"
    path.write_text("".join(f'[[known]]\ntest = "{t}"\nreason = "r"\nissue = "I-{n}"\n'
                            for n, t in enumerate(tests)))
    return path


def test_a_test_listed_twice_is_refused(tmp_path):
    path = write_quarantine(tmp_path, "s.py::a", "s.py::b", "s.py::a")
    with pytest.raises(ValueError) as e:
        load_quarantine(path)
    assert str(e.value) == (f"{path}: known #3 ('s.py::a'): test listed twice (also known #1);"
                            " keep one entry, with the reason that holds")


S = "suites/test_s.py"
RUN = [(f"{S}::test_a[tiny-llama-vllm-cpu-pair]", ("vllm-cpu", "tiny-llama")),
       (f"{S}::test_a[tiny-llama-vllm-cpu-long]", ("vllm-cpu", "tiny-llama")),
       (f"{S}::test_b", ())]
OTHERS = ["vllm-cpu", "spyre-sendnn-cp", "spyre-eager-cb", "tiny-llama", "tiny-granite"]


def judge(*tests: str):
    known = [KnownFailure(t, "r", "I", f"q.toml: known #{n}") for n, t in enumerate(tests, 1)]
    return judge_quarantine(known, RUN, OTHERS)


def test_an_entry_of_a_renamed_test_is_flagged():
    check = judge(f"{S}::test_gone[*]", f"{S}::test_b")
    assert check.warnings() == [
        f"q.toml: known #1 ('{S}::test_gone[*]') matches no collected test: {S} has no test"
        " 'test_gone'; fix its node id (was the test renamed?) or remove the entry"]


def test_an_entry_of_a_renamed_case_is_flagged_and_one_without_parameters_told_why():
    check = judge(f"{S}::test_a[*-vllm-cpu-old-name]", f"{S}::test_a")
    assert [w.split(": ", 2)[2] for w in check.warnings()] == [
        f"no test of {S} matches it; fix its node id (was the test renamed?) or remove the entry",
        "test_a is parametrized: its node ids end in [...]; add [*] for all of them, or their"
        " parameter ids; fix its node id (was the test renamed?) or remove the entry"]


def test_entries_this_run_cannot_judge_are_not_flagged():
    check = judge(f"{S}::test_a[tiny-granite-vllm-cpu-pair]",  # another model
                  f"{S}::test_a[*-spyre-sendnn-cp-pair]",  # another target
                  f"{S}::test_a[big-local-model-vllm-cpu-long]",  # a model folder elsewhere
                  "suites/test_other.py::test_x",  # a suite file not collected
                  "suites/*.py::test_x")  # no one file
    assert check.unmatched == []
    assert [why for _, why in check.not_judged] == [
        "it names 'tiny-granite', not in this run",
        "it names 'spyre-sendnn-cp', not in this run",
        "it may match a target variant or model not in this run",
        "suites/test_other.py was not collected in this run",
        "its file part is not one file"]
    assert check.notes()[0].startswith("q.toml: known #1 (")


def test_entries_matching_deselected_tests_are_matched():
    # judge_quarantine is given every collected test, deselected ones too (ordering.py).
    assert not judge(f"{S}::test_a[*-long]", f"{S}::test_b").unmatched


# ------------------------------------------------------------------ the engine-order record


class Item:
    def __init__(self, nodeid):
        self.nodeid = nodeid


@pytest.mark.parametrize("body, says", [
    (b"not json", "not valid JSON"),
    (b"[1, 2]", "expected {node id: configuration id}, got list"),
    (b'{"t1": [1]}', "test 't1' has configuration [1], expected a string"),
    (b'{"t1": "a", "t2": null}', "test 't2' has configuration None, expected a string"),
    (b'{"t1": 1, "t2": "x"}', "test 't1' has configuration 1, expected a string"),
    (b'\xff{}', "cannot read it"),
])
def test_a_corrupt_engine_order_record_is_named_ignored_and_rebuilt(tmp_path, body, says):
    (tmp_path / RECORD).write_bytes(body)
    items = [Item("t2"), Item("t1")]
    problem = order_tests_by_engine_config(items, tmp_path, lambda i: 0)
    assert problem.startswith(f"{tmp_path / RECORD}: ") and says in problem
    assert [i.nodeid for i in items] == ["t2", "t1"]  # the order as collected
    save_record(tmp_path, {"t1": "cfg-a"})
    assert read_record(tmp_path) == ({"t1": "cfg-a"}, None)


def test_an_engine_order_record_that_is_a_folder_is_never_an_error(tmp_path):
    (tmp_path / RECORD).mkdir()
    assert "cannot read it" in order_tests_by_engine_config([Item("a")], tmp_path, lambda i: 0)
    save_record(tmp_path, {"a": "cfg"})  # nothing raised; the folder stays
    assert (tmp_path / RECORD).is_dir()


# ------------------------------------------------------------------ durations


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-5", "true", '"3"', "null", "[1]"])
def test_durations_must_be_finite_non_negative_seconds(tmp_path, value):
    path = tmp_path / "durations.json"
    path.write_text('{"tests": {"t1": 1.5, "t2": ' + value + "}}")
    with pytest.raises(DurationsError) as e:
        load_durations(path)
    assert str(e.value).startswith(f"{path}: test 't2' has duration ")
    assert "expected a finite number of seconds, at least 0" in str(e.value)


@pytest.mark.parametrize("time", ["abc", "nan", "-1", "inf"])
def test_junit_durations_must_be_seconds_too(tmp_path, time):
    path = tmp_path / "junit.xml"
    path.write_text(f'<testsuite><testcase classname="a.b" name="t" time="{time}"/></testsuite>')
    with pytest.raises(DurationsError, match="test 'a.b::t' has duration"):
        load_durations(path)


def test_a_corrupt_default_durations_file_is_named_and_the_plan_is_by_count(tmp_path):
    (tmp_path / "durations.json").write_text('{"tests": {"t1": NaN}}')
    problems: list[str] = []
    durations, source = durations_for("", tmp_path, problems)
    assert durations == {} and source.endswith("(unreadable, ignored)")
    assert problems == [f"{tmp_path / 'durations.json'}: test 't1' has duration nan, expected a"
                        " finite number of seconds, at least 0; delete the file or make a new"
                        " one with `hil report`; ignored: the shards are planned by test count"]
    assert plan_shards({"g": ["t1"]}, 2, durations).by == "count"


def test_a_corrupt_named_durations_file_stays_refused(tmp_path):
    named = tmp_path / "mine.json"
    named.write_text('{"tests": {"t1": -1}}')
    with pytest.raises(DurationsError, match=f"{named}: test 't1' has duration -1"):
        durations_for(str(named), tmp_path, [])


def test_good_durations_still_load(tmp_path):
    path = tmp_path / "durations.json"
    path.write_text('{"tests": {"t1": 0, "t2": 2.5}}')
    assert load_durations(path) == {"t1": 0.0, "t2": 2.5}
    assert not any(math.isnan(v) for v in load_durations(path).values())


# ------------------------------------------------------------------ the terminal summary


class Reporter:
    def __init__(self):
        self.stats: dict = {}
        self.lines: list[str] = []

    def section(self, title):
        self.lines.append(title)

    def write_line(self, line, **markup):
        self.lines.append(line)


def fake_config(tmp_path: Path, verbose: int = 0):
    class Config:
        option = type("Option", (), {"verbose": verbose})()
        stash = pytest.Stash()

        def getoption(self, name):
            return {"--hil-reports-dir": str(tmp_path), "--stack": "default"}[name]

    config = Config()
    config.stash[RUN_BEGUN] = True  # a run that reached its tests: it reports
    return config


def test_an_unreadable_statistics_file_is_named_and_left_out(tmp_path):
    from harness.plugin.summary import write_summary

    stats = tmp_path / "stats"
    stats.mkdir()
    (stats / "gw0.json").write_text('{"engines": [], "reference_hi')
    (stats / "gw1.json").write_text('["not", "stats"]')
    (stats / "gw2.json").write_text('{"engines": [], "reference_hits": 2, "reference_misses": 1,'
                                    ' "near_ties": []}')
    tr = Reporter()
    write_summary(tr, fake_config(tmp_path))
    assert any(ln.startswith(f"WARNING: {stats / 'gw0.json'}: cannot be read") for ln in tr.lines)
    assert f"WARNING: {stats / 'gw1.json'}: not a statistics file of this harness; left out of" \
        " this summary" in tr.lines
    assert "reference cache: 2 hits, 1 computed" in tr.lines


def test_the_terminal_summary_says_the_file_warnings_and_with_v_what_was_not_judged(tmp_path):
    from harness.plugin import ordering
    from harness.plugin.summary import write_summary

    config = fake_config(tmp_path, verbose=1)
    config.stash[ordering.WARNINGS_KEY] = ["engine order: X: not valid JSON; ignored"]
    config.stash[ordering.QUARANTINE_CHECK_KEY] = judge("suites/test_other.py::test_x")
    tr = Reporter()
    write_summary(tr, config)
    assert tr.lines == ["WARNING: engine order: X: not valid JSON; ignored",
                        "quarantine: q.toml: known #1 ('suites/test_other.py::test_x') not"
                        " judged: suites/test_other.py was not collected in this run"]


def test_the_quarantine_check_warns_and_strict_refuses(tmp_path, monkeypatch):
    from harness.plugin import ordering

    class FakeItem:
        def __init__(self, nodeid):
            self.nodeid = nodeid
            self.marks: list = []

        def add_marker(self, mark):
            self.marks.append(mark)

    strict = {"value": False}
    monkeypatch.setattr(ordering, "option_value", lambda config, name, *d: {
        "--strict-quarantine": strict["value"], "--quarantine": "q.toml",
        "--stack": "default"}[name])
    config = fake_config(tmp_path)
    config.pluginmanager = type("PM", (), {"get_plugin": staticmethod(lambda name: None)})()
    # An entry that holds on another stack only is neither applied nor judged here.
    elsewhere = KnownFailure(f"{S}::test_b", "r", "I", "q: #2", stacks=("spyre-1.10",))
    config.stash[ordering.QUARANTINE_KEY] = [KnownFailure(f"{S}::test_gone", "r", "I", "q: #1"),
                                             elsewhere]
    item = FakeItem(f"{S}::test_b")
    with pytest.warns(ordering.HilFileWarning, match="has no test 'test_gone'"):
        ordering.quarantine(config, [item])
    assert item.marks == []
    assert ordering.file_warnings(config)[0].startswith("quarantine: q: #1 (")
    assert ordering.quarantine_notes(config) == [
        f"q: #2 ('{S}::test_b') not judged: it holds on stack(s) spyre-1.10, this run is on"
        " 'default'"]
    strict["value"] = True
    with pytest.raises(pytest.UsageError, match="^--strict-quarantine: q: #1 "):
        ordering.quarantine(config, [FakeItem(f"{S}::test_b")])


def test_a_quarantine_entry_can_hold_on_some_stacks_only(tmp_path):
    q = tmp_path / "q.toml"
    q.write_text(f'[[known]]\ntest = "{S}::test_b"\nreason = "r"\nissue = "I"\n'
                 'stacks = ["default"]\n')
    (k,) = load_quarantine(q, stacks=["default", "spyre-1.10"])
    assert k.stacks == ("default",) and k.holds_on("default") and not k.holds_on("spyre-1.10")
    assert KnownFailure(f"{S}::test_b", "r", "I").holds_on("spyre-1.10")  # no stacks: all
    with pytest.raises(ValueError, match=r"known #1 .*stacks names 'default', which is no"
                                         r" stack \(stacks/\*.toml: spyre-1.10\)"):
        load_quarantine(q, stacks=["spyre-1.10"])
    q.write_text(f'[[known]]\ntest = "{S}::test_b"\nreason = "r"\nissue = "I"\nstacks = []\n')
    with pytest.raises(ValueError, match="stacks"):
        load_quarantine(q)


def test_a_quarantine_entry_can_hold_on_hosts_whose_cpu_lacks_flags_only(tmp_path):
    from harness.lab.quarantine import host_cpu_flags

    q = tmp_path / "q.toml"
    q.write_text(f'[[known]]\ntest = "{S}::test_b"\nreason = "r"\nissue = "I"\n'
                 'cpu_lacks = ["avx512f", "avx512_bf16"]\n')
    (k,) = load_quarantine(q)
    assert k.cpu_lacks == ("avx512f", "avx512_bf16")
    assert k.holds_on("default", frozenset({"avx2", "fma"}))
    assert not k.holds_on("default", frozenset({"avx2", "avx512f"}))
    assert k.why_not("default", frozenset({"avx512f"})) == (
        "it holds on hosts whose CPU lacks avx512f, avx512_bf16; this host's has avx512f")
    stacked = KnownFailure(f"{S}::test_b", "r", "I", stacks=("default",), cpu_lacks=("x",))
    assert "stack(s) default" in str(stacked.why_not("canary", frozenset()))
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\nflags\t: other\n")
    assert host_cpu_flags(info) == frozenset({"fpu", "avx2", "fma"})
    assert host_cpu_flags(tmp_path / "none") == frozenset()
    for bad in ("[]", '["AVX512F"]', '["a", "a"]'):
        q.write_text(f'[[known]]\ntest = "{S}::test_b"\nreason = "r"\nissue = "I"\n'
                     f"cpu_lacks = {bad}\n")
        with pytest.raises(ValueError, match="cpu_lacks"):
            load_quarantine(q)


def test_the_record_is_json_the_harness_writes(tmp_path):
    save_record(tmp_path, {"b": "cfg-2", "a": "cfg-1"})
    assert json.loads((tmp_path / RECORD).read_text()) == {"a": "cfg-1", "b": "cfg-2"}
