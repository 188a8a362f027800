"""Where the checkout's own folders are: the one place that knows the repository's shape."""

from __future__ import annotations

import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "fixtures"
STACKS_DIR = REPO_ROOT / "stacks"

# Installed (pip install), the suites are data of the distribution (pyproject's data-files):
# <environment>/share/vllm-hil/suites; in a checkout (an editable install too), its own.
INSTALLED_SUITES_DIR = Path(sysconfig.get_path("data")) / "share" / "vllm-hil" / "suites"
SUITES_DIR = REPO_ROOT / "suites" if (REPO_ROOT / "suites").is_dir() else INSTALLED_SUITES_DIR
