"""Benchmark one detection pass (headroom, hot spots, pumps, fleets, coverage) by site size.

Each case is a synthetic store written directly (no MQTT) on ``bench_api.synthetic_site``'s
layout (racks of 4 HGX-H200-8-DLC nodes, 2 three-phase PDUs per rack, 40 racks per CDU), with
half the racks a training fleet and half an inference fleet, 10 minutes of GPU, node, PDU and
CDU samples every ``step_s`` seconds, and one calibration run (R, C, offset and held-out MAE
for every GPU, the flow each loop was fitted at). The data follow the RC model (temperature =
supply + R x power + noise) except for planted faults: 0.1 % of the GPUs run 6 K above their
model and 0.05 % sit above the max operating temperature, so every detector has something to
report and the pass's output has a realistic size.

For each case, in a fresh process (so that its peak RSS is the pass's):

- ``detect()``: the whole pass, as ``dctwin serve`` runs it (one warm-up, then ``--runs``);
- each stage on its own (headroom, hot spots, pumps, fleets, coverage) and ``observations()``;
- the floor: the same rows read from the store with plain SELECTs into Arrow (per kind, the
  widest window and every column the pass reads), and the same rows through ``load_window``
  on the pass's grid;
- peak RSS of the process (``ru_maxrss``) and its RSS before the first pass.

Targets (issue 13): 10,000 GPUs at 1 s <= 3 s, 100,000 GPUs at 10 s <= 30 s.

``--history-days D`` writes, before those 10 minutes, D days of node power at 5 min (a daily
cycle per node and noise): with a day or more the headroom takes its load paths from the
forecast (``twin.forecast.rack_ratio_paths``), as a live site does from its second day. Then
``detect`` is a pass that makes the forecast in it (as ``dctwin headroom --db`` does), ``served
pass`` the one ``dctwin serve`` runs, whose forecast its ``twin.forecast.ForecastCache`` made
on a thread of its own (once per 5-min step), and ``forecast`` that thread's work per step; the
target is judged on the served pass.

Usage::

    python bench/bench_detect.py                     # 1k@1s, 10k@1s, 100k@10s, 1k@10s, 10k@10s
    python bench/bench_detect.py --cases 10000@1 --runs 5 --profile /tmp/prof

``--profile DIR`` writes one cProfile of a pass per case (``DIR/detect_<gpus>_<step>s.prof``)
and prints the top of the headroom stage's profile.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_api import synthetic_site  # noqa: E402

from twin.site import Site  # noqa: E402
from twin.site.index import index_site  # noqa: E402
from twin.store import Store  # noqa: E402
from twin.store.schema import arrow_schema  # noqa: E402

#: Minutes of telemetry in every store (issue 13: "10 minutes of data").
MINUTES = 10
#: The RC model the data follow (the H200's catalog R and tau, physics.md §9). [K/W], [s]
R_K_PER_W = 0.03
TAU_S = 10.0
#: Sensor noise of the temperatures. [K]
NOISE_K = 0.3
#: What every pass reads, per kind: (window seconds, columns). The GPU window is the fleets'
#: (the whole store), the PDU and node windows the headroom's persistence hour.
FLOOR_READS = {
    "gpu": ["power_w", "temp_c", "mem_temp_c", "power_limit_w", "sm_active", "util_pct"],
    "node": ["power_w", "inlet_temp_c"],
    "pdu": ["power_w", "current_a", "inlet_temp_c", "power_factor"],
    "cdu": ["supply_temp_c", "return_temp_c", "flow_lpm", "heat_kw", "pump_speed_pct"],
}


def bench_site(n_gpus: int) -> Site:
    """``bench_api.synthetic_site`` with the first half of the racks a training fleet and the
    second half an inference fleet (the fleets stage has something to judge)."""
    base = synthetic_site(n_gpus).model_dump(exclude_defaults=True)
    racks = [r["name"] for h in base["halls"] for row in h["rows"] for r in row["racks"]]
    half = max(1, len(racks) // 2)
    base["fleets"] = [
        {"name": "train", "role": "training", "members": racks[:half]},
        {"name": "infer", "role": "inference", "members": racks[half:] or racks[:1]},
    ]
    return Site.model_validate(base)


def _table(kind: str, ids: list[str], ts_us: np.ndarray, values: dict[str, np.ndarray]):
    """One row per id per timestamp (time-major); quantities not given are null."""
    n = len(ids) * len(ts_us)
    id_arr = pa.array(np.tile(np.array(ids, dtype=object), len(ts_us)), pa.string())
    cols = {
        "ts": pa.array(np.repeat(ts_us, len(ids)), pa.timestamp("us", tz="UTC")),
        "source": id_arr,
        "id": id_arr,
    }
    schema = arrow_schema(kind)
    for f in schema:
        if f.name not in cols:
            v = values.get(f.name)
            cols[f.name] = pa.nulls(n, f.type) if v is None else pa.array(v.reshape(-1), f.type)
    return pa.table(cols, schema=schema)


def build_store(path: Path, n_gpus: int, step_s: float, now: datetime, seed: int = 7) -> dict:
    """Write the case's store; returns what was planted."""
    rng = np.random.default_rng(seed)
    site = bench_site(n_gpus)
    n_steps = int(MINUTES * 60 / step_s)
    ts_us = int(now.timestamp() * 1e6) - (n_steps - 1 - np.arange(n_steps)) * round(step_s * 1e6)
    nodes = site.nodes
    idx = index_site(site)
    gpu_ids = idx.gpu_ids
    g = len(gpu_ids)
    infer = {nd.name for f in site.fleets if f.role == "inference" for nd in _nodes_of(site, f)}
    gpu_infer = np.array([nd in infer for nd in idx.gpu_node], dtype=bool)
    spec = nodes[0].gpu_spec
    # activity: training busy, inference mostly idle (an underused fleet), a little noise
    act_base = np.where(gpu_infer, rng.uniform(0.08, 0.25, g), rng.uniform(0.8, 0.95, g))
    act = np.clip(act_base + rng.normal(0, 0.02, (n_steps, g)), 0, 1)
    power = spec.idle_w + (spec.tdp_w - spec.idle_w) * act
    supply_c = 30.0
    hot = rng.choice(g, max(1, g // 1000), replace=False)  # 6 K above the model
    over = rng.choice(g, max(1, g // 2000), replace=False)  # over the max operating temperature
    temp = supply_c + R_K_PER_W * power + rng.normal(0, NOISE_K, (n_steps, g))
    temp[:, hot] += 6.0
    temp[:, over] = spec.max_operating_temp_c + 1.0 + rng.normal(0, NOISE_K, (n_steps, len(over)))
    gpu_vals = {
        "power_w": power.round(1),
        "temp_c": temp.round(1),
        "mem_temp_c": (temp + 5.0).round(1),
        "power_limit_w": np.full((n_steps, g), spec.tdp_w),
        "sm_active": act.round(3),
        "util_pct": (100 * np.minimum(1.0, act * 1.3)).round(0),
    }
    node_gpu_w = power.reshape(n_steps, len(nodes), -1).sum(axis=2)
    node_w = node_gpu_w + nodes[0].spec.base_w
    racks = site.racks
    node_rack = np.array([i for i, r in enumerate(racks) for _ in r.nodes])
    rack_w = np.zeros((n_steps, len(racks)))
    np.add.at(rack_w, (slice(None), node_rack), node_w)
    # PDUs: two feeds share each rack; the phase currents of a wye PDU at 240 V line-neutral
    pdu_ids, pdu_power, pdu_cur, pdu_pf, pdu_inlet = [], [], [], [], []
    feed_w = rack_w / 2.0
    for r_i, r in enumerate(racks):
        for p in r.pdus:
            pdu_ids.append(p)
            pdu_power.append(feed_w[:, r_i])
            pdu_pf.append(np.full(n_steps, 0.98))
            pdu_inlet.append(24.0 + rng.normal(0, 0.2, n_steps))
            pdu_cur.append(None)
            amps = feed_w[:, r_i] / 3.0 / 240.0 / 0.98
            for sub in ("L1", "L2", "L3", "cb1", "cb2", "cb3"):
                pdu_ids.append(f"{p}/{sub}")
                pdu_power.append(None)
                pdu_pf.append(None)
                pdu_inlet.append(None)
                pdu_cur.append(amps + rng.normal(0, 0.05, n_steps))

    def stack(cols: list) -> np.ndarray:
        return np.column_stack([np.full(n_steps, np.nan) if c is None else c for c in cols])

    # CDUs: heat = capture x rack power, return from the flow; two pumps each at 70 %
    cdu_names = [c.name for c in site.cdus]
    cdu_of_rack = np.array([cdu_names.index(r.cdu) for r in racks])
    heat_kw = np.zeros((n_steps, len(cdu_names)))
    np.add.at(heat_kw, (slice(None), cdu_of_rack), 0.75 * rack_w / 1000.0)
    flow = np.full((n_steps, len(cdu_names)), 1800.0)
    ret = supply_c + heat_kw * 1000.0 / (flow / 60_000.0 * 1030.0 * 3900.0)  # PG25, approx.
    cdu_ids = list(cdu_names)
    cdu_cols: dict[str, list] = {k: [] for k in FLOOR_READS["cdu"]}
    for c_i, _ in enumerate(cdu_names):
        for k, v in (
            ("supply_temp_c", np.full(n_steps, supply_c)),
            ("return_temp_c", ret[:, c_i]),
            ("flow_lpm", flow[:, c_i]),
            ("heat_kw", heat_kw[:, c_i]),
            ("pump_speed_pct", None),
        ):
            cdu_cols[k].append(v)
    for c in site.cdus:
        for p in c.pumps:
            cdu_ids.append(f"{c.name}/{p}")
            for k in cdu_cols:
                cdu_cols[k].append(np.full(n_steps, 70.0) if k == "pump_speed_pct" else None)
    with Store(path) as store:
        store.insert_arrow("gpu", _table("gpu", gpu_ids, ts_us, gpu_vals))
        store.insert_arrow(
            "node",
            _table(
                "node",
                [nd.name for nd in nodes],
                ts_us,
                {"power_w": node_w.round(1), "inlet_temp_c": np.full(node_w.shape, 24.0)},
            ),
        )
        store.insert_arrow(
            "pdu",
            _table(
                "pdu",
                pdu_ids,
                ts_us,
                {
                    "power_w": stack(pdu_power),
                    "current_a": stack(pdu_cur).round(2),
                    "power_factor": stack(pdu_pf),
                    "inlet_temp_c": stack(pdu_inlet).round(1),
                },
            ),
        )
        store.insert_arrow(
            "cdu", _table("cdu", cdu_ids, ts_us, {k: stack(v) for k, v in cdu_cols.items()})
        )
        _write_calibration(store, site, gpu_ids, cdu_names, now, rng)
    return {"gpus": g, "steps": n_steps, "above_model": len(hot), "over_limit": len(over)}


def _nodes_of(site: Site, fleet) -> list:  # type: ignore[no-untyped-def]
    by_rack = {r.name: r for r in site.racks}
    by_node = {nd.name: nd for nd in site.nodes}
    out = []
    for m in fleet.members:
        out += by_rack[m].nodes if m in by_rack else [by_node[m]]
    return out


def _write_calibration(
    store: Store,
    site: Site,
    gpu_ids: list[str],
    cdu_names: list[str],
    now: datetime,
    rng: np.random.Generator,
) -> None:
    """One calibration run as ``twin.calibrate`` stores it: R, C, offset and held-out MAE per
    GPU, the loops' fit flow, and drift events for 0.05 % of the GPUs."""
    g = len(gpu_ids)
    r = R_K_PER_W * rng.uniform(0.97, 1.03, g)
    store.con.execute(
        "INSERT INTO calibration_runs (run_id, fitted_at, window_start, window_end,"
        " holdout_start, gpus, seconds) VALUES (1, ?, ?, ?, ?, ?, 60.0)",
        [now, now - timedelta(minutes=MINUTES), now, now - timedelta(minutes=2), g],
    )
    ids = gpu_ids * 3 + cdu_names
    params = ["r_k_per_w"] * g + ["c_j_per_k"] * g + ["offset_k"] * g
    params += ["flow_ref_lpm"] * len(cdu_names)
    values = np.concatenate([r, TAU_S / r, np.zeros(g), np.full(len(cdu_names), 1800.0)])
    kinds = ["gpu"] * (3 * g) + ["cdu"] * len(cdu_names)
    n = len(ids)
    store.insert_arrow(
        "calibration_params",
        pa.table(
            {
                "run_id": pa.array(np.ones(n, np.int64)),
                "kind": kinds,
                "id": ids,
                "param": params,
                "value": values,
                "stderr": pa.nulls(n, pa.float64()),
                "usable": pa.array(np.ones(n, bool)),
                "reason": pa.nulls(n, pa.string()),
            }
        ),
    )
    store.insert_arrow(
        "calibration_quality",
        pa.table(
            {
                "run_id": pa.array(np.ones(g, np.int64)),
                "kind": ["gpu"] * g,
                "id": gpu_ids,
                "quantity": ["temp_c@holdout"] * g,
                "mae": np.full(g, NOISE_K * 0.8),
                "cv_rmse": np.full(g, 0.01),
                "nmbe": np.zeros(g),
                "mape": np.full(g, 0.005),
                "n": pa.array(np.full(g, 120, np.int64)),
            }
        ),
    )
    drift = rng.choice(g, max(1, g // 2000), replace=False)
    for i in drift:
        store.con.execute(
            "INSERT INTO calibration_events VALUES (1, 'gpu', ?, 'r_k_per_w', ?, ?, ?, ?)",
            [gpu_ids[i], 1.3 * R_K_PER_W, R_K_PER_W, R_K_PER_W, "R 30 % over its fleet"],
        )


# ---- the measuring child ------------------------------------------------------------------------


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _timed(fn, runs: int) -> tuple[list[float], object]:  # type: ignore[no-untyped-def]
    out, res = [], None
    for _ in range(runs):
        t = time.perf_counter()
        res = fn()
        out.append(time.perf_counter() - t)
    return out, res


def _summary(xs: list[float]) -> dict:
    return {"median_s": round(statistics.median(xs), 3), "min_s": round(min(xs), 3)}


def write_node_history(path: Path, n_gpus: int, now: datetime, days: float, seed: int = 8) -> float:
    """``days`` of node power at 300 s ending where the 10 minutes begin: each node's design
    load on a daily cycle (+-25 %, its own phase) with 3 % noise."""
    site = bench_site(n_gpus)
    nodes = [nd.name for nd in site.nodes]
    rng = np.random.default_rng(seed)
    n = int(days * 86400 / 300)
    end_us = int((now - timedelta(minutes=MINUTES)).timestamp() * 1e6)
    ts_us = end_us - (n - np.arange(n)) * 300_000_000
    base = site.nodes[0].spec.base_w + 8 * site.nodes[0].gpu_spec.tdp_w * 0.7
    phase = rng.uniform(0, 2 * np.pi, len(nodes))[None, :]
    day = np.sin(2 * np.pi * (ts_us[:, None] / 1e6) / 86400.0 + phase)
    w = base * (1 + 0.25 * day) * (1 + 0.03 * rng.standard_normal((n, len(nodes))))
    with Store(path) as store:
        store.insert_arrow("node", _table("node", nodes, ts_us, {"power_w": w.round(1)}))
    return days


def floor_select(store: Store, now: datetime) -> int:
    """Every row and column the pass reads, per kind, as plain SELECTs into Arrow."""
    start = now - timedelta(minutes=MINUTES + 1)
    rows = 0
    for kind, cols in FLOOR_READS.items():
        t = store.con.execute(
            f"SELECT ts, id, {', '.join(cols)} FROM {kind} WHERE ts >= ? AND ts <= ?",
            [start, now],
        ).to_arrow_table()
        rows += t.num_rows
    return rows


def floor_windows(store: Store, site: Site, now: datetime) -> None:
    """The same rows through ``load_window`` on the pass's 1 s grid (GPU: the hot spots' 8
    minutes; the rest: their whole window)."""
    from twin.store.windows import load_window

    end = now + timedelta(seconds=1)
    start = end - timedelta(minutes=MINUTES)
    gpu_ids = index_site(site).gpu_ids
    load_window(
        store,
        "gpu",
        end - timedelta(minutes=8),
        end,
        ids=gpu_ids,
        quantities=["power_w", "temp_c", "mem_temp_c"],
    )
    load_window(store, "cdu", start, end, quantities=FLOOR_READS["cdu"][:4])
    load_window(store, "node", start, end, quantities=FLOOR_READS["node"])
    load_window(store, "pdu", start, end, step_s=60.0, quantities=FLOOR_READS["pdu"])


def measure(db: Path, n_gpus: int, step_s: float, now: datetime, runs: int, profile: Path | None):
    from twin.analysis.coverage import missing_kinds
    from twin.analysis.detect import detect, observations, pump_states
    from twin.analysis.fleets import underused_fleets
    from twin.analysis.headroom import compute_headroom
    from twin.analysis.hotspots import find_hotspots
    from twin.forecast import ForecastCache

    site = bench_site(n_gpus)
    store = Store(db, read_only=True)
    rss_before = _rss_mib()
    out: dict = {
        "gpus": n_gpus,
        "step_s": step_s,
        "steps": int(MINUTES * 60 / step_s),
        "rss_before_mib": round(rss_before),
    }
    t = time.perf_counter()
    d = detect(store, site)
    out["first_pass_s"] = round(time.perf_counter() - t, 3)
    assert not d.failures, d.errors
    times, d = _timed(lambda: detect(store, site), runs)
    out["detect"] = _summary(times)
    out["peak_rss_mib"] = round(_peak_rss_mib())
    stages = {
        "headroom": lambda: compute_headroom(store, site, now=d.now),
        "hotspots": lambda: find_hotspots(store, site, now=d.now),
        "pumps": lambda: pump_states(store, site, d.now),
        "fleets": lambda: underused_fleets(store, site, now=d.now),
        "coverage": lambda: missing_kinds(store, site, d.now),
        "observations": lambda: observations(d),
    }
    out["stages"] = {k: _summary(_timed(fn, runs)[0]) for k, fn in stages.items()}
    out["load_basis"] = d.headroom.load_basis
    if d.headroom.load_basis.startswith("forecast"):  # the service's pass, forecast made
        cache = ForecastCache()
        detect(store, site, forecasts=cache)  # what the loop's forecast thread did
        served, _ = _timed(lambda: detect(store, site, forecasts=cache), runs)
        out["detect_served"] = _summary(served)

        def one_step() -> object:  # the thread's work: the forecast rack_ratio_paths asks for
            return ForecastCache().get(store, site, d.now, 3600.0 + 600.0, 300.0)

        out["forecast_step"] = _summary(_timed(one_step, runs)[0])
    out["floor_select"] = _summary(_timed(lambda: floor_select(store, d.now), runs)[0])
    out["floor_rows"] = floor_select(store, d.now)
    out["floor_load_window"] = _summary(_timed(lambda: floor_windows(store, site, d.now), runs)[0])
    out["output"] = {
        "headroom_rows": len(d.headroom.rows),
        "hotspots": len(d.hotspots.hotspots),
        "observations": len(observations(d)),
        "fleets_flagged": sum(f.flagged for f in d.fleets.fleets) if d.fleets else 0,
    }
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        for name, fn in (("detect", lambda: detect(store, site)), *stages.items()):
            if name not in ("detect", "headroom", "hotspots", "fleets"):
                continue
            pr = cProfile.Profile()
            pr.runcall(fn)
            path = profile / f"{name}_{n_gpus}_{step_s:g}s.prof"
            pr.dump_stats(path)
        out["profiles"] = str(profile)
    store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cases",
        default="1000@1,10000@1,100000@10,1000@10,10000@10",
        help="comma-separated GPUS@STEP_S",
    )
    ap.add_argument("--runs", type=int, default=3, help="timed passes per case (after a warm-up)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "detect.json")
    ap.add_argument("--profile", type=Path, default=None, help="write cProfile stats here")
    ap.add_argument("--keep", type=Path, default=None, help="keep the stores in this folder")
    ap.add_argument(
        "--history-days",
        type=float,
        default=0.0,
        help="days of 5-min node power before the 10 minutes (>= 1: the forecast basis)",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # build|measure
    ap.add_argument("--db", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--now", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    cases = []
    for c in args.cases.split(","):
        gpus, _, step = c.partition("@")
        cases.append((int(gpus), float(step or 1)))
    if args.child:
        (n_gpus, step_s), now = cases[0], datetime.fromisoformat(args.now)
        if args.child == "build":
            t = time.perf_counter()
            info = build_store(args.db, n_gpus, step_s, now)
            if args.history_days > 0:
                info["history_days"] = write_node_history(args.db, n_gpus, now, args.history_days)
            info["build_s"] = round(time.perf_counter() - t, 1)
        else:
            info = measure(args.db, n_gpus, step_s, now, args.runs, args.profile)
        print(json.dumps(info))
        return
    now = datetime.now(UTC).replace(microsecond=0)
    result: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python"
        f" {platform.python_version()}",
        "when": now.isoformat(),
        "minutes": MINUTES,
        "cases": [],
    }
    with tempfile.TemporaryDirectory() as d:
        folder = args.keep or Path(d)
        folder.mkdir(parents=True, exist_ok=True)
        for n_gpus, step_s in cases:
            days = f"_{args.history_days:g}d" if args.history_days > 0 else ""
            db = folder / f"detect_{n_gpus}_{step_s:g}s{days}.duckdb"
            case = f"{n_gpus}@{step_s:g}"
            common = [sys.executable, __file__, "--cases", case, "--db", str(db)]
            common += ["--now", now.isoformat(), "--history-days", str(args.history_days)]
            if not db.exists():
                built = json.loads(_child([*common, "--child", "build"]))
            else:
                built = {"reused": str(db)}
            extra = ["--runs", str(args.runs)]
            if args.profile:
                extra += ["--profile", str(args.profile)]
            m = json.loads(_child([*common, "--child", "measure", *extra]))
            row = {**built, **m}
            result["cases"].append(row)
            print(_line(row), flush=True)
            if args.profile:
                _print_profile(args.profile / f"headroom_{n_gpus}_{step_s:g}s.prof")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print()
    print(table(result["cases"]))


def _child(cmd: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:])} failed:\n{p.stderr}")
    return p.stdout.strip().splitlines()[-1]


def _line(r: dict) -> str:
    s = r["stages"]
    cached = (
        f" (served pass {r['detect_served']['median_s']:.2f} s, its forecast"
        f" {r['forecast_step']['median_s']:.2f} s per step)"
        if "detect_served" in r
        else ""
    )
    return (
        f"{r['gpus']:>7,} GPUs @ {r['step_s']:g} s: detect {r['detect']['median_s']:.2f} s{cached}"
        f" (headroom {s['headroom']['median_s']:.2f}, hot spots {s['hotspots']['median_s']:.2f},"
        f" fleets {s['fleets']['median_s']:.2f}); floor SELECT {r['floor_select']['median_s']:.2f}"
        f" s, load_window {r['floor_load_window']['median_s']:.2f} s; peak RSS"
        f" {r['peak_rss_mib']} MiB"
    )


TARGETS = {(10_000, 1.0): 3.0, (100_000, 10.0): 30.0}


def table(rows: list[dict]) -> str:
    """The results as a Markdown table."""
    head = (
        "| GPUs | step | rows (GPU) | detect (median) | served pass / forecast per step |"
        " headroom | hot spots | fleets | pumps + coverage | observations | floor: SELECT |"
        " floor: load_window | peak RSS | target |\n|" + "---|" * 14
    )
    lines = [head]
    for r in rows:
        s = r["stages"]
        target = TARGETS.get((r["gpus"], r["step_s"]))
        judged = r.get("detect_served", r["detect"])["median_s"]
        verdict = (
            ""
            if target is None
            else f"<= {target:g} s: " + ("met" if judged <= target else "NOT met")
        )
        cached = (
            f"{r['detect_served']['median_s']:.2f} s / {r['forecast_step']['median_s']:.2f} s"
            if "detect_served" in r
            else "-"
        )
        lines.append(
            f"| {r['gpus']:,} | {r['step_s']:g} s | {r['gpus'] * r.get('steps', 0):,} |"
            f" {r['detect']['median_s']:.2f} s | {cached} | {s['headroom']['median_s']:.2f} s |"
            f" {s['hotspots']['median_s']:.2f} s | {s['fleets']['median_s']:.2f} s |"
            f" {s['pumps']['median_s'] + s['coverage']['median_s']:.3f} s |"
            f" {s['observations']['median_s']:.2f} s | {r['floor_select']['median_s']:.2f} s |"
            f" {r['floor_load_window']['median_s']:.2f} s | {r['peak_rss_mib']:,} MiB |"
            f" {verdict} |"
        )
    return "\n".join(lines)


def _print_profile(path: Path, top: int = 15) -> None:
    if path.exists():
        st = pstats.Stats(str(path))
        st.sort_stats("cumulative").print_stats(top)


if __name__ == "__main__":
    main()
