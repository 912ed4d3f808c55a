"""The read commands on a live site: `dctwin status`, `headroom`, `hotspots`, `fleets` and
`forecast` against a running `dctwin serve` (--api and DCTWIN_API_URL), the store's lock
refused with a message that says --api, TSV that DuckDB reads with number columns as numbers,
and the same rows from --db once the service is gone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest

from collectors.mqtt import wait_until
from twin.broker import start_broker
from twin.service import Service

from .helpers import SMALL_SITE, TEST_BROKER

DCTWIN = [sys.executable, "-m", "twin.cli"]

pytestmark = [pytest.mark.slow, pytest.mark.mqtt]  # a service and a dozen CLI processes


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "DCTWIN_API_URL"}
    return subprocess.run(
        [*DCTWIN, *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**base, "COLUMNS": "200", **(env or {})},
    )


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory, start_service: Callable[..., Service]
) -> Iterator[dict]:
    """A store with 20 simulated minutes of the small site (a pump of cdu-1 failing at minute
    10), calibrated, with a headroom report; then `dctwin serve` on it, holding its lock."""
    tmp = tmp_path_factory.mktemp("live")
    db = tmp / "live.duckdb"
    start_service(db).stop()
    broker = start_broker(TEST_BROKER, log_path=tmp / "broker.log")  # type: ignore[arg-type]
    log = tmp / "serve.log"
    serve = subprocess.Popen(
        [
            *DCTWIN,
            "serve",
            "--broker",
            broker.address,
            "--db",
            str(db),
            "--site",
            str(SMALL_SITE),
            "--api-port",
            "0",
            "--calibrate-every",
            "0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env={**os.environ, **broker.client_env()},
    )
    try:
        assert wait_until(lambda: b"serving:" in log.read_bytes() or serve.poll() is not None, 60)
        m = re.search(r"api: (http://127\.0\.0\.1:\d+)", log.read_text())
        assert m is not None, log.read_text()
        out: dict = {"db": db, "url": m.group(1), "tmp": tmp}
        yield out
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
        broker.stop()


def types_of(text: str) -> dict[str, str]:
    """The column types DuckDB's CSV reader gives ``text`` read as a TSV file."""
    f = Path(os.environ.get("TMPDIR", "/tmp")) / f"dctwin-types-{os.getpid()}.tsv"
    f.write_text(text)
    try:
        rel = duckdb.sql(f"SELECT * FROM read_csv('{f}', delim='\t', header=true)")
        return {c: str(t) for c, t in zip(rel.columns, rel.types, strict=True)}
    finally:
        f.unlink()


def test_a_held_store_says_to_use_the_api(live: dict) -> None:
    r = run("status", "--db", str(live["db"]))
    assert r.returncode == 2, r.stdout
    assert "held by a running service" in r.stderr and "--api" in r.stderr
    assert "Traceback" not in r.stderr
    # --db wins over DCTWIN_API_URL: the file is what was asked for, and it says so
    r = run("status", "--db", str(live["db"]), env={"DCTWIN_API_URL": live["url"]})
    assert r.returncode == 2 and "held by a running service" in r.stderr
    r = run("headroom", "--db", str(live["db"]), "--site", str(SMALL_SITE))
    assert r.returncode == 2 and "--api" in r.stderr and "Traceback" not in r.stderr


def test_status_over_the_api_is_tsv_when_piped(live: dict) -> None:
    r = run("status", "--api", live["url"])
    assert r.returncode == 0, r.stderr
    types = types_of(r.stdout)
    assert types == {"section": "VARCHAR", "key": "VARCHAR", "count": "BIGINT"}, r.stdout
    rows = {tuple(ln.split("\t")[:2]): int(ln.split("\t")[2]) for ln in r.stdout.splitlines()[1:]}
    api = json.loads(run("status", "--api", live["url"], "--json").stdout)
    assert rows[("samples", "gpu")] == api["samples"]["gpu"] > 1000  # plain, no separator
    assert rows[("messages", "")] == api["messages"]
    table = run("status", "--api", live["url"], "--format", "table").stdout
    assert "samples per kind" in table and f"{api['samples']['gpu']:,}" in table


