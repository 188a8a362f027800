"""The pytest plugin: options declared in options.py, hooks in hooks.py (delegating to one module per feature), fixtures in fixtures.py, the Allure report's hooks in allure_report.py."""
