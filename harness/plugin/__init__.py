"""The pytest plugin: options and hooks in hooks.py, fixtures in fixtures.py."""
