"""``python -m harness.stacks``: install, list and relock pinned stacks (standard library only)."""

import sys

from harness.stacks.spec import main

sys.exit(main())
