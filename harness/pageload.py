"""How long a console page takes to draw in a real browser (Playwright), one definition shared by
tests/test_browser.py and bench/bench_console.py.

A page's load time is from the navigation's start (``performance.timeOrigin``) to the last
change drawn in the page's main area (Streamlit's ``stMain``: a chart's SVG or canvas, a table,
a metric), once Streamlit's script has finished (``data-test-script-state`` of its app root
is ``notRunning``), no placeholder (``stSkeleton``, shown while an element's code loads) is
left and nothing has changed there for :data:`QUIET_MS`. The header's
status widget and toolbar are not counted. The console itself never imports this module (nor
Playwright).
"""

from __future__ import annotations

import time
from typing import Any

#: The main area counts as drawn once nothing in it has changed for this long [ms].
QUIET_MS = 1500

#: Installed before any page script: records when the main area last changed.
INIT_SCRIPT = """
window.__dctwinLastDraw = 0;
new MutationObserver((muts) => {
  for (const m of muts) {
    const el = m.target.nodeType === 1 ? m.target : m.target.parentElement;
    if (el && el.closest('[data-testid="stMain"]')) {
      window.__dctwinLastDraw = performance.now();
      return;
    }
  }
}).observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
"""

_DONE = """(quiet) => {
  // the script run has ended (Streamlit's own flag on its app root; its status widget shows
  // "Running" only after a delay, so a slow API call can pass for a finished page)
  const app = document.querySelector('[data-testid="stApp"]');
  if (app && app.dataset.testScriptState !== 'notRunning') return false;
  const w = document.querySelector('[data-testid="stStatusWidget"]');
  if (w && w.innerText.includes('Running')) return false;
  const main = document.querySelector('[data-testid="stMain"]');
  if (!main || !main.querySelector('h1')) return false;
  if (main.querySelector('[data-testid="stSkeleton"]')) return false;  // a chunk still loading
  return window.__dctwinLastDraw > 0 && performance.now() - window.__dctwinLastDraw > quiet;
}"""


def install(context: Any) -> None:
    """Add the draw recorder to a Playwright browser context (before its first page opens)."""
    context.add_init_script(INIT_SCRIPT)


def load_s(page: Any, url: str, timeout_s: float = 90.0) -> float:
    """Open ``url`` in ``page`` (of a context passed to :func:`install`) and return seconds from
    navigation to the last change drawn in the main area."""
    page.goto(url)
    page.wait_for_function(_DONE, arg=QUIET_MS, timeout=timeout_s * 1000, polling=100)
    return float(page.evaluate("window.__dctwinLastDraw")) / 1000.0


def wait_drawn(page: Any, timeout_s: float = 90.0) -> float:
    """After an interaction (a click, a rerun): wait until the main area is quiet again; the
    seconds since navigation of its last change."""
    time.sleep(0.2)
    page.wait_for_function(_DONE, arg=QUIET_MS, timeout=timeout_s * 1000, polling=100)
    return float(page.evaluate("window.__dctwinLastDraw")) / 1000.0
