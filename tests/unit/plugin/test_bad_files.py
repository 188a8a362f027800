"""Files whose shape is right but whose meaning is not, as a pytest run meets them: an
inventory that gives one card twice, an address of the wrong form or a variable the harness
sets itself is refused (exit 4); an entry of the quarantine that matches no collected test is
refused under --strict-quarantine (with xdist too, before the earlier run's outputs are
touched); a corrupt engine-order record or default durations file
is named and ignored (exit 0). Each loses nothing of an earlier run."""

from __future__ import annotations

import pytest

from tests.bad_input import INV
from tests.unit.plugin.test_bad_arguments import SUITE, USAGE, Row, run_row

CARD = INV + 'address = "0000:1a:00.0"\n'
COLLECT = ["--collect-only", "--target", "vllm-cpu", "--model", "tiny-llama"]
RUN = ["--target", "vllm-cpu", "--model", "tiny-llama", "-k", "test_greedy_tokens_equal_reference"]

ROWS = [
    Row("inventory-one-address-twice", ["--inventory", "{inv.toml}"], USAGE,
        ["inv.toml: device #2 ('card1'): address '0000:1a:00.0' is also the address of device"
         " #1 ('card0', '0000:1a:00.0'): two workers could lease one Spyre device at once"],
        {"inv.toml": CARD + CARD.replace("card0", "card1")}),
    Row("inventory-address-not-pci", ["--inventory", "{inv.toml}"], USAGE,
        ["inv.toml: device #1 ('card0'): address '/etc' is not a PCI address"
         " domain:bus:device.function in hex, like 0000:1a:00.0"],
        {"inv.toml": INV + 'address = "/etc"\n'}),
    Row("inventory-env-harness-key", ["--inventory", "{inv.toml}"], USAGE,
        ["inv.toml: device #1 ('card0'): env HIL_DEVICE_ID='card1': the lease sets it to the"
         " leased device's id; remove HIL_DEVICE_ID from the device's env"],
        {"inv.toml": INV + 'env = { HIL_DEVICE_ID = "card1" }\n'}),
    Row("quarantine-entry-matches-nothing-strict",
        ["--quarantine", "{q.toml}", "--strict-quarantine", *COLLECT], USAGE,
        ["--strict-quarantine: ", "q.toml: known #1 ('suites/test_token_equality.py::"
         "test_renamed[*]') matches no collected test: suites/test_token_equality.py has no test"
         " 'test_renamed'; fix its node id (was the test renamed?) or remove the entry"],
        {"q.toml": f'[[known]]\ntest = "{SUITE}::test_renamed[*]"\nreason = "r"\nissue = "I-1"\n'}),
    # A run meant to run tests (no --collect-only) is refused before it cleans anything.
    Row("quarantine-entry-matches-nothing-strict-run",
        ["--quarantine", "{q.toml}", "--strict-quarantine", *RUN],
        USAGE, ["--strict-quarantine: ", "q.toml: known #1 ('suites/test_token_equality.py::"
                "test_renamed[*]') matches no collected test"],
        {"q.toml": f'[[known]]\ntest = "{SUITE}::test_renamed[*]"\nreason = "r"\nissue = "I-1"\n'}),
    # Under xdist each worker refuses its collection; the run still ends a usage error (4).
    Row("quarantine-entry-matches-nothing-strict-xdist",
        ["--quarantine", "{q.toml}", "--strict-quarantine", "-n", "2", *RUN],
        USAGE, ["--strict-quarantine: ", "q.toml: known #1 ('suites/test_token_equality.py::"
                "test_renamed[*]') matches no collected test"],
        {"q.toml": f'[[known]]\ntest = "{SUITE}::test_renamed[*]"\nreason = "r"\nissue = "I-1"\n'}),
    Row("engine-order-record-corrupt", ["--hil-cache-dir", "{cache}", *COLLECT], 0,
        ["HilFileWarning: engine order: ", "engine-order.json: test 't' has configuration [1],"
         " expected a string; ignored, and rewritten by this run's tests"],
        {"cache/engine-order.json": '{"t": [1]}'}),
    Row("default-durations-corrupt", ["--shard", "1/2", *COLLECT], 0,
        ["HilFileWarning: shard durations: ", "durations.json: not valid JSON",
         "ignored: the shards are planned by test count"],
        {"reports/durations.json": "{oops"}),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_a_file_that_means_nothing_is_refused_or_ignored_by_name(tmp_path, row):
    run_row(tmp_path, row)
