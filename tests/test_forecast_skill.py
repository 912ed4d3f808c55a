"""Forecasts that earn their place (issue 29, items 1-3), on the real 25-CDU day read from
../shared/reference/real_traces: each entity's model chosen by its skill against persistence
on its own history, honest origin counts, intervals never below zero with their basis and
checked coverage, and `dctwin forecast --now` for a past origin."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest
import yaml

from models import forecast as fc
from twin.forecast import forecast_site
from twin.site import Site
from twin.store import Store
from twin.store.schema import arrow_schema

from .helpers import REPO

FRONTIER = (
    REPO.parent
    / "shared"
    / "reference"
    / "real_traces"
    / "frontier_25cdu_power_oa_wetbulb_15s_24h.csv"
)
pytestmark = pytest.mark.skipif(
    not FRONTIER.is_file(), reason=f"the shared real trace {FRONTIER} is not here"
)


START = datetime(2024, 4, 7, tzinfo=UTC)  # the day the source file is named after
N_CH = 25


def _site_dict() -> dict:
    """25 racks of one node each (node ``cdu-NN`` carries channel NN) and a training fleet of
    all of them, as bench/bench_forecast_frontier.py builds it."""
    racks = [
        {
            "name": f"r{k:02d}",
            "grid": [k - 1, 0],
            "pdus": [f"pdu-r{k:02d}"],
            "nodes": [{"name": f"cdu-{k:02d}", "model": "HGX-H100-8"}],
        }
        for k in range(1, N_CH + 1)
    ]
    pdus = [
        {"name": f"pdu-r{k:02d}", "feed": "A", "phases": 3, "wiring": "wye", "voltage_v": 415,
         "rated_current_a": 32}
        for k in range(1, N_CH + 1)
    ]  # fmt: skip
    return {
        "name": "frontier",
        "halls": [{"name": "hall-1", "rows": [{"name": "row-a", "racks": racks}]}],
        "pdus": pdus,
        "fleets": [{"name": "all", "role": "training", "members": [r["name"] for r in racks]}],
    }


def _load(store: Store) -> None:
    """The recording as node power, 15 s apart from START."""
    raw = np.loadtxt(FRONTIER, delimiter=",", skiprows=1)
    t_s, p_w = raw[:, 0], raw[:, 1 : N_CH + 1]
    n_t = len(t_s)
    ts = np.repeat((START.timestamp() + t_s) * 1e6, N_CH).astype("int64")
    ids = np.tile([f"cdu-{k:02d}" for k in range(1, N_CH + 1)], n_t)
    schema = arrow_schema("node")
    cols = {
        "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        "source": pa.array(ids),
        "id": pa.array(ids),
        "power_w": pa.array(p_w.reshape(-1)),
    }
    for f in schema:
        if f.name not in cols:
            cols[f.name] = pa.nulls(n_t * N_CH, type=f.type)
    store.insert_arrow("node", pa.table(cols, schema=schema))


@pytest.fixture(scope="module")
def frontier(tmp_path_factory):
    d = tmp_path_factory.mktemp("frontier")
    db = d / "frontier.duckdb"
    site_file = d / "frontier.yaml"
    site_file.write_text(yaml.safe_dump(_site_dict()))
    with Store(db) as store:
        _load(store)
    return db, site_file


def test_origins_counted_are_origins_with_data(frontier):
    """18 h of data in a 14-day window: the scoring origins are those with data before and
    after them, not the window's grid rows (issue: 16 claimed, 2-3 real)."""
    db, _ = frontier
    site = Site.model_validate(_site_dict())
    with Store(db, read_only=True) as store:
        for hours, expect in ((18, 8), (12, 4)):
            f = forecast_site(store, site, now=START + timedelta(hours=hours))
            # independent count: origins every quarter horizon (18 steps of 300 s) from the
            # first row with data, each with 1 h of data before it and 6 h of data after it
            # inside the history
            t_n, h_n, sp = hours * 12, 72, 18
            assert expect == len([c for c in range(sp, t_n - h_n + 1, sp) if c >= 12])
            for e in f.entities:
                assert e.origins_scored == expect, (hours, e.id, e.origins_scored)
                assert e.history_points == t_n
            assert f.calibration_origins == expect
            tot = next(e for e in f.entities if e.id == "all")
            if expect < 8:  # too few to score a model: persistence, said so
                assert tot.model == "persistence" and "4 scoring origin(s)" in tot.note
                assert tot.interval.basis == "empirical h-step changes"
                assert all(s.skill is None for s in tot.skill)
                assert tot.p50_w == [tot.last_w] * 72
            else:
                assert all(s.skill is not None for s in tot.skill)
                assert tot.interval.checked_points > 0


