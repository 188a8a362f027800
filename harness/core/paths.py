"""Where the checkout's own folders are: the one place that knows the repository's shape."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "fixtures"
STACKS_DIR = REPO_ROOT / "stacks"
