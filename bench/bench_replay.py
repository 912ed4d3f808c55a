"""Replay benchmark: a bundle into a fresh store with ``dctwin replay BUNDLE --db PATH``.

Runs the command as users do, in a child process (``python -m twin.cli replay``), as fast as
possible (the default ``--speed 0``), into a new DuckDB file in a temporary directory, and
reports its wall time, its CPU time (user + system: on a busy machine, the better guide to the
wall time it would take alone), the child's peak RSS (``getrusage(RUSAGE_CHILDREN).ru_maxrss``), the
recorded span over the wall time (the speed reached: 1,440 is a day in a minute), the rows
stored and the ingest's counters, and the load average before and after (the machine's other
work).

    .venv/bin/python bench/bench_replay.py                     # the shipped 24 h demo bundle
    .venv/bin/python bench/bench_replay.py --bundle DIR --json out.json

Targets (issue 15 item 5): the demo bundle (880 GPUs, 24 h at 10 s, 13.8 M rows) in <= 60 s
wall and <= 2 GB peak RSS on a 2-vCPU VM: a recorded day replayed at x1,440 or better.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "sample_telemetry" / "demo_bundle"
#: Targets of issue 15 item 5.
MAX_WALL_S = 60.0
MAX_RSS_MB = 2048.0


def run(bundle: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        db = Path(tmp) / "replay.duckdb"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        load_before = os.getloadavg()
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "twin.cli", "replay", str(bundle), "--db", str(db)],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
        )
        wall_s = time.monotonic() - t0
        load_after = os.getloadavg()
        if proc.returncode != 0:
            raise SystemExit(f"replay failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        rss_mb = usage.ru_maxrss / 1024  # Linux: KiB
        cpu_s = usage.ru_utime + usage.ru_stime
        stats = json.loads(proc.stdout.strip().splitlines()[-1])
        store_mb = db.stat().st_size / 1e6
    recorded_s = float(stats["recorded_s"])
    return {
        "bundle": str(bundle),
        "rows": stats["rows"],
        "messages": stats["messages"],
        "wall_s": round(wall_s, 2),
        "replay_s": stats["wall_s"],  # inside the command, without start-up and rollup
        "rollup_s": stats.get("rollup_s"),
        "cpu_s": round(cpu_s, 2),  # the child's user + system CPU time: less load-dependent
        "peak_rss_mb": round(rss_mb, 1),
        "recorded_s": recorded_s,
        "speed_x": round(recorded_s / wall_s, 1),
        "rows_per_s": round(stats["rows"] / wall_s),
        "store_mb": round(store_mb, 1),
        "ingest": stats["ingest"],
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "targets_met": wall_s <= MAX_WALL_S and rss_mb <= MAX_RSS_MB,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=DEMO, help="bundle directory (default: demo)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args()
    result = run(args.bundle)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
