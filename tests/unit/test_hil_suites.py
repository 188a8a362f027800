"""`hil suites`: the copy's suites in a pytest run that asks for the harness, from the folder it
starts in, configured by that folder's pytest.ini alone; the suites' folder, installed or not."""

import os

from harness import cli
from harness.core import paths
from harness.plugin.activation import in_suites
from harness.staging.interrupt import pytest_command


def test_the_command_asks_for_the_harness_and_runs_the_suites(tmp_path):
    cmd = cli.suites_command(["-m", "spyre", "--require-device"], tmp_path)
    assert cmd[:5] == [*pytest_command(), "-p", "vllm_hil"]  # python -m pytest, stopped quietly
    assert cmd[-3:] == ["-m", "spyre", "--require-device"]
    assert str(paths.SUITES_DIR) in cmd
    assert in_suites([str(paths.SUITES_DIR)], tmp_path)
    # node ids suites/test_*.py::..., no conftest above the suites, the cache in this folder
    assert f"--rootdir={paths.SUITES_DIR.parent}" in cmd
    assert f"--confcutdir={paths.SUITES_DIR}" in cmd
    assert f"cache_dir={tmp_path / '.pytest_cache'}" in cmd
    # no pytest.ini here: pytest's defaults, not an ini above the suites (a checkout's)
    assert cmd[cmd.index("-c", 3) + 1] == os.devnull
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    cmd = cli.suites_command([], tmp_path)
    assert cmd[cmd.index("-c", 3) + 1] == str(tmp_path / "pytest.ini")


def test_the_suites_are_the_checkouts_here_and_the_distributions_data_installed():
    assert paths.SUITES_DIR == paths.REPO_ROOT / "suites"
    assert paths.INSTALLED_SUITES_DIR.parts[-3:] == ("share", "vllm-hil", "suites")


def test_without_suites_it_says_where_it_looked(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "SUITES_DIR", tmp_path / "none")
    assert cli.main(["suites", "-m", "spyre"]) == 2
    assert f"hil suites: no suites in {tmp_path / 'none'}" in capsys.readouterr().err
