"""Make the shipped 24-hour bundle of the demo site (sample_telemetry/demo_bundle/).

Simulates the demo site for 24 h at 10 s resolution (seed 7) with injected faults, ingests it
through the normal ingest path into a temporary store, calibrates on the last two hours, and
records the whole day with ``twin.replay.bundle.record``. Deterministic: the same seed and
faults give the same telemetry. Takes several minutes on 2 cores.

    .venv/bin/python sample_telemetry/make_demo_bundle.py [--out DIR] [--hours 24]

Faults (seconds after the start, 2026-11-23 00:00 UTC, a Monday):
- cold_plate_decay:trn-a03-n2:5@6h+4h=2.0   a cold plate degrading: R x3 over four hours
- pump_failure:cdu-2/pump1@10h+30m          CDU-2 loses one of its two pumps for 30 min
- phase_creep:pdu-d08-a/L1@14h+2h           load creeping onto one phase of a GB200 rack
- fleet_idle:infer-embed@18h+4h             the embedding fleet drained for four hours
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from twin.calibrate.calibrate import calibrate, save_run
from twin.ingest import Ingester, IngestLimits
from twin.replay.bundle import record
from twin.simulator import SiteSimulator, parse_fault
from twin.site import load_site
from twin.store import Store

HERE = Path(__file__).resolve().parent
SITE = HERE / "demo_site.yaml"
START = datetime(2026, 11, 23, 0, 0, tzinfo=UTC)
SEED = 7
RESOLUTION_S = 10.0
FAULTS = [
    "cold_plate_decay:trn-a03-n2:5@6h+4h=2.0",
    "pump_failure:cdu-2/pump1@10h+30m",
    "phase_creep:pdu-d08-a/L1@14h+2h",
    "fleet_idle:infer-embed@18h+4h",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "demo_bundle")
    ap.add_argument("--hours", type=float, default=24.0)
    args = ap.parse_args()
    site = load_site(SITE)
    sim = SiteSimulator(
        site,
        seed=SEED,
        start=START,
        rate_hz=1.0 / RESOLUTION_S,
        faults=[parse_fault(f) for f in FAULTS],
    )
    ticks = round(args.hours * 3600 / RESOLUTION_S)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "day.duckdb") as store:
        ing = Ingester(store, site, IngestLimits(max_past_s=0))
        batch: list[tuple[str, bytes]] = []
        for k in range(ticks):
            batch.extend(sim.step())
            if len(batch) >= 50_000:
                ing.ingest(batch)
                batch = []
            if k % 1000 == 0:
                print(f"tick {k}/{ticks} {time.perf_counter() - t0:.0f} s", flush=True)
        ing.ingest(batch)
        end = sim.sim_time + timedelta(seconds=RESOLUTION_S)
        result = calibrate(store, site, end=end, window_s=7200.0, holdout_s=1200.0, step_s=10.0)
        save_run(store, result)
        manifest = record(
            store,
            SITE,
            args.out,
            START,
            end,
            resolution_s=RESOLUTION_S,
            notes=f"simulated demo site, seed {SEED}, faults: {'; '.join(FAULTS)}",
            overwrite=True,
        )
    size = sum(f.stat().st_size for f in args.out.iterdir())
    took_s = time.perf_counter() - t0
    print(f"{args.out}: {size / 1e6:.1f} MB, rows {manifest.rows}, {took_s:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
