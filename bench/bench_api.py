"""Benchmark the HTTP API and the console on synthetic stores written directly (no MQTT).

1. Series: a store of 1,000 GPUs x 1 h at 1 s (3.6 M rows); ``GET /api/v1/series`` of
   ``temp_c`` for all 1,000 GPU ids over that hour as Arrow IPC (raw resolution), decoded
   with pyarrow on the client. Target: <= 500 ms.
2. Overview: a store of 10,000 GPUs (1,250 nodes, 313 racks, 626 PDUs, 8 CDUs) with 10 min of
   1 s GPU, node, PDU and CDU samples (6 M GPU rows) and 1,440 stored headroom reports (the
   service's default keep, ~18 M rows); ``GET /api/v1/overview`` and the console's Overview
   page rendered by Streamlit's AppTest (script run including its API calls), and, where
   Debian's chromium is installed, in a real headless browser. Target: <= 2 s.

Usage: ``python bench/bench_api.py [--out bench/results/api.json] [--reports 1440]``
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.ipc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from collectors.contract import cdu_sample_ids, sub_id  # noqa: E402
from twin.api import ARROW_STREAM  # noqa: E402
from twin.service import Service, ServiceConfig  # noqa: E402
from twin.site import Site  # noqa: E402
from twin.site.index import index_site  # noqa: E402
from twin.store import Store  # noqa: E402
from twin.store.schema import HEADROOM_SCHEMA, arrow_schema  # noqa: E402

NOW = datetime.now(UTC).replace(microsecond=0)


def synthetic_site(n_gpus: int) -> Site:
    """Racks of 4 HGX-H200-8-DLC nodes, 8 racks per row, 40 racks per CDU."""
    n_nodes = n_gpus // 8
    racks, pdus, cdus = [], [], []
    for r in range((n_nodes + 3) // 4):
        name = f"r{r:04d}"
        cdu = f"cdu-{r // 40 + 1}"
        if not cdus or cdus[-1]["name"] != cdu:
            cdus.append({"name": cdu, "model": "ROW-CDU-1500"})
        for feed in ("a", "b"):
            pdus.append(
                {
                    "name": f"pdu-{name}-{feed}",
                    "feed": feed.upper(),
                    "voltage_v": 415,
                    "rated_current_a": 60,
                    "breakers": [
                        {"name": f"cb{i}", "phase": f"L{i}", "rated_current_a": 60}
                        for i in (1, 2, 3)
                    ],
                }
            )
        nodes = [
            {"name": f"n{r:04d}-{k}", "model": "HGX-H200-8-DLC", "phase": f"L{k % 3 + 1}"}
            for k in range(4)
            if r * 4 + k < n_nodes
        ]
        racks.append(
            {
                "name": name,
                "grid": [r % 8, r // 8],
                "pdus": [f"pdu-{name}-a", f"pdu-{name}-b"],
                "cdu": cdu,
                "nodes": nodes,
            }
        )
    rows = [
        {"name": f"row-{i:02d}", "racks": racks[i * 8 : (i + 1) * 8]}
        for i in range((len(racks) + 7) // 8)
    ]
    return Site.model_validate(
        {
            "name": "bench",
            "halls": [{"name": "hall-1", "rows": rows}],
            "pdus": pdus,
            "cdus": cdus,
            "fleets": [
                {"name": "train", "role": "training", "members": [r["name"] for r in racks]}
            ],
        }
    )


def kind_table(kind: str, ids: list[str], seconds: int, values: dict[str, np.ndarray]) -> pa.Table:
    """Rows for every id at every second up to NOW; quantities not given are null."""
    n_ids = len(ids)
    n = n_ids * seconds
    t0 = int((NOW - timedelta(seconds=seconds - 1)).timestamp() * 1e6)
    ts = np.repeat(t0 + np.arange(seconds, dtype=np.int64) * 1_000_000, n_ids)
    id_arr = pa.array(np.tile(np.array(ids, dtype=object), seconds), pa.string())
    cols = {
        "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        "source": id_arr,
        "id": id_arr,
    }
    schema = arrow_schema(kind)
    for f in schema:
        if f.name in cols:
            continue
        cols[f.name] = pa.array(values[f.name], f.type) if f.name in values else pa.nulls(n, f.type)
    return pa.table(cols, schema=schema)


def rng_vals(n: int, lo: float, hi: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, n).round(2)


def build_series_store(path: Path, site: Site, seconds: int = 3600) -> list[str]:
    ids = index_site(site).gpu_ids
    n_gpus = len(ids)
    n = n_gpus * seconds
    with Store(path) as store:
        t = kind_table(
            "gpu",
            ids,
            seconds,
            {
                "temp_c": rng_vals(n, 40, 80, 1),
                "power_w": rng_vals(n, 100, 700, 2),
                "util_pct": rng_vals(n, 0, 100, 3),
            },
        )
        store.insert_arrow("gpu", t)
    return ids


def build_overview_store(path: Path, site: Site, seconds: int, reports: int) -> None:
    idx = index_site(site)
    gpu_ids, node_ids = idx.gpu_ids, idx.node_names
    pdu_ids = [p.name for p in site.pdus] + [
        sub_id(p.name, x) for p in site.pdus for x in ("L1", "L2", "L3", "cb1", "cb2", "cb3")
    ]
    cdu_ids = [i for c in site.cdus for i in cdu_sample_ids(c.name, c.pumps)]
    with Store(path) as store:
        ng = len(gpu_ids) * seconds
        store.insert_arrow(
            "gpu",
            kind_table(
                "gpu",
                gpu_ids,
                seconds,
                {
                    "temp_c": rng_vals(ng, 40, 80, 1),
                    "power_w": rng_vals(ng, 100, 700, 2),
                    "util_pct": rng_vals(ng, 0, 100, 3),
                    "sm_active": rng_vals(ng, 0, 1, 4),
                },
            ),
        )
        nn = len(node_ids) * seconds
        store.insert_arrow(
            "node",
            kind_table(
                "node",
                node_ids,
                seconds,
                {"power_w": rng_vals(nn, 3000, 8000, 5), "inlet_temp_c": rng_vals(nn, 20, 27, 6)},
            ),
        )
        npd = len(pdu_ids) * seconds
        store.insert_arrow(
            "pdu",
            kind_table(
                "pdu",
                pdu_ids,
                seconds,
                {"current_a": rng_vals(npd, 5, 40, 7), "power_w": rng_vals(npd, 1e3, 2e4, 8)},
            ),
        )
        nc = len(cdu_ids) * seconds
        store.insert_arrow(
            "cdu",
            kind_table(
                "cdu",
                cdu_ids,
                seconds,
                {
                    "heat_kw": rng_vals(nc, 100, 300, 9),
                    "supply_temp_c": rng_vals(nc, 30, 33, 10),
                    "pump_speed_pct": rng_vals(nc, 60, 80, 11),
                },
            ),
        )
        # headroom reports: one row per GPU, phase, rack, CDU, loop; `reports` of them
        kinds = (
            [("gpu", g, "temp_c", "K", 87.0) for g in gpu_ids]
            + [("pdu_phase", p, "current_a", "A", 48.0) for p in pdu_ids if "/" in p]
            + [("rack", r.name, "power_kw", "kW", 40.0) for r in site.racks]
            + [("cdu", c.name, "heat_kw", "kW", 1500.0) for c in site.cdus]
            + [("loop", c.name, "return_temp_c", "K", 50.0) for c in site.cdus]
        )
        k = len(kinds)
        for i in range(reports):
            at = NOW - timedelta(minutes=reports - 1 - i)
            h = np.random.default_rng(100 + i).uniform(1, 30, k)
            cols = {
                "computed_at": pa.array([at] * k, pa.timestamp("us", tz="UTC")),
                "data_until": pa.array([at] * k, pa.timestamp("us", tz="UTC")),
                "kind": [x[0] for x in kinds],
                "id": [x[1] for x in kinds],
                "quantity": [x[2] for x in kinds],
                "unit": [x[3] for x in kinds],
                "limit_value": [x[4] for x in kinds],
                "value_now": [x[4] for x in kinds] - h,
                "headroom_now": h,
                "headroom_min_p50": h * 0.9,
                "headroom_min_p90": h * 0.8,
                "breach_in_s_p50": pa.nulls(k, pa.float64()),
                "breach_in_s_p90": pa.nulls(k, pa.float64()),
                "rack": pa.nulls(k, pa.string()),
                "cdu": pa.nulls(k, pa.string()),
                "basis": ["persistence"] * k,
            }
            store.insert_arrow("headroom", pa.table(cols, schema=HEADROOM_SCHEMA))


def api_service(db: Path, site: Site) -> Service:
    """The twin service on the store ``db``, as `dctwin serve --site` runs it, with only its
    API started (no broker, no calibration or detection loop: the benchmark measures reads)."""
    config = ServiceConfig(db=db, site=site, calibrate_every_s=0, detect_every_s=0, api_port=0)
    return Service(config).start()


def timed(fn, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def summary(xs: list[float]) -> dict[str, float]:
    return {
        "median_s": round(statistics.median(xs), 3),
        "min_s": round(min(xs), 3),
        "max_s": round(max(xs), 3),
        "runs": len(xs),
    }


def bench_series(tmp: Path) -> dict:
    db = tmp / "series.duckdb"
    site = synthetic_site(1000)  # as `dctwin serve --site`: ids are checked against the site
    t = time.perf_counter()
    ids = build_series_store(db, site)
    built = time.perf_counter() - t
    server = api_service(db, site)
    try:
        end = NOW + timedelta(seconds=1)
        params = {
            "kind": "gpu",
            "quantity": "temp_c",
            "ids": ",".join(ids),
            "start": (end - timedelta(hours=1)).isoformat(),
            "end": end.isoformat(),
        }
        rows = {}

        def call() -> None:
            r = httpx.get(
                f"{server.url}/api/v1/series",
                params=params,
                headers={"Accept": ARROW_STREAM},
                timeout=60,
            )
            r.raise_for_status()
            table = pa.ipc.open_stream(io.BytesIO(r.content)).read_all()
            rows["n"] = table.num_rows
            rows["bytes"] = len(r.content)

        call()  # warm up
        times = timed(call, 7)
        js = httpx.get(f"{server.url}/api/v1/series", params=params, timeout=60)
    finally:
        server.stop()
    return {
        "store_rows": len(ids) * 3600,
        "store_build_s": round(built, 1),
        "rows_returned": rows["n"],
        "arrow_bytes": rows["bytes"],
        "arrow": summary(times),
        "json_status": js.status_code,
        "json_detail": js.json().get("detail") if js.status_code != 200 else None,
        "target_s": 0.5,
        "met": statistics.median(times) <= 0.5,
    }


def bench_overview(tmp: Path, reports: int) -> dict:
    from streamlit.testing.v1 import AppTest

    db = tmp / "overview.duckdb"
    site = synthetic_site(10_000)
    t = time.perf_counter()
    build_overview_store(db, site, seconds=600, reports=reports)
    built = time.perf_counter() - t
    server = api_service(db, site)
    out: dict = {
        "gpus": 10_000,
        "racks": len(site.racks),
        "store_build_s": round(built, 1),
        "headroom_reports": reports,
    }
    try:
        api = timed(lambda: httpx.get(f"{server.url}/api/v1/overview", timeout=60), 5)
        out["api_overview"] = summary(api)
        racks = timed(lambda: httpx.get(f"{server.url}/api/v1/racks", timeout=60), 3)
        out["api_racks"] = summary(racks)
        os.environ["DCTWIN_API_URL"] = server.url
        page = REPO / "dashboards" / "pages" / "overview.py"

        def render() -> None:
            at = AppTest.from_file(str(page), default_timeout=60)
            at.run()
            assert not at.exception and not at.error, (at.exception, at.error)

        render()  # warm up: imports plotly, pandas
        out["apptest_overview"] = summary(timed(render, 5))
        out["browser_overview"] = bench_browser(server.url)
    finally:
        server.stop()
    med = out["apptest_overview"]["median_s"]
    b = out["browser_overview"]
    out["target_s"] = 2.0
    out["met"] = med <= 2.0 and (not isinstance(b, dict) or b["median_s"] <= 2.0)
    return out


def bench_browser(api_url: str) -> dict | str:
    """Overview page in headless chromium: navigation until the page's metrics and chart are
    drawn and Streamlit's script run has finished."""
    chromium = shutil.which("chromium")
    if chromium is None:
        return "skipped: no chromium"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "skipped: no playwright"
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DCTWIN_API_URL": api_url, "DCTWIN_CONSOLE_REFRESH_S": "600"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(REPO / "dashboards" / "app.py"),
            "--server.headless",
            "true",
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--browser.gatherUsageStats",
            "false",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{url}_stcore/health", timeout=1).text == "ok":
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            times = []
            for i in range(6):
                pg = b.new_page(viewport={"width": 1440, "height": 1000})
                t = time.perf_counter()
                pg.goto(url)
                pg.get_by_text("Closest to their limits").wait_for(timeout=60_000)
                pg.get_by_text("cdu_pump_lost").or_(pg.get_by_text("No active alerts")).or_(
                    pg.get_by_text("Alerting is off")
                ).first.wait_for(timeout=60_000)
                pg.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=60_000)
                pg.locator('[data-testid="stTable"]').nth(1).wait_for(timeout=60_000)
                pg.wait_for_function(
                    "() => { const w = document.querySelector('[data-testid=\"stStatusWidget\"]');"
                    " return !w || !w.innerText.includes('Running'); }",
                    timeout=60_000,
                )
                if i:  # the first load warms the server's imports
                    times.append(time.perf_counter() - t)
                pg.close()
            base = []  # the What-if page (one API call, no chart): Streamlit's own boot
            for i in range(4):
                pg = b.new_page(viewport={"width": 1440, "height": 1000})
                t = time.perf_counter()
                pg.goto(f"{url}whatif")
                pg.get_by_text("offers no what-if jobs").wait_for(timeout=60_000)
                if i:
                    base.append(time.perf_counter() - t)
                pg.close()
            b.close()
        return {**summary(times), "baseline_whatif_page": summary(base)}
    finally:
        proc.terminate()
        proc.wait(15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "api.json")
    ap.add_argument("--reports", type=int, default=1440, help="headroom reports kept")
    ap.add_argument("--only", choices=["series", "overview"], default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        result: dict = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python"
            f" {platform.python_version()}",
            "when": NOW.isoformat(),
        }
        if args.only in (None, "series"):
            result["series_1000_gpus_1h"] = bench_series(tmp)
        if args.only in (None, "overview"):
            result["overview_10000_gpus"] = bench_overview(tmp, args.reports)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
