"""The ``host`` stack: the Python this harness is told to use, as it is (a card image's venv).

The pinned stacks (stacks/*.toml) are venvs this repository installs. A card host brings its own:
the vendor's image with its torch and torch_sendnn, into which the harness is pip-installed. The
``host`` stack runs engines in that Python (``--python PATH``, env HIL_HOST_PYTHON; default: the Python
running pytest) and installs nothing. It is the default when the harness runs outside a checkout
(no stacks/ folder next to it).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

from harness.core.paths import STACKS_DIR

HOST = "host"
_STACKS_DIR = STACKS_DIR


def default_stack() -> str:
    """HIL_STACK, else ``default`` in a checkout (stacks/default.toml present), else ``host``."""
    env = os.environ.get("HIL_STACK")
    if env:
        return env
    return "default" if (_STACKS_DIR / "default.toml").is_file() else HOST


def is_unpinned(name: str) -> bool:
    """Stacks whose engines run in a given Python, with no venv of their own to install."""
    return name in ("default", HOST)


def host_python() -> str | None:
    """The Python engines of the host stack run in (None: the one running the harness)."""
    return os.environ.get("HIL_HOST_PYTHON") or None


def host_python_problem() -> str | None:
    """Why ``--python`` cannot run engines, or None."""
    python = host_python()
    if python is None:
        return None
    if not Path(python).is_file() or not os.access(python, os.X_OK):
        return f"--python {python}: not an executable file"
    probe = subprocess.run([python, "-c", "import vllm, harness"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"--python {python} cannot import vllm and the harness ({last}); pip install the harness there"
    return None


def describe() -> str:
    return f"host (the given Python, as it is: {host_python() or sys.executable})"


@functools.cache
def installed_version(dist: str) -> str | None:
    """The version of ``dist`` installed in the host stack's Python, or None."""
    code = ("import importlib.metadata as m, sys\n"
            "try: print(m.version(sys.argv[1]))\nexcept m.PackageNotFoundError: pass")
    try:
        out = subprocess.run([host_python() or sys.executable, "-c", code, dist],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
