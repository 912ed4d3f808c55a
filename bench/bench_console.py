"""Benchmark every console page in headless Chromium: navigation to its last chart drawn.

Starts everything itself: the demo site (``sample_telemetry/demo_site.yaml``) simulated for
``--minutes`` minutes with cdu-1's pump failing halfway, fed through a twin service's ingest,
calibrated and passed through two detection passes with ``deploy/alert_rules.yaml`` (so the
critical ``cdu_pump_lost`` fires), the service's API on a free port; then the console as
``dctwin console`` starts it (``streamlit run dashboards/app.py`` with
``twin.cli.demo.CONSOLE_STREAMLIT_OPTIONS``) and Debian's
``chromium`` through Playwright (never a downloaded browser), one at a time.

Each page is opened ``--runs`` times, each in a fresh browser context (a new Streamlit session,
as an operator opening the page), after one warm-up opening that is not counted. A page's load
time is :func:`harness.pageload.load_s`: from the navigation's start to the last change drawn
in the page's main area. Beside it: when the HTML's DOMContentLoaded fired (the frontend's
bundle), when the page's title appeared (the websocket session is up and the script started),
the JavaScript fetched (count, kB), and every API call the page's script made, timed by the
console's client (``DCTWIN_CONSOLE_API_TIMINGS``). An empty Streamlit page (a title only) is
timed the same way: the floor under which no page of ours can go, once with Streamlit's
defaults (headless) and once with the console's options.

Target (issue 15): every page <= 1.5 s median.

Usage: ``python bench/bench_console.py [--runs 5] [--minutes 20] [--pages overview ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import pageload  # noqa: E402
from twin.calibrate.calibrate import calibrate, save_run  # noqa: E402
from twin.cli.demo import CONSOLE_STREAMLIT_OPTIONS  # noqa: E402
from twin.service import Service, ServiceConfig  # noqa: E402
from twin.simulator import SiteSimulator, parse_fault  # noqa: E402
from twin.site import load_site  # noqa: E402

PAGES = {
    "overview": "",
    "floor": "floor",
    "rack": "rack?rack=a01",
    "power": "power",
    "cooling": "cooling",
    "network": "network",
    "fleets": "fleets",
    "alerts": "alerts",
    "calibration": "calibration",
    "whatif": "whatif",
}
EMPTY_PAGE = 'import streamlit as st\n\nst.set_page_config(layout="wide")\nst.title("Empty")\n'
#: Streamlit's defaults but headless (the empty page under these against the console's options).
BARE_OPTIONS = ("--server.headless", "true", "--browser.gatherUsageStats", "false")
TARGET_S = 1.5  # issue 15


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(db: Path, minutes: int) -> Service:
    """The demo site, ``minutes`` simulated minutes ending now, a pump lost halfway."""
    site = load_site(REPO / "sample_telemetry" / "demo_site.yaml")
    service = Service(
        ServiceConfig(
            db=db,
            site=site,
            max_past_s=0,
            calibrate_every_s=0,
            detect_every_s=3600.0,
            rules=REPO / "deploy" / "alert_rules.yaml",
            api_port=0,
            whatif_bundles=REPO / "sample_telemetry",
            whatif_scenarios=REPO / "sample_telemetry" / "scenarios",
        )
    )
    start = (datetime.now(UTC) - timedelta(minutes=minutes)).replace(microsecond=0)
    fault = parse_fault(f"pump_failure:cdu-1/pump1@{minutes // 2}m")
    sim = SiteSimulator(site, seed=3, start=start, faults=[fault])
    for _ in range(minutes):
        batch: list[tuple[str, bytes]] = []
        for _ in range(60):
            batch.extend(sim.step())
        service.ingester.ingest(batch)
    service.store.rollup()
    save_run(service.store, calibrate(service.store, site, window_s=minutes * 60.0, holdout_s=300))
    assert service.detector is not None
    service.detector.run_once()
    service.detector.run_once()
    return service.start()


@contextmanager
def streamlit(
    script: Path, api_url: str, timings: Path, options: tuple[str, ...] = CONSOLE_STREAMLIT_OPTIONS
) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "DCTWIN_API_URL": api_url,
        "DCTWIN_CONSOLE_REFRESH_S": "600",  # no refresh during a measurement
        "DCTWIN_CONSOLE_API_TIMINGS": str(timings),
    }
    env.pop("DCTWIN_API_TOKEN", None)
    cmd = [sys.executable, "-m", "streamlit", "run", str(script)]
    cmd += [*options, "--server.address", "127.0.0.1", "--server.port", str(port)]
    cmd += ["--logger.level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=2).text == "ok":
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"streamlit did not start ({script})")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


DETAIL = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const js = performance.getEntriesByType('resource').filter(r => r.name.endsWith('.js'));
  return {dom_content_loaded_s: nav.domContentLoadedEventEnd / 1000,
          js_files: js.length,
          js_kb: js.reduce((a, r) => a + (r.decodedBodySize || 0), 0) / 1024,
          plotly_kb: js.filter(r => /plotly/i.test(r.name))
                       .reduce((a, r) => a + (r.decodedBodySize || 0), 0) / 1024};
}"""


