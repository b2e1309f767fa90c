"""A report opened in a real headless Chromium (selenium, Debian's ``chromium`` and
``chromium-driver``), read through Bokeh's own views: which tabs it has, what the shown tab
draws (figures with data, tables with rows, texts), the console's errors. Shared by the
browser test, ``media/make_screenshots.py`` and ``benchmarks/report_scale.py``."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

#: what the shown tab holds, read from Bokeh's views: a figure or a table counts when it
#: is laid out (has a size) and holds data
PANEL_JS = """
const tabs = [...Bokeh.index.all_views()].find(v => v.model.type == 'Tabs');
const panel = tabs.child_views[tabs.model.active];
const views = [], stack = [panel];
while (stack.length) {
  const v = stack.pop(); views.push(v);
  for (const c of [...(v.child_views ?? [])].reverse()) stack.push(c);
}
const shown = v => { const r = v.el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
const out = {plots: [], tables: [], texts: [], code: 0};
for (const v of views) {
  const m = v.model;
  if (m.type == 'Figure' && shown(v)) {
    const n = m.renderers.reduce(
      (s, r) => s + (r.data_source ? r.data_source.get_length() ?? 0 : 0), 0);
    out.plots.push({title: m.title ? m.title.text : '', glyphs: n});
  } else if (m.type == 'DataTable' && shown(v)) {
    const d = m.source.data, cols = m.columns.map(c => [c.title, c.field]);
    const n = m.source.get_length() ?? 0, rows = [];
    for (let i = 0; i < Math.min(n, 200); i++)
      rows.push(cols.map(([t, f]) => String(d.get ? d.get(f)[i] : d[f][i])));
    out.tables.push({columns: cols.map(c => c[0]), rows: rows, n: n});
  } else if (m.type == 'Div' && shown(v)) {
    const div = document.createElement('div'); div.innerHTML = m.text;
    out.texts.push(div.textContent);
    out.code += div.querySelectorAll('pre').length;
    for (const t of div.querySelectorAll('table')) {  // a small table written as HTML
      const trs = [...t.querySelectorAll('tr')];
      const cells = tr => [...tr.querySelectorAll('th, td')].map(c => c.textContent);
      const rows = trs.filter(tr => tr.querySelector('td')).map(cells);
      const head = trs.find(tr => tr.querySelector('th'));
      out.tables.push({columns: head ? cells(head) : [], rows: rows, n: rows.length});
    }
  }
}
return out;
"""

TABS_JS = """
const tabs = [...Bokeh.index.all_views()].find(v => v.model.type == 'Tabs');
return [...tabs.shadow_el.querySelectorAll('.bk-tab')];
"""


def available() -> str | None:
    """Why no browser can run here (None: it can)."""
    for name in ("chromium", "chromedriver"):
        if shutil.which(name) is None:
            return f"no {name} on PATH (apt-get install -y chromium chromium-driver)"
    return None


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium driven by selenium, its console kept (``goog:loggingPrefs``)."""
    options = Options()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or ""
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def load(driver: Any, path: str | os.PathLike[str], timeout: float = 120.0) -> float:
    """Open the report and wait until Bokeh has built and drawn it (its document idle);
    returns the seconds that took."""
    started = time.perf_counter()
    driver.set_page_load_timeout(timeout)
    driver.get("file://" + os.path.abspath(path))
    while time.perf_counter() - started < timeout:
        if driver.execute_script(
            "return typeof Bokeh != 'undefined' && Bokeh.documents.length > 0 "
            "&& Bokeh.documents[0].is_idle"
        ):
            return time.perf_counter() - started
        time.sleep(0.05)
    raise TimeoutError(f"the report {path} was not drawn within {timeout} s")


def tabs(driver: Any) -> list[Any]:
    """The tab headers (elements in the Tabs' shadow DOM, clickable)."""
    return list(driver.execute_script(TABS_JS))


def show_tab(driver: Any, index: int, settle: float = 0.3) -> dict[str, Any]:
    """Click the ``index``-th tab header and return what the shown tab holds: ``plots``
    (title, glyphs), ``tables`` (columns, rows as text, n), ``texts`` and ``code`` (how many
    blocks of code)."""
    tabs(driver)[index].click()
    time.sleep(settle)
    return dict(driver.execute_script(PANEL_JS))


def console_errors(driver: Any) -> list[str]:
    """The console's errors since the last call (level SEVERE: exceptions, failed loads)."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
