"""No suite times out before its engine may have started: a device variant's test gets its
kind's start limit on top of the suite's own timeout (a card compiles for up to 1200 s)."""

import os
import subprocess
import sys
from pathlib import Path

from harness.core.paths import REPO_ROOT

SHOW = '''
def pytest_collection_modifyitems(items):
    for it in items:
        m = it.get_closest_marker("timeout")
        print("TIMEOUT", it.callspec.id, m.args[0])
'''


def test_device_variants_get_their_start_limit_on_top_of_the_suite_timeout(tmp_path: Path) -> None:
    (tmp_path / "show_timeout.py").write_text(SHOW)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/test_capacity.py", "--collect-only", "-q",
         "-p", "no:cacheprovider", "-p", "show_timeout", "--model", "tiny-llama",
         "--target", "vllm-cpu,spyre-sendnn-cp,neuron", "-k", "device_decided"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)})
    seen = dict(line.split()[1:] for line in out.stdout.splitlines() if line.startswith("TIMEOUT"))
    assert float(seen["tiny-llama-vllm-cpu"]) == 900  # the suite's own
    assert float(seen["tiny-llama-spyre-sendnn-cp"]) == 900 + 1200  # the sendnn start limit on top
    assert float(seen["tiny-llama-neuron"]) == 900 + 1800
