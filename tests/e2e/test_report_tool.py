"""End to end: two runs with injected faults on two xdist workers, `hil report` after each,
and headless Chromium reading the generated report from a local server.

Run 1 (forget-free) breaks the KV ledger: a block leak. Run 2 (perturb-logit, same
results folder, ``--clean-alluredir``) makes token equality fail in a step-driven
scenario: a token mismatch with a token diff and a KV ledger plot. The second report
must show both runs in its trend; the browser must show the suites, the failing
test's category and its attachments. Screenshots go to reports/screenshots/.

The report tool also makes a report from a results folder with bad files and from an
empty one, naming the problems.
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.report import generate
from harness.report.results import labels_of, load_results
from tests.allure_results import results_folder
from tests.suite_runner import ROOT, run_suite

pytestmark = pytest.mark.e2e  # runs suites in a child pytest, the report tool and a browser

SELECTION = [
    "suites/test_token_equality.py", "suites/test_block_freeing.py",
    "-k", "(greedy and single and not one-token) or finish-back-to-idle or after_warmup",
    "--model", "tiny-llama", "--target", "vllm-cpu", "-n", "2",
]
LEAKY = "test_blocks_return_to_the_pool[tiny-llama-vllm-cpu-requests-finish-back-to-idle]"
SCREENSHOTS = ROOT / "reports" / "screenshots"
CHROMIUM, CHROMEDRIVER = "chromium", "chromedriver"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,1000"]


def _browser_or_skip() -> tuple[str, str]:
    chromium, driver = shutil.which(CHROMIUM), shutil.which(CHROMEDRIVER)
    if not chromium or not driver:
        pytest.skip(f"{CHROMIUM} or {CHROMEDRIVER} not on PATH (found {chromium}, {driver});"
                    " ./setup.sh installs Debian's chromium and chromium-driver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed; ./setup.sh installs it from the lock")
    return chromium, driver


def _tool_or_skip() -> None:
    try:
        generate.find_tool()
    except generate.ReportToolMissing as e:
        pytest.skip(f"report tool missing: {e}")


def hil_report(results: Path, output: Path, reports: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "report", "--results", str(results),
         "--output", str(output), "--reports-dir", str(reports)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """The report folder and the URL of a local server serving it."""
    report = tmp_path / "allure-report"
    report.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(report)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield report, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        thread.join(timeout=10)


def _results_by_nodeid(results: Path) -> dict[str, dict]:
    folder = load_results(results)
    assert not [p for p in folder.problems if "skipped" in p], folder.problems
    by_id: dict[str, dict] = {}
    for r in folder.tests:
        nodeid = labels_of(r)["nodeid"][0]
        assert nodeid not in by_id, f"{nodeid} appears twice in {results}"
        by_id[nodeid] = r
    return by_id


def _attachments(results: Path, result: dict) -> dict[str, Path]:
    files = {a["name"]: results / a["source"] for a in result.get("attachments", [])}
    for name, path in files.items():
        assert path.is_file() and path.stat().st_size > 0, (name, path)
    return files


def test_two_faulty_runs_make_a_report_a_browser_shows(tmp_path, served):
    _chromium, driver_path = _browser_or_skip()
    _tool_or_skip()
    report, url = served
    results, reports = tmp_path / "allure-results", tmp_path / "reports"

    # -- night 1: a block leak ------------------------------------------------
    run1 = run_suite(tmp_path / "run1", *SELECTION, f"--alluredir={results}",
                     "--inject-fault", "forget-free")
    assert run1.returncode == 1, run1.output[-3000:]
    assert LEAKY in run1.failed(), run1.outcomes
    by_id = _results_by_nodeid(results)
    assert len(by_id) == len(run1.outcomes) == 3
    leaky = next(r for k, r in by_id.items() if k.endswith(LEAKY))
    assert {"KV ledger", "KV ledger plot", "scenario", "engine log"} <= set(_attachments(results, leaky))
    out = hil_report(results, report, reports)
    assert "trend of 1 run(s)" in out, out
    cats = json.loads((report / "data" / "categories.json").read_text())
    assert "block leak" in [c["name"] for c in cats["children"]]

    # -- night 2: a token mismatch in a step-driven scenario --------------------
    run2 = run_suite(tmp_path / "run2", *SELECTION, f"--alluredir={results}",
                     "--clean-alluredir", "--inject-fault", "perturb-logit")
    assert run2.returncode == 1, run2.output[-3000:]
    by_id = _results_by_nodeid(results)  # cleaned once: no result of night 1 is left
    assert len(by_id) == len(run2.outcomes) == 3
    failed = {k for k, r in by_id.items() if r["status"] == "failed"}
    assert {k.split("::")[1] for k in failed} == set(run2.failed())
    for nodeid in failed:
        names = set(_attachments(results, by_id[nodeid]))
        assert {"token diff", "scenario", "engine log"} <= names, (nodeid, names)
    leaky = next(r for k, r in by_id.items() if k.endswith(LEAKY))
    files = _attachments(results, leaky)
    assert {"token diff", "KV ledger", "KV ledger plot"} <= set(files)
    assert 'class="diverge"' in files["token diff"].read_text()
    steps = [s["name"] for s in leaky["steps"]]
    assert steps and steps[0].startswith("run requests-finish-back-to-idle on vllm-cpu: 3 requests")
    assert [c["name"].split(":")[0] for c in leaky["steps"][0]["steps"]] == [
        "request r0", "request r1", "request r2"]
    out = hil_report(results, report, reports)
    assert "trend of 2 run(s)" in out, out
    assert (reports / "summary.md").read_text().count("| token mismatch |") >= 2
    trend = json.loads((report / "widgets" / "history-trend.json").read_text())
    assert len(trend) == 2
    case_files = list((report / "data" / "test-cases").glob("*.json"))
    case = next(json.loads(p.read_text()) for p in case_files
                if LEAKY in json.loads(p.read_text())["name"] or
                LEAKY.split("[")[1].rstrip("]") in json.loads(p.read_text())["name"])
    assert len(case["extra"]["history"]["items"]) >= 1, "the test lost its history between runs"
    assert [c["name"] for c in case["extra"]["categories"]] == ["token mismatch"]

    # -- a reviewer opens the report ------------------------------------------
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which(CHROMIUM) or CHROMIUM
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tempfile.mkdtemp(prefix='hil-chromium-')}"]:
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(driver_path), options=options)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    wait = WebDriverWait(browser, 30)

    def body() -> str:
        return browser.find_element(By.TAG_NAME, "body").text

    def open_node(text: str) -> None:
        def find(_d: object):
            for el in browser.find_elements(By.CSS_SELECTOR, ".node__title"):
                if text in el.text:
                    return el
            return False
        wait.until(find).click()

    def attachment_row(name: str):
        for row in browser.find_elements(By.CSS_SELECTOR, ".attachment-row"):
            if row.find_element(By.CSS_SELECTOR, ".attachment-row__name").text == name:
                return row
        return False

    try:
        browser.get(url)
        wait.until(lambda _d: "token mismatch" in body() and "block freeing" in body())
        # The trend chart has one slice per run.
        wait.until(lambda _d: len(browser.find_elements(
            By.CSS_SELECTOR, "[data-id='history-trend'] svg.chart__svg .slice")) == 2)
        time.sleep(1)
        assert "token equality" in body()
        browser.save_screenshot(str(SCREENSHOTS / "overview.png"))

        browser.get(url + "#suites")
        wait.until(lambda _d: "block freeing" in body() and "token equality" in body())

        browser.get(url + "#categories")
        open_node("token mismatch")
        open_node("request 'r")  # the message group of the step-driven scenario
        open_node("requests-finish-back-to-idle")
        wait.until(lambda _d: "Categories: token mismatch" in body())
        text = body()
        for expected in ("token diff", "KV ledger plot", "KV ledger", "scenario", "engine log",
                         "device: 'cpu@", "batch size: '3'", "run requests-finish-back-to-idle"):
            assert expected in text, expected
        plot = wait.until(lambda _d: attachment_row("KV ledger plot"))
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
        plot.click()
        wait.until(lambda _d: browser.find_elements(By.CSS_SELECTOR, "img[src*='attachments']"))
        # A tall window shows the whole test: status, category, parameters, steps, plot.
        browser.set_window_size(1400, 2300)
        title = browser.find_element(By.XPATH, "//*[contains(text(), 'requests-finish-back-to-idle]')]")
        browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", title)
        time.sleep(1)
        browser.save_screenshot(str(SCREENSHOTS / "failure.png"))
        # The token diff page itself, as the attachment's "open in new tab" shows it.
        link = attachment_row("token diff").find_element(By.CSS_SELECTOR, "[data-download]")
        browser.set_window_size(1400, 1000)
        browser.get(url + link.get_attribute("data-download"))
        wait.until(lambda _d: "first divergence" in body())
        assert browser.find_elements(By.CSS_SELECTOR, "tr.diverge")
        browser.save_screenshot(str(SCREENSHOTS / "failure-token-diff.png"))
    finally:
        browser.quit()
    for name in ("overview.png", "failure.png"):
        assert (SCREENSHOTS / name).stat().st_size > 10_000, name


def test_report_from_bad_and_empty_folders_is_still_produced(tmp_path):
    _tool_or_skip()
    out = generate.generate_report(results_folder(tmp_path), tmp_path / "report")
    assert out.generated, out.error
    cases = list((tmp_path / "report" / "data" / "test-cases").glob("*.json"))
    assert len(cases) == 1
    assert any("truncated?" in p for p in out.problems)
    cats = json.loads((tmp_path / "report" / "data" / "categories.json").read_text())
    assert [c["name"] for c in cats["children"]] == ["token mismatch"]
    (tmp_path / "empty").mkdir()
    out = generate.generate_report(tmp_path / "empty", tmp_path / "report")
    assert out.generated and out.tests == 0 and out.trend_runs == 2
    assert any("no test results" in p for p in out.problems)
    shutil.rmtree(tmp_path / "report")
