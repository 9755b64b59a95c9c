"""The dashboard in a real headless browser: Debian's chromium driven by Selenium, the page opened from file://
with the network blocked (every host resolves nowhere, and CDP blocks http, https and ws requests). Checked:
no console errors, no failed request and none but the page itself, every plot drawn by Plotly, the mapping
sheet sorted by a header click and filtered by typing. The screenshot is kept in the test's tmp folder and in
out/test-artifacts/report.png. Skipped, with the reason, only where chromium could not be installed (not root, no
passwordless sudo); where it could have been, a missing browser fails the test (`make browser` installs it).

The report is built from small real runs: a profile of a tiny model on this CPU (predicted on a catalog
CPU), a two-by-two sweep, a 300-request serving simulation and a one-cell fit matrix, all in one folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACT = Path(__file__).resolve().parents[2] / "out" / "test-artifacts" / "report.png"
TINY = ("import torch\nfrom torch import nn\n\ndef tiny():\n"
        "    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)), (torch.randn(32, 64),)\n")


def _skip_reason() -> str | None:
    import importlib.util

    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install 'opmap[dev]')"
    for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)):
        if not Path(path).exists():
            return f"{name} is not installed (make browser: apt-get install chromium chromium-driver)"
    return None


def _could_install() -> bool:
    """Root, or passwordless sudo: `make browser` installs chromium here, so a missing browser is a failure."""
    import os
    import subprocess

    if os.geteuid() == 0:
        return True
    if shutil.which("sudo") is None:
        return False
    return subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0


# Skipped only where the browser could not have been installed (not root, no passwordless sudo).
pytestmark = pytest.mark.skipif(_skip_reason() is not None and not _could_install(), reason=_skip_reason() or "")


@pytest.fixture(autouse=True, scope="module")
def _browser_present():
    reason = _skip_reason()
    if reason is not None:
        pytest.fail(f"{reason}, and this machine could install it (root or passwordless sudo): run `make browser`")


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    from opmap.cli import main

    d = tmp_path_factory.mktemp("dash")
    (d / "tiny.py").write_text(TINY)
    out = d / "out"
    for args in (["profile", f"{d / 'tiny.py'}:tiny", "--hardware", "xeon-8480", "--iters", "3",
                  "--profile-iters", "1", "--warmup", "1"],
                 ["sweep", "gpt2", "--batch", "1,4", "--seq", "32,64"],
                 ["serve", "gpt2", "--service-time", "exp:100", "--policy", "none", "--arrival", "poisson:5",
                  "--requests", "300"],
                 ["fit", "--models", "gpt2", "--hardware", "l4", "--slo-p99", "3000", "--requests", "50",
                  "--devices-budget", "1"],
                 ["report", str(out)]):
        assert main([*args, "--out", str(out), "--no-store"] if args[0] != "report" else args) == 0, args
    return out / "report.html"


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,1000",
              "--host-resolver-rules=MAP * ~NOTFOUND", "--disable-background-networking", "--no-first-run"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(30)
    try:
        drv.execute_cdp_cmd("Network.enable", {})
        drv.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["http://*", "https://*", "ws://*", "wss://*"]})
        yield drv
    finally:
        drv.quit()


def test_dashboard_in_headless_chromium(report_page, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url = report_page.as_uri()
    browser.get(url)
    plots = browser.find_elements(By.CSS_SELECTOR, "div.plot")
    assert {p.get_attribute("id") for p in plots} == {
        "fig-roofline", "fig-layer_time", "fig-layer_mfu", "fig-layer_stall", "fig-sweep", "fig-serve_cdf", "fig-fit",
        "fig-perf_per_watt"}
    # every plot drawn: Plotly marks its div js-plotly-plot and puts its SVG layers (.main-svg) inside
    WebDriverWait(browser, 20).until(lambda d: d.execute_script(
        "return Array.from(document.querySelectorAll('div.plot')).every("
        "e => e.classList.contains('js-plotly-plot') && e.querySelector('.main-svg') !== null)"))
    drawn = browser.execute_script(
        "return Array.from(document.querySelectorAll('div.plot')).map(e => e.querySelectorAll('.main-svg').length)")
    assert all(n >= 1 for n in drawn), drawn
    # the points are there: each scatter/bar/heatmap trace of the roofline became an SVG group
    assert browser.execute_script(
        "return document.querySelectorAll('#fig-roofline .scatterlayer .trace').length") >= 4

    # the mapping sheet sorts on a header click: predicted time, ascending then descending
    col = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#kernel-table thead th")].index("predicted")
    values = "return Array.from(document.querySelectorAll('#kernel-table tbody tr')).map(" \
             f"r => parseFloat(r.cells[{col}].getAttribute('data-v')))"
    header = browser.find_elements(By.CSS_SELECTOR, "#kernel-table thead th")[col]
    header.click()
    up = browser.execute_script(values)
    assert len(up) == 3 and up == sorted(up)
    header.click()
    assert browser.execute_script(values) == sorted(up, reverse=True)
    # and filters as one types
    browser.find_element(By.ID, "kernel-filter").send_keys("gelu")
    shown = browser.execute_script("return Array.from(document.querySelectorAll('#kernel-table tbody tr'))"
                                   ".filter(r => r.style.display !== 'none').length")
    assert shown == 1 and browser.find_element(By.ID, "kernel-shown").text == "1"

    # the tags parse in the page as the profile wrote them
    tags = browser.execute_script("return JSON.parse(document.getElementById('opmap-tags').textContent)")
    assert tags == json.loads((report_page.parent / "profile.json").read_text())["tags"]

    shot = tmp_path / "report.png"
    _full_page_png(browser, shot)
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, ARTIFACT)

    errors, requested, failed = _logs(browser)
    assert errors == [] and requested == {url} and failed == []


def _full_page_png(browser, path: Path) -> None:
    """The whole page (not only the window) at half scale, through CDP's captureBeyondViewport."""
    import base64

    browser.execute_script("window.scrollTo(0, 0)")
    h = browser.execute_script("return document.documentElement.scrollHeight")
    w = browser.execute_script("return document.documentElement.scrollWidth")
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True, "clip": {"x": 0, "y": 0, "width": w, "height": h,
                                                                  "scale": 0.5}})
    path.write_bytes(base64.b64decode(shot["data"]))


