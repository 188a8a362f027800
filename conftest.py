"""Loads the vllm-hil pytest plugin for every suite and test in this repository, and so asks for
it: a conftest that loads the plugin's modules itself turns the harness on (an installed copy
loaded by its entry points stays inert unless asked, harness/plugin/activation.py).

Where the harness is also installed with its pytest11 entry points, pytest may have loaded the
plugin modules already (this repository's pyproject blocks them; another ini may not): register
only what is not loaded, so nothing registers twice.
"""

import sys

_PLUGINS = ["harness.plugin.hooks", "harness.plugin.fixtures", "harness.plugin.allure_report"]

pytest_plugins = [m for m in _PLUGINS if m not in sys.modules]
