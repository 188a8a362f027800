"""``python -m harness.stacks``: see ``harness.stacks.command``."""

import sys

from harness.stacks.command import main

sys.exit(main())