def time_page(browser, url: str, runs: int, timings: Path) -> dict:  # type: ignore[no-untyped-def]
    loads, details, calls = [], [], defaultdict(list)
    for i in range(runs + 1):
        ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
        ctx.add_init_script(
            "new MutationObserver(() => { if (!window.__h1 &&"
            " document.querySelector('[data-testid=\"stMain\"] h1'))"
            " window.__h1 = performance.now(); })"
            ".observe(document, {subtree: true, childList: true});"
        )
        pageload.install(ctx)
        pg = ctx.new_page()
        timings.write_text("")
        load = pageload.load_s(pg, url)
        d = pg.evaluate(DETAIL)
        d["title_s"] = pg.evaluate("window.__h1 || 0") / 1000
        made = [json.loads(x) for x in timings.read_text().splitlines() if x.strip()]
        ctx.close()
        if i == 0:
            continue  # the warm-up: the server's first imports of the page's modules
        loads.append(load)
        details.append(d)
        for c in made:
            calls[c["path"]].append(c["s"])
    med = {k: round(statistics.median(d[k] for d in details), 3) for k in details[0]}
    return {
        "median_s": round(statistics.median(loads), 3),
        "min_s": round(min(loads), 3),
        "max_s": round(max(loads), 3),
        "runs_s": [round(x, 3) for x in loads],
        **med,
        "api_calls": {
            p: {"n_per_load": len(v) / runs, "median_s": round(statistics.median(v), 4)}
            for p, v in sorted(calls.items())
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="timed openings per page (default 5)")
    ap.add_argument("--minutes", type=int, default=20, help="simulated minutes (default 20)")
    ap.add_argument("--pages", nargs="*", default=list(PAGES), help="pages (default: all)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "console.json")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-console-"))
    t0 = time.perf_counter()
    svc = start_service(tmp / "console.duckdb", args.minutes)
    print(f"service with {args.minutes} simulated minutes: {time.perf_counter() - t0:.1f} s")
    result: dict = {"pages": {}}
    timings = tmp / "api_calls.jsonl"
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(
                executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"]
            )
            empty = tmp / "empty.py"
            empty.write_text(EMPTY_PAGE)
            with streamlit(empty, svc.url, timings, BARE_OPTIONS) as url:
                result["empty_page_streamlit_defaults"] = time_page(b, url, args.runs, timings)
                r = result["empty_page_streamlit_defaults"]
                print(f"{'empty page (Streamlit defaults)':12s} {r['median_s']:.2f} s")
            with streamlit(empty, svc.url, timings) as url:
                result["empty_page"] = time_page(b, url, args.runs, timings)
                print(f"{'empty page':12s} {result['empty_page']['median_s']:.2f} s")
            with streamlit(REPO / "dashboards" / "app.py", svc.url, timings) as url:
                for name in args.pages:
                    r = time_page(b, f"{url}/{PAGES[name]}", args.runs, timings)
                    result["pages"][name] = r
                    calls = ", ".join(
                        f"{k} {v['median_s'] * 1000:.0f} ms" for k, v in r["api_calls"].items()
                    )
                    print(
                        f"{name:12s} {r['median_s']:.2f} s ({r['min_s']:.2f}-{r['max_s']:.2f})"
                        f" title {r['title_s']:.2f} s, DOMContentLoaded"
                        f" {r['dom_content_loaded_s']:.2f} s, JS {r['js_kb']:.0f} kB; {calls}"
                    )
            b.close()
    finally:
        svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    result["machine"] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_at_start": [round(x, 2) for x in load_start],
        "load_at_end": [round(x, 2) for x in os.getloadavg()],
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    meds = [r["median_s"] for r in result["pages"].values()]
    result["target_s"] = TARGET_S
    result["met"] = bool(meds) and max(meds) <= TARGET_S
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"worst page median {max(meds):.2f} s (target {TARGET_S} s); load {load_start[0]:.1f}")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
