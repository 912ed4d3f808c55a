"""Parameter recovery on a whole simulated site: simulate, ingest, calibrate, compare to truth.

Simulates ``--hours`` of 1 Hz telemetry of a site (the demo site by default), ingests it through
the normal ingest path into a DuckDB file, runs ``twin.calibrate.calibrate`` over the window and
compares every fitted parameter with the simulator's truth, against the tolerances of issue 3:
R within 5 %, C within 15 %, idle and limit power within 3 %, capture fraction within 0.02.
Held-out prediction: GPU temperature 10 min ahead MAE <= 1 K, rack power MAPE <= 2 %, CDU
return temperature MAE <= 0.5 K.

    .venv/bin/python bench/recover_site.py                       # demo site, 2 h
    .venv/bin/python bench/recover_site.py --start 2026-11-28T20:00   # a Saturday evening
    .venv/bin/python bench/recover_site.py --site sample_telemetry/small_site.yaml --json out.json

Prints one line per parameter (devices, usable, worst error, how many miss the tolerance) and
exits 1 when any device misses one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from twin.calibrate.calibrate import calibrate
from twin.ingest import Ingester, IngestLimits
from twin.simulator import SiteSimulator
from twin.site import load_site
from twin.store import Store

REPO = Path(__file__).resolve().parents[1]
#: A fixed start makes a run reproducible (the workload follows the time of day and weekday).
DEFAULT_START = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)

#: (kind, fitted parameter, truth section, truth key, relative?, tolerance)
CHECKS = [
    ("gpu", "r_k_per_w", "gpus", "r_k_per_w", True, 0.05),
    ("gpu", "c_j_per_k", "gpus", "c_j_per_k", True, 0.15),
    ("gpu", "mem_r_k_per_w", "gpus", "mem_r_k_per_w", True, 0.05),
    ("gpu", "mem_c_j_per_k", "gpus", "mem_c_j_per_k", True, 0.15),
    ("gpu", "idle_w", "gpus", "idle_w", True, 0.03),
    ("gpu", "limit_w", "gpus", "limit_w", True, 0.03),
    ("rack", "capture_fraction", "racks", "capture_fraction", False, 0.02),
]
#: (kind, quantity prefix, metric, limit)
PREDICTION = [
    ("gpu", "temp_c@600s", "mae", 1.0),
    ("rack", "", "mape", 0.02),
    ("cdu", "", "mae", 0.5),
]


def simulate_into(
    store: Store, site_path: Path, hours: float, seed: int, start: datetime = DEFAULT_START
) -> dict[str, Any]:
    """Simulate ``hours`` of the site at 1 Hz from ``start`` into ``store``; return the truth.

    The workload follows the time of day and the weekday, so a fixed ``start`` makes the run
    reproducible.
    """
    site = load_site(site_path)
    start = start.replace(second=0, microsecond=0)
    sim = SiteSimulator(site, seed=seed, start=start, rate_hz=1.0)
    ingester = Ingester(store, site, IngestLimits(max_past_s=0))
    batch: list[tuple[str, bytes]] = []
    for _ in range(round(hours * 3600)):
        batch.extend(sim.step())
        if len(batch) >= 20_000:
            ingester.ingest(batch)
            batch = []
    ingester.ingest(batch)
    return sim.truth()


def compare(result: dict[str, Any], truth: dict[str, Any]) -> dict[str, Any]:
    """Per parameter: devices, usable, worst error and the devices outside the tolerance."""
    by_key = {(p["kind"], p["param"], p["id"]): p for p in result["params"]}
    report: dict[str, Any] = {}
    for kind, param, section, key, relative, tol in CHECKS:
        misses, unusable, worst = [], [], 0.0
        devices = truth[section]
        if section == "racks":  # air-cooled racks capture nothing and are not fitted
            devices = {k: v for k, v in devices.items() if v[key] > 0}
        for dev, t in devices.items():
            p = by_key.get((kind, param, dev))
            if p is None or not p["usable"] or p["value"] is None:
                unusable.append((dev, None if p is None else p["reason"]))
                continue
            ident = by_key.get((kind, "capture_identifiable", dev))
            if param == "capture_fraction" and ident is not None and not ident["value"]:
                unusable.append((dev, p["reason"]))  # a prior-weighted share, not a fit
                continue
            err = p["value"] / t[key] - 1.0 if relative else p["value"] - t[key]
            worst = max(worst, abs(err))
            if abs(err) > tol:
                misses.append((dev, round(err, 4), p["stderr"]))
        report[param] = {
            "devices": len(devices),
            "usable": len(devices) - len(unusable),
            "worst_error": round(worst, 4),
            "tolerance": tol,
            "relative": relative,
            "misses": misses,
            "unusable": unusable[:10],
        }
    for kind, prefix, metric, limit in PREDICTION:
        rows = [
            q
            for q in result["quality"]
            if q["kind"] == kind and q["quantity"].startswith(prefix) and q[metric] is not None
        ]
        worst_q = max((q[metric] for q in rows), default=None)
        report[f"{kind}:{prefix or 'all'}:{metric}"] = {
            "devices": len(rows),
            "worst": None if worst_q is None else round(worst_q, 4),
            "limit": limit,
            "misses": [(q["id"], round(q[metric], 4)) for q in rows if q[metric] > limit],
        }
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", type=Path, default=REPO / "sample_telemetry" / "demo_site.yaml")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--start",
        type=lambda v: datetime.fromisoformat(v).replace(tzinfo=UTC),
        default=DEFAULT_START,
        help="simulated start, UTC (default %(default)s: a Wednesday morning; the inference"
        " load follows the time of day and the weekday)",
    )
    ap.add_argument("--db", type=Path, help="DuckDB file to keep (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="write the full report here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "recover.duckdb"
        with Store(db) as store:
            t0 = time.perf_counter()
            truth = simulate_into(store, args.site, args.hours, args.seed, start=args.start)
            t1 = time.perf_counter()
            result = calibrate(
                store, load_site(args.site), window_s=args.hours * 3600.0, holdout_s=1200.0
            )
            t2 = time.perf_counter()
    report = compare(result, truth)
    print(
        f"site {args.site.name}, {len(truth['gpus'])} GPUs, {args.hours} h at 1 Hz from "
        f"{args.start:%Y-%m-%d %H:%M} UTC, seed {args.seed}: simulate+ingest {t1 - t0:.0f} s, "
        f"calibrate {t2 - t1:.1f} s"
    )
    failed = False
    for name, r in report.items():
        miss = len(r["misses"]) + (r["devices"] - r["usable"] if "usable" in r else 0)
        failed |= miss > 0
        if "usable" in r:
            print(
                f"  {name:18s} {r['usable']:4d}/{r['devices']:<4d} usable, worst "
                f"{r['worst_error']:.4f} (tol {r['tolerance']}), outside: {len(r['misses'])}"
                + (f", unusable e.g. {r['unusable'][:2]}" if r["usable"] < r["devices"] else "")
            )
        else:
            print(
                f"  {name:18s} {r['devices']:4d} devices, worst {r['worst']} "
                f"(limit {r['limit']}), over: {len(r['misses'])}"
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
