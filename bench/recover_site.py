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

from harness.recovery import DEFAULT_START, compare, ingest_simulation
from twin.calibrate.calibrate import calibrate
from twin.simulator import SiteSimulator
from twin.site import load_site
from twin.store import Store

REPO = Path(__file__).resolve().parents[1]


def simulate_into(
    store: Store, site_path: Path, hours: float, seed: int, start: datetime = DEFAULT_START
) -> dict[str, Any]:
    """Simulate ``hours`` of the site at 1 Hz from ``start`` into ``store``; return the truth.

    The workload follows the time of day and the weekday, so a fixed ``start`` makes the run
    reproducible.
    """
    site = load_site(site_path)
    sim = SiteSimulator(site, seed=seed, start=start.replace(second=0, microsecond=0))
    return ingest_simulation(store, site, sim, hours * 3600.0)


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
