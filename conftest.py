"""Loads the vllm-hil pytest plugin for every suite and test in this repository."""

pytest_plugins = ["harness.plugin.hooks", "harness.plugin.fixtures", "harness.plugin.allure_report"]
