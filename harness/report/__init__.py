"""Reports of a run: Allure labels and evidence, report configuration, `hil report`, summary.

Nothing here imports allure at module level except the pytest plugin that uses it
(harness/plugin/allure_report.py); the rest works on plain data and files.
"""
