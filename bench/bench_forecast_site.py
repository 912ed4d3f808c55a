"""The live load forecast's work per 5-min step at a site's size: ``forecast_site`` over 14 days.

The store holds only node power: ``--days`` days at 5 min for every node of
``bench_detect.bench_site(--gpus)`` (a daily cycle per node and 3 % noise,
``bench_detect.write_node_history``), 50.4 M rows at 100,000 GPUs. In a fresh process (so its
peak RSS is the forecast's), ``twin.forecast.forecast_site`` with the detection loop's
arguments (the 1 h headroom horizon plus two 5-min steps, 300 s steps, the default 14-day
history) is timed once, with its read (``load_power_series``) timed on its own before it.
This is what the loop's forecast thread (``twin.forecast.ForecastCache``) does once per step.

    PYTHONPATH=. .venv/bin/python bench/bench_forecast_site.py --gpus 100000 --keep /tmp/fs
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

#: ``now`` of every run (fixed, so that stores kept with --keep are reused as they are)
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def measure(db: Path, n_gpus: int) -> dict:
    """The read and the forecast on ``db``, in this process."""
    from bench_detect import MINUTES, bench_site

    from twin.forecast import forecast_site
    from twin.forecast.series import grid_window, load_power_series
    from twin.store import Store

    site = bench_site(n_gpus)
    now = NOW - timedelta(minutes=MINUTES)  # the end of the node history
    with Store(db) as store:
        start, end = grid_window(now, 14 * 86400.0, 300.0)
        t = time.perf_counter()
        ps = load_power_series(store, site, start, end, 300.0)
        read_s = time.perf_counter() - t
        t = time.perf_counter()
        f = forecast_site(store, site, now=now, horizon_s=3600.0 + 600.0, step_s=300.0)
        forecast_s = time.perf_counter() - t
    models: dict[str, int] = {}
    for e in f.entities:
        models[e.model] = models.get(e.model, 0) + 1
    return {
        "gpus": n_gpus,
        "entities": len(f.entities),
        "history_steps": int(ps.power_w.shape[0]),
        "read_s": round(read_s, 2),
        "forecast_site_s": round(forecast_s, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "models": models,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=10000, help="site size (bench_detect's layout)")
    ap.add_argument("--days", type=float, default=14.0, help="days of node power in the store")
    ap.add_argument("--keep", type=Path, help="keep (and reuse) the store in this folder")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # measure this store
    a = ap.parse_args()
    if a.child:
        print(json.dumps(measure(a.child, a.gpus)))
        return
    from bench_detect import write_node_history

    with tempfile.TemporaryDirectory() as tmp:
        folder = a.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        db = folder / f"forecast_{a.gpus}_{a.days:g}d.duckdb"
        if not db.exists():
            t = time.perf_counter()
            write_node_history(db, a.gpus, NOW, a.days)
            print(f"store written in {time.perf_counter() - t:.1f} s: {db}", flush=True)
        cmd = [sys.executable, __file__, "--gpus", str(a.gpus), "--child", str(db)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        print(out.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