@pytest.fixture(scope="module")
def bench_result(tmp_path_factory) -> dict:
    """bench/bench_forecast_frontier.py run once: the last 6 h held out, origins every 5 min,
    the service's own forecast_site."""
    out = tmp_path_factory.mktemp("bench") / "frontier.json"
    r = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_forecast_frontier.py"), "--data",
         str(FRONTIER), "--json", str(out)],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_service_forecast_never_loses_to_persistence_on_the_real_day(bench_result):
    """The frontier benchmark as bench/README.md reports it: skill >= 0 at 15 min and 1 h on
    the total and on >= 20 of 25 channels, no negative power, and the forecast says what it
    is."""
    res = bench_result
    assert res["origins"] == 70
    assert [r["origins"] for r in res["rows"]] == [70, 61]
    for r in res["rows"]:
        assert r["total_skill"] >= 0.0, r
        assert r["channels_skill_ge_0"] >= 20, r
    assert res["lowest_p05_w"] >= 0.0
    assert set(res["models_published"]) <= {"persistence", "level", "blend", "profile"} | {
        m for m in res["models_published"] if " to " in m
    }


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_honestly_calibrated_intervals_on_the_real_day_run_narrow_short_and_wide_long(
    bench_result,
):
    """With every interval calibrated on the data before its origin (persistence's: its own
    h-step changes, recency-weighted), the held-out 6 h are rougher at 15 min and calmer at
    1 h than the 18 h before them: p05-p95 covered 0.843 / 0.843 (channels / total) at 15 min
    and 0.990 / 1.000 at 1 h. Bands around what was found, so a change in either direction is
    seen; and the interval's width stays a small multiple of the load (1.3 and 1.6 times the
    held-out mean on the total; the locally scaled interval used before was 1.9 and 4.0
    times, with a p95 three times the system's largest draw)."""
    at15, at60 = bench_result["rows"]
    assert 0.80 <= at15["coverage_90_channels"] <= 0.88, at15
    assert 0.80 <= at15["coverage_90_total"] <= 0.88, at15
    assert 0.95 <= at60["coverage_90_channels"] <= 1.0, at60
    assert 0.95 <= at60["coverage_90_total"] <= 1.0, at60
    assert at15["width_over_load_total"] < 1.6 and at60["width_over_load_total"] < 2.0
    assert at60["interval_score_over_load_total"] < 2.0


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.xfail(
    strict=True,
    reason="issue 29's coverage target (0.85-0.95 at 15 min and 1 h) is not met by intervals"
    " calibrated on the history alone: 0.843 / 0.843 at 15 min, 0.990 / 1.000 at 1 h",
)
def test_p05_p95_coverage_on_the_real_day_is_in_the_target_band(bench_result):
    for r in bench_result["rows"]:
        assert 0.85 <= r["coverage_90_channels"] <= 0.95, r
        assert 0.85 <= r["coverage_90_total"] <= 0.95, r


def test_models_compete_and_a_daily_profile_wins_where_there_is_one():
    """Synthetic check of the selection itself: a clean daily cycle is forecast by the profile
    with positive skill; white noise around a level by the level or blend, never worse than
    persistence on its own history; a random walk stays persistence."""
    step, days = 600.0, 6
    t = np.arange(int(days * 86400 / step)) * step
    rng = np.random.default_rng(1)
    daily = 100 + 40 * np.sin(2 * np.pi * t / 86400) + rng.normal(0, 2, len(t))
    noise = 100 + rng.normal(0, 10, len(t))
    walk = 100 + np.cumsum(rng.normal(0, 1, len(t)))
    y = np.column_stack([daily, noise, walk])
    f = fc.forecast_skill(y, 1.7e9, step, 36)
    last = len(f.bucket_lo) - 1
    assert f.model[last][0] == "profile" and f.skill[last, 0] > 0.3
    assert f.model[last][1] in ("level", "blend") and f.skill[last, 1] > 0.2
    assert all(f.model[b][2] == "persistence" for b in range(last + 1))
    assert (f.p05 >= 0).all() and (f.p05 <= f.p50).all() and (f.p50 <= f.p95).all()
    assert all(b == "conformal on scoring origins" for b in f.interval_basis[:2])
    assert f.interval_basis[2] == "empirical h-step changes"
    assert np.isfinite(f.coverage_90).all() and (f.coverage_90 > 0.6).all()


def test_cli_forecast_now_shows_model_skill_and_origins(frontier):
    db, site_file = frontier
    at = (START + timedelta(hours=18)).strftime("%Y-%m-%dT%H:%M:%S")
    args = [sys.executable, "-m", "twin.cli", "forecast", "--db", str(db), "--site", str(site_file)]
    r = subprocess.run(
        [*args, "--now", at, "--format", "tsv"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    head, *rows = r.stdout.strip().splitlines()
    assert head.split("\t")[:5] == ["entity", "id", "model", "skill_by_lead", "origins_scored"]
    total = next(x.split("\t") for x in rows if x.split("\t")[1] == "all")
    assert total[2] and total[4] == "8" and "15 min" in total[3]
    assert "2024-04-07 18:00 UTC" in r.stderr  # the title names the past origin
    j = subprocess.run([*args, "--now", at, "--json"], capture_output=True, text=True, timeout=300)
    body = json.loads(j.stdout)
    assert body["now"].startswith("2024-04-07T18:00:00")
    assert all(e["origins_scored"] == 8 for e in body["entities"])
    bad = subprocess.run([*args, "--now", "yesterday"], capture_output=True, text=True)
    assert bad.returncode != 0 and "ISO-8601" in bad.stderr and "Traceback" not in bad.stderr
    early = subprocess.run([*args, "--now", "2020-01-01"], capture_output=True, text=True)
    assert early.returncode != 0 and "starts at" in early.stderr