def _logs(browser) -> tuple[list, set[str], list]:
    """(console errors, URLs requested other than data: and blob: ones, failed requests) since the last call.
    data: and blob: URLs are made in the page itself (Plotly draws a 1-pixel data: image)."""
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    requested, failed = set(), []
    for entry in browser.get_log("performance"):
        m = json.loads(entry["message"])["message"]
        if m["method"] == "Network.requestWillBeSent":
            requested.add(m["params"]["request"]["url"])
        elif m["method"] == "Network.loadingFailed":
            failed.append(m["params"])
    return errors, {u for u in requested if not u.startswith(("data:", "blob:"))}, failed


def test_the_checks_catch_an_external_request(report_page, browser, tmp_path):
    """The same page with one image from the network and one script error: the checks above see the request,
    its failure and the console error (so their passing means something)."""
    page = tmp_path / "leaky.html"
    page.write_text(report_page.read_text().replace(
        "<body>", '<body><img src="https://example.com/x.png"><script>notDefined()</script>', 1))
    _logs(browser)  # drop what an earlier test left
    browser.get(page.as_uri())
    # the blocked request's events reach the performance log after the load event, later on a busy host: poll
    import time

    errors, requested, failed = [], set(), []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        e, r, f = _logs(browser)
        errors, requested, failed = errors + e, requested | r, failed + f
        if "https://example.com/x.png" in requested and failed and errors:
            break
        time.sleep(0.2)
    assert "https://example.com/x.png" in requested and failed and errors


def test_a_name_that_closes_the_script_still_loads_and_draws(browser, tmp_path):
    """A serving run whose workload's name holds </script>, <!--<script> and an alert: the page loads with its
    five script elements, no alert, no console error, the serving CDF drawn and the name read back intact."""
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.support.ui import WebDriverWait

    from opmap.cli import main

    evil = "</script><script>alert(1)</script><!--<script>"
    out = tmp_path / "out"
    assert main(["serve", evil, "--service-time", "exp:100", "--policy", "none", "--arrival", "poisson:5",
                 "--requests", "200", "--out", str(out), "--no-store"]) == 0
    assert main(["report", str(out), "--no-png"]) == 0
    _logs(browser)  # drop what an earlier test left
    browser.get((out / "report.html").as_uri())
    WebDriverWait(browser, 20).until(lambda d: d.execute_script(
        "return Array.from(document.querySelectorAll('div.plot')).every("
        "e => e.classList.contains('js-plotly-plot') && e.querySelector('.main-svg') !== null)"))
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 (reading it is the check)
    assert browser.execute_script("return document.querySelectorAll('script').length") == 5
    assert browser.execute_script("return document.querySelectorAll('div.plot').length") == 1
    tags = browser.execute_script("return JSON.parse(document.getElementById('opmap-tags').textContent)")
    assert tags["workload"] == evil
    errors, _, failed = _logs(browser)
    assert errors == [] and failed == []
