"""report.html in a real browser: Debian's Chromium, headless, driven by Selenium through the
chromedriver of the same Debian package (so browser and driver versions always match). The page
must show every plot (each <img> decoded: naturalWidth > 0), its tables, load nothing from the
network, and log no console error. The same checks run on a deliberately broken copy, to show
they can fail. CI sets BATCHLAB_REQUIRE_BROWSER=1: there a missing browser is a failure, not a skip.
"""
import os
import re
from pathlib import Path

import pytest

from batchlab.report.report import build_report
from batchlab.run.config import load_user_config
from batchlab.run.sweep import run_sweep

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
REQUIRED = os.environ.get("BATCHLAB_REQUIRE_BROWSER") == "1"
MISSING = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
if MISSING and not REQUIRED:
    pytest.skip(f"{' and '.join(MISSING)} absent (apt-get install chromium chromium-driver); "
                "CI installs them and sets BATCHLAB_REQUIRE_BROWSER=1", allow_module_level=True)

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,2000"]

PAGE_STATE = """
return {
  images: Array.from(document.images).map(i => ({complete: i.complete, width: i.naturalWidth,
                                               src: i.src.slice(0, 22), alt: i.alt})),
  tables: document.querySelectorAll('table').length,
  rows: document.querySelectorAll('table tbody tr').length,
  headline: (document.querySelector('li strong') || {}).textContent || '',
  fetched: performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith('data:')),
};
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("html")
    cfg = load_user_config(None, ["traffic.rates=[5, 20]", "traffic.duration_s=12", "traffic.warmup_s=2", "report=false"])
    run_sweep(cfg, out)
    _, lines = build_report(out)
    return out / "report.html", lines


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    assert not MISSING, f"{MISSING} absent but BATCHLAB_REQUIRE_BROWSER=1"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # NOTE: an explicit driver path: Selenium Manager would otherwise try to download one.
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def load(driver, page: Path) -> tuple[dict, list[dict]]:
    """The page's state once loaded, and the console messages it logged (errors are SEVERE)."""
    driver.get(page.as_uri())
    state = driver.execute_script(PAGE_STATE)
    return state, driver.get_log("browser")


def test_report_html_renders_every_plot_and_table_without_console_errors(browser, report):
    page, lines = report
    md = page.with_suffix(".md").read_text()
    state, log = load(browser, page)
    linked = re.findall(r"!\[([^]]*)\]\(([^)]+\.png)\)", md)
    assert len(state["images"]) == len(linked) >= 8
    for img in state["images"]:
        assert img["complete"] and img["width"] > 0, img
        assert img["src"].startswith("data:image/png;base64")
    assert state["tables"] == md.count("\n|---") and state["rows"] > 0
    assert state["headline"] == lines[0]
    assert state["fetched"] == []                                    # nothing outside the file itself
    assert [e for e in log if e["level"] == "SEVERE"] == []


def test_the_checks_catch_a_broken_plot_and_a_console_error(browser, report, tmp_path):
    page, _ = report
    broken = tmp_path / "broken.html"
    text = re.sub(r'src="data:image/png;base64,[^"]+"', 'src="data:image/png;base64,AAAA"', page.read_text(), count=1)
    broken.write_text(text.replace("</body>", "<script>console.error('boom')</script></body>"))
    state, log = load(browser, broken)
    assert [img["width"] for img in state["images"]].count(0) == 1
    assert any("boom" in e["message"] for e in log if e["level"] == "SEVERE")