def test_headroom_from_dctwin_api_url_with_percent_rack_and_cdu(live: dict) -> None:
    env = {"DCTWIN_API_URL": live["url"]}
    r = run("headroom", env=env)
    assert r.returncode == 0, r.stderr
    types = types_of(r.stdout)
    for col in ("value_now", "limit", "headroom_now", "used_pct", "headroom_min_p90"):
        assert types[col] == "DOUBLE", (col, types)
    assert types["rack"] == "VARCHAR" and types["cdu"] == "VARCHAR"
    lines = r.stdout.splitlines()
    head = lines[0].split("\t")
    rows = [dict(zip(head, ln.split("\t"), strict=True)) for ln in lines[1:]]
    api = json.loads(run("headroom", "--api", live["url"], "--json").stdout)["rows"]
    assert len(rows) == len(api) > 30
    assert not any("," in r[c] for r in rows for c in ("value_now", "limit", "headroom_now"))
    # % of the limit: a PDU phase's current over its derated limit; a GPU's above 25 °C
    by_id = {(a["kind"], a["id"], a["quantity"]): a for a in api}
    phase = next(r for r in rows if r["kind"] == "pdu_phase")
    a = by_id[("pdu_phase", phase["id"], phase["quantity"])]
    assert float(phase["used_pct"]) == pytest.approx(100 * a["value_now"] / a["limit"], abs=0.05)
    gpu = next(r for r in rows if r["kind"] == "gpu")
    a = by_id[("gpu", gpu["id"], gpu["quantity"])]
    assert gpu["limit_unit"] == "°C" and gpu["unit"] == "K"
    want = 100 * (a["value_now"] - 25) / (a["limit"] - 25)
    assert float(gpu["used_pct"]) == pytest.approx(want, abs=0.05)
    # worst first: within each unit, the headroom grows (no row breaches in this store, so
    # the bands order the rows, then the headroom in the limit's unit)
    assert all(r["breach_in_s_p90"] == "" for r in rows)
    rank = {"red": 0, "amber": 1, "neutral": 2, "": 3}
    keys = [(rank[r["band"]], r["unit"], float(r["headroom_now"])) for r in rows]
    assert keys == sorted(keys)
    # --rack: every limit of rack r01 (its GPUs, the rack's power), nothing of another rack
    r01 = run("headroom", "--rack", "r01", "--format", "tsv", env=env)
    assert r01.returncode == 0, r01.stderr
    got = [dict(zip(head, ln.split("\t"), strict=True)) for ln in r01.stdout.splitlines()[1:]]
    assert got and {g["rack"] for g in got} == {"r01"}
    assert {g["kind"] for g in got} >= {"gpu", "rack"}
    assert {g["id"] for g in got} == {r["id"] for r in rows if r["rack"] == "r01"}
    gpus = run("headroom", "--cdu", "cdu-1", "--kind", "loop", env=env).stdout.splitlines()
    assert [ln.split("\t")[:4] for ln in gpus[1:]] == [["loop", "cdu-1", "", "cdu-1"]]
    bad = run("headroom", "--rack", "a99", env=env)
    assert bad.returncode == 2 and "no rack 'a99'" in bad.stderr and "Traceback" not in bad.stderr
    table = run("headroom", "--api", live["url"], "--format", "table", "--limit", "5")
    assert "used %" in table.stdout and "limit unit" in table.stdout


def test_hotspots_fleets_forecast_over_the_api(live: dict) -> None:
    url = live["url"]
    hs = run("hotspots", "--api", url, "--format", "tsv")
    assert hs.returncode == 0, hs.stderr
    head = hs.stdout.splitlines()[0].split("\t")
    assert head[:8] == ["kind", "id", "rack", "reason", "value", "reference", "excess", "unit"]
    assert "sigma_k" in head and "sigmas" in head
    fl = run("fleets", "--api", url)
    assert fl.returncode == 0, fl.stderr
    types = types_of(fl.stdout)
    assert types["gpus"] == "BIGINT" and types["gpus_reporting"] == "BIGINT", types
    assert types["activity_mean"] == "DOUBLE" and types["activity_p95"] == "DOUBLE", types
    # 20 minutes of data is too little to judge a fleet on; a count is plain or empty
    rows = [ln.split("\t") for ln in fl.stdout.splitlines()]
    at = rows[0].index("gpus_to_reclaim")
    assert all(r[at] == "" or r[at].isdigit() for r in rows[1:]) and "not judged" in fl.stdout
    api = json.loads(run("fleets", "--api", url, "--json").stdout)
    assert len(fl.stdout.splitlines()) == len(api["fleets"]) + 1
    fc = run("forecast", "--api", url)
    assert fc.returncode == 0, fc.stderr
    lines = fc.stdout.splitlines()
    whole = json.loads(run("forecast", "--api", url, "--json").stdout)
    assert len(lines) == len(whole["entities"]) + 1 < 20  # a row per fleet and rack, not JSON
    types = types_of(fc.stdout)
    assert types["p95_peak_kw"] == "DOUBLE" and types["last_kw"] == "DOUBLE", types
    assert "Traceback" not in run("forecast", "--api", url, "--backtest").stderr


def test_the_same_rows_from_the_store_file(live: dict) -> None:
    """A copy of the file (the service holds the original) read with --db gives the same
    status figures and the same headroom, hot-spot and fleet rows and columns."""
    import shutil

    copy = live["tmp"] / "copy.duckdb"
    shutil.copy(live["db"], copy)  # DuckDB's lock is advisory: the copy opens
    url, db = live["url"], str(copy)
    a = run("status", "--api", url).stdout.splitlines()[1:]
    b = run("status", "--db", db).stdout.splitlines()[1:]
    assert a and a == b
    site = ("--site", str(SMALL_SITE))
    a = run("headroom", "--api", url).stdout.splitlines()
    b = run("headroom", "--db", db, *site).stdout.splitlines()
    assert a[0] == b[0]
    assert sorted(ln.split("\t")[:5] for ln in a[1:]) == sorted(ln.split("\t")[:5] for ln in b[1:])
    for cmd in ("fleets", "forecast"):
        a = run(cmd, "--api", url).stdout.splitlines()
        b = run(cmd, "--db", db, *site).stdout.splitlines()
        assert a[0] == b[0] and len(a) == len(b), (cmd, a, b)
        assert [ln.split("\t")[:2] for ln in a] == [ln.split("\t")[:2] for ln in b]
