"""Two runs on one host do not interfere: two child pytest runs started at once, each a run of
its own (its reports, its shared fork parents), on Spyre eager engines, one of one rank
(spyre-eager-np) and one of two (spyre-eager-cp, geometry tp2: torch.distributed's ``env://``
rendezvous on ``MASTER_PORT``, bound by rank 0's process).

In each, the port the first engine is about to bind is taken just before vLLM is built
(``tests/e2e/port_taken.py``, the port ``MASTER_PORT`` holds then): the start fails with
``DistNetworkError ... EADDRINUSE``, as a start did when another run's engines had taken the
port the harness picked; the engine is started again with another port, and the test passes.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.core.ports import PICKED_LINE, ports_picked
from harness.engine import forkserver
from harness.engine.bind_retry import RESTART_LINE
from tests.suite_runner import SuiteRun, run_suite

pytestmark = pytest.mark.e2e  # two child pytests with engines

TAKE_PORT = ("--allow-external-faults", "--inject-fault", "tests.e2e.port_taken.occupy_master_port")
RUNS = {
    "np": ("suites/test_block_freeing.py", "-k", "every_block_is_free_after_warmup",
           "--target", "spyre-eager-np", "--model", "tiny-llama"),
    "tp2": ("suites/test_geometry.py", "--geometry", "tp2", "--target", "spyre-eager-cp",
            "--model", "tiny-llama"),
}


def engine_logs(folder) -> str:
    return "\n".join(p.read_text(errors="replace")
                     for p in sorted((folder / "reports" / "engine-logs").glob("*.log"))
                     if not p.name.startswith("forkserver"))


def test_two_runs_at_once_each_restart_an_engine_whose_port_was_taken_and_pass(tmp_path):
    # Each child a run of its own, as two runs started from two shells: none inherits this
    # session's folder of shared parents (each opens its own).
    env = {forkserver.SHARE_ENV: "", forkserver.OWNER_ENV: ""}
    folders = {name: tmp_path / name for name in RUNS}
    for folder in folders.values():
        folder.mkdir()

    def run(name: str) -> SuiteRun:
        return run_suite(folders[name], *RUNS[name], *TAKE_PORT, env=env)

    with ThreadPoolExecutor(len(RUNS)) as pool:
        runs = dict(zip(RUNS, pool.map(run, RUNS), strict=True))
    for name, r in runs.items():
        why = {t: r.messages.get(t, "").strip().splitlines()[:1] for t in r.failed()}
        assert r.returncode == 0 and r.outcomes and not r.failed(), (name, why, r.output[-2000:])
        assert set(r.outcomes.values()) == {"passed"}, (name, r.outcomes)
        logs = engine_logs(folders[name])
        taken = re.findall(r"test fault: port (\d+) taken before vLLM binds it", logs)
        assert len(taken) == 1, (name, logs[-4000:])
        assert re.search(r"EADDRINUSE|address already in use", logs, re.I), (name, logs[-4000:])
        # The first start picked the port that was then taken; the restart picked another.
        picked = ports_picked(logs)
        assert len(picked) == 2 and picked[0] == int(taken[0]) != picked[1], (name, picked)
        assert PICKED_LINE in logs
        assert f"{RESTART_LINE} start refused, an address it binds was in use (ports picked:" \
            f" {taken[0]}); starting it again with other ports (start 2 of 3)" in logs, name
