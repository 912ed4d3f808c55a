"""The service's load forecast on real load: 25 CDU power channels of a liquid-cooled
supercomputer and their total, 24 h at 15 s (sample_telemetry/frontier_25cdu_power_oa_wetbulb_
15s_24h.csv, MIT, (c) 2024 Hewlett Packard Enterprise; see its NOTICE).

    PYTHONPATH=. .venv/bin/python bench/bench_forecast_frontier.py [--json FILE]

The recording goes into a DuckDB store as node power (one node per channel, each in its own
rack; one training fleet of all 25 racks, whose power is the total) and the service's own
:func:`twin.forecast.forecast_site` (default 14-day history window, 300 s steps, 1 h horizon)
is called at origins every 5 min over the last 6 h, each seeing only the data before it. Each
forecast's p50 at 15 min and 1 h ahead (the 5-min mean ending there; each lead at every origin
whose target is inside the day: 70 and 61 origins) is scored against
persistence (the last 5-min mean, the entity's ``last_w``): skill = 1 - MAE/MAE_persistence,
per channel and on the total; p05-p95 coverage of what happened (nominal 0.90), pooled and per
channel (how many channels lie in 0.85-0.95); the smallest quantile published (power is never
negative); the interval's mean width and its interval score (Gneiting and Raftery 2007: width
plus 20 times the miss, lower is better), each over the held-out hours' mean load. Every
interval is calibrated on the data before its origin only (persistence's: the recency-weighted
h-step changes, models.forecast.RECENCY_WEIGHT); nothing is tuned on the held-out hours.
``--end-hour`` moves the held-out 6 h earlier in the day (hours 6-12 with ``--end-hour 12``),
with the history before them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.forecast import interval_score  # noqa: E402
from twin.forecast import forecast_site  # noqa: E402
from twin.site import Site  # noqa: E402
from twin.store import Store  # noqa: E402
from twin.store.schema import arrow_schema  # noqa: E402

DATA = ROOT / "sample_telemetry" / "frontier_25cdu_power_oa_wetbulb_15s_24h.csv"
#: 2024-04-07 00:00 UTC, the day the source file is named after (its `time` column starts at 0)
START = datetime(2024, 4, 7, tzinfo=UTC)
STEP_S = 300.0
LEADS_S = (900.0, 3600.0)
HELD_OUT_S = 6 * 3600.0
ORIGIN_EVERY_S = 300.0
N_CH = 25


def read(path: Path = DATA) -> tuple[np.ndarray, np.ndarray]:
    """``time`` [s from START] and the 25 power channels [W], (5761,) and (5761, 25)."""
    head = path.open().readline().strip().split(",")
    raw = np.loadtxt(path, delimiter=",", skiprows=1)
    cols = [i for i, h in enumerate(head) if h.startswith("power[")]
    if len(cols) != N_CH or not (np.diff(raw[:, 0]) == 15.0).all():
        raise SystemExit(f"{path}: expected `time` every 15 s and 25 power[] columns")
    return raw[:, 0], raw[:, cols]


def frontier_site() -> Site:
    """25 racks of one node each (node ``cdu-NN`` carries channel NN) and a training fleet of
    all of them."""
    return Site.model_validate(frontier_site_dict())


def frontier_site_dict() -> dict:
    """The site file of :func:`frontier_site`, as a dict."""
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
        {
            "name": f"pdu-r{k:02d}",
            "feed": "A",
            "phases": 3,
            "wiring": "wye",
            "voltage_v": 415,
            "rated_current_a": 32,
        }
        for k in range(1, N_CH + 1)
    ]
    return {
        "name": "frontier",
        "halls": [{"name": "hall-1", "rows": [{"name": "row-a", "racks": racks}]}],
        "pdus": pdus,
        "fleets": [{"name": "all", "role": "training", "members": [r["name"] for r in racks]}],
    }


def load_store(store: Store, path: Path = DATA) -> tuple[np.ndarray, np.ndarray]:
    """Write the recording as node power; returns (time_s, power_w) as read."""
    t_s, p_w = read(path)
    n_t = len(t_s)
    ts = np.repeat((START.timestamp() + t_s) * 1e6, N_CH).astype("int64")
    ids = np.tile([f"cdu-{k:02d}" for k in range(1, N_CH + 1)], n_t)
    schema = arrow_schema("node")
    cols = {
        "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        "source": pa.array(ids),
        "id": pa.array(ids),
    }
    for f in schema:
        if f.name not in cols:
            cols[f.name] = (
                pa.array(p_w.reshape(-1))
                if f.name == "power_w"
                else pa.nulls(n_t * N_CH, type=f.type)
            )
    store.insert_arrow("node", pa.table(cols, schema=schema))
    return t_s, p_w


def run(
    path: Path = DATA,
    held_out_s: float = HELD_OUT_S,
    every_s: float = ORIGIN_EVERY_S,
    end_hour: float | None = None,
):
    """Every figure of the table, as a dict (the test reads this); ``end_hour`` ends the
    held-out hours there (default: the end of the day)."""
    site = frontier_site()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "frontier.duckdb")
        try:
            t_s, p_w = load_store(store, path)
            # 5-min means of what happened, on the service's grid, channels then the total
            per = round(STEP_S / 15.0)
            n_rows = (len(t_s) - 1) // per
            mean_w = p_w[: n_rows * per].reshape(n_rows, per, N_CH).mean(axis=1)
            actual = np.column_stack([mean_w, mean_w.sum(axis=1)])
            if end_hour is not None:
                n_rows = min(n_rows, round(end_hour * 3600.0 / STEP_S))
                actual = actual[:n_rows]
            end = START + timedelta(seconds=n_rows * STEP_S)
            first = end - timedelta(seconds=held_out_s)
            origins = []
            o = first
            while o + timedelta(seconds=min(LEADS_S)) <= end:  # each lead where it can be
                origins.append(o)
                o += timedelta(seconds=every_s)
            err = {h: [] for h in LEADS_S}
            err_p = {h: [] for h in LEADS_S}
            inside = {h: [] for h in LEADS_S}
            width = {h: [] for h in LEADS_S}
            score = {h: [] for h in LEADS_S}
            lowest = np.inf
            models: dict[str, int] = {}
            bases: dict[str, int] = {}
            t0 = time.perf_counter()
            for o in origins:
                f = forecast_site(store, site, now=o, horizon_s=3600.0, step_s=STEP_S)
                by = {e.id: e for e in f.entities}
                ents = [by[f"r{k:02d}"] for k in range(1, N_CH + 1)] + [by["all"]]
                row0 = round((o - START).total_seconds() / STEP_S)
                for h in LEADS_S:
                    i = round(h / STEP_S) - 1
                    if row0 + i >= len(actual):
                        continue
                    a = actual[row0 + i]
                    p50 = np.array([e.p50_w[i] for e in ents], float)
                    lo = np.array([e.p05_w[i] for e in ents], float)
                    hi = np.array([e.p95_w[i] for e in ents], float)
                    last = np.array([e.last_w for e in ents], float)
                    err[h].append(np.abs(a - p50))
                    err_p[h].append(np.abs(a - last))
                    inside[h].append((a >= lo) & (a <= hi))
                    width[h].append(hi - lo)
                    score[h].append(interval_score(a, lo, hi))
                for e in ents:
                    lowest = min(lowest, *(v for v in e.p05_w if v is not None))
                    models[e.model] = models.get(e.model, 0) + 1
                    bases[e.interval.basis] = bases.get(e.interval.basis, 0) + 1
            seconds = time.perf_counter() - t0
        finally:
            store.close()
    out: dict = {
        "origins": len(origins),
        "held_out_end": end.isoformat(),
        "first_origin": origins[0].isoformat(),
        "last_origin": origins[-1].isoformat(),
        "seconds": round(seconds, 1),
        "lowest_p05_w": float(lowest),
        "models_published": models,
        "interval_bases": bases,
        "rows": [],
    }
    for h in LEADS_S:
        e, ep, c = np.array(err[h]), np.array(err_p[h]), np.array(inside[h])
        held = actual[round((first - START).total_seconds() / STEP_S) :].mean(axis=0)
        wid = np.array(width[h]).mean(axis=0) / held
        isc = np.array(score[h]).mean(axis=0) / held
        skill = 1.0 - e.sum(axis=0) / ep.sum(axis=0)
        cov_ch = c[:, :N_CH].mean(axis=0)
        out["rows"].append(
            {
                "lead_s": h,
                "origins": len(e),
                "total_mae_kw": float(e[:, -1].mean() / 1e3),
                "total_persistence_mae_kw": float(ep[:, -1].mean() / 1e3),
                "total_skill": float(skill[-1]),
                "channels_skill_ge_0": int((skill[:N_CH] >= 0).sum()),
                "channels_median_skill": float(np.median(skill[:N_CH])),
                "coverage_90_channels": float(c[:, :N_CH].mean()),
                "coverage_90_total": float(c[:, -1].mean()),
                "channels_coverage_in_band": int(((cov_ch >= 0.85) & (cov_ch <= 0.95)).sum()),
                "channels_coverage_below": int((cov_ch < 0.85).sum()),
                "channels_coverage_above": int((cov_ch > 0.95).sum()),
                "width_over_load_channels": float(wid[:N_CH].mean()),
                "width_over_load_total": float(wid[-1]),
                "interval_score_over_load_channels": float(isc[:N_CH].mean()),
                "interval_score_over_load_total": float(isc[-1]),
            }
        )
    return out


def table(res: dict) -> str:
    lines = [
        "| lead | origins | total MAE (kW) | persistence MAE (kW) | total skill"
        " | channels skill ≥ 0"
        " | channels median skill | p05–p95 coverage channels / total"
        " | channels in 0.85–0.95 (below / above)"
        " | p05–p95 width / load channels, total | interval score / load channels, total |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['lead_s'] / 60:.0f} min | {r['origins']} | {r['total_mae_kw']:.0f}"
            f" | {r['total_persistence_mae_kw']:.0f} | {r['total_skill']:+.3f}"
            f" | {r['channels_skill_ge_0']}/25 | {r['channels_median_skill']:+.3f}"
            f" | {r['coverage_90_channels']:.3f} / {r['coverage_90_total']:.3f}"
            f" | {r['channels_coverage_in_band']}/25 ({r['channels_coverage_below']}"
            f" / {r['channels_coverage_above']})"
            f" | {r['width_over_load_channels']:.2f}, {r['width_over_load_total']:.2f}"
            f" | {r['interval_score_over_load_channels']:.2f},"
            f" {r['interval_score_over_load_total']:.2f} |"
        )
    lines.append(
        f"\norigins {res['origins']} ({res['first_origin']} .. {res['last_origin']};"
        f" held out to {res['held_out_end']}),"
        f" {res['seconds']} s; lowest p05 {res['lowest_p05_w']:.0f} W;"
        f" models {res['models_published']}; interval bases {res['interval_bases']}"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help="the 25-CDU CSV")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument(
        "--end-hour",
        type=float,
        help="end the held-out 6 h at this hour of the day (default: the day's end)",
    )
    a = ap.parse_args()
    if a.end_hour is not None and not 7.0 <= a.end_hour <= 24.0:
        raise SystemExit(f"--end-hour {a.end_hour}: must be 7-24 (6 h held out, 1 h of history)")
    res = run(a.data, end_hour=a.end_hour)
    print(table(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
