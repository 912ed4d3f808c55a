"""What-if benchmark: 24 h of a site at 10 s, read from a bundle and run through the twin.

Builds a synthetic site of ``--gpus`` GPUs (racks of four 8-GPU HGX H200 DLC nodes, a CDU per
eight racks, an A/B PDU pair per rack, half training and half inference) and a 24-hour bundle
of it at 10 s, written with the bundle writer (numpy workload: a training level with dips and an
inference daily cycle, powers from the catalog curve, temperatures from the catalog RC model;
no calibration, so the twin uses the catalog). Then times what ``dctwin whatif`` does: read the
bundle onto its grid, run the baseline and three scenarios (+3 °C facility water, a CDU losing
a pump, four more racks on a CDU), write the report.

    .venv/bin/python bench/bench_whatif.py --gpus 1000
    .venv/bin/python bench/bench_whatif.py --gpus 10016 --make /tmp/b10k   # write the bundle once
    .venv/bin/python bench/bench_whatif.py --bundle /tmp/b10k   # baseline + one scenario, RSS
    .venv/bin/python bench/bench_whatif.py --demo   # shipped bundle, six scenarios, rules

Targets (issue 13): 10,016 GPUs x 24 h at 10 s, baseline and one scenario, <= 60 s and <= 4 GB
peak RSS (``--bundle``: the what-if runs in a process of its own, so the peak is the what-if's);
the demo bundle with the six shipped scenarios <= 10 s (``--demo``).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors.contract import phase_id, sub_id
from twin.alerts.rules import load_rules
from twin.replay.bundle import RESOLUTION, Bundle, Manifest, _quantize, write_parquet
from twin.replay.report import write_report
from twin.replay.scenario import Scenario, load_scenario
from twin.replay.whatif import load, run_all
from twin.site.index import index_site

START = datetime(2026, 11, 23, tzinfo=UTC)
DT = 10.0
NODE_GPUS = 8
RACK_NODES = 4
CDU_RACKS = 8


def make_site(n_gpus: int) -> dict:
    n_racks = max(1, math.ceil(n_gpus / (NODE_GPUS * RACK_NODES)))
    racks, pdus, cdus = [], [], []
    train, infer = [], []
    for r in range(n_racks):
        name = f"r{r:04d}"
        nodes = [{"name": f"{name}-n{k}", "model": "HGX-H200-8-DLC"} for k in range(RACK_NODES)]
        racks.append(
            {
                "name": name,
                "grid": [r % 40, r // 40],
                "pdus": [f"{name}-a", f"{name}-b"],
                "cdu": f"cdu-{r // CDU_RACKS}",
                "nodes": nodes,
            }
        )
        for feed in ("a", "b"):
            pdus.append(
                {
                    "name": f"{name}-{feed}",
                    "feed": feed.upper(),
                    "voltage_v": 415,
                    "rated_current_a": 60,
                }
            )
        (train if r % 2 == 0 else infer).append(name)
    for c in range(math.ceil(n_racks / CDU_RACKS)):
        cdus.append(
            {
                "name": f"cdu-{c}",
                "model": "ROW-CDU-1500",
                "capacity_kw": 350,
                "max_flow_lpm": 525,
                "fw_supply_temp_c": 30,
            }
        )
    return {
        "name": "bench",
        "halls": [{"name": "hall", "rows": [{"name": "row", "racks": racks}]}],
        "pdus": pdus,
        "cdus": cdus,
        "fleets": [
            {"name": "train", "role": "training", "members": train},
            {"name": "infer", "role": "inference", "members": infer or train[:1]},
        ],
    }


def _table(kind: str, ts: np.ndarray, ids: list[str], sources: list[str], cols: dict) -> pa.Table:
    """Rows in (id, ts) order, ids and sources dictionary-encoded (no per-row Python strings)."""
    n_t, n = len(ts), len(ids)
    id_idx = np.repeat(np.arange(n, dtype=np.int32), n_t)
    src_names = sorted(set(sources))
    src_pos = {x: i for i, x in enumerate(src_names)}
    src_of = np.array([src_pos[x] for x in sources], dtype=np.int32)
    data = {
        "ts": pa.array(np.tile(ts, n), pa.timestamp("us", tz="UTC")),
        "source": pa.DictionaryArray.from_arrays(pa.array(src_of[id_idx]), pa.array(src_names)),
        "id": pa.DictionaryArray.from_arrays(pa.array(id_idx), pa.array(ids)),
    }
    for q, res in RESOLUTION[kind].items():
        v = cols.get(q)
        if v is not None:
            data[q] = pa.array(np.ascontiguousarray(v.T).reshape(-1))
        else:  # not measured: nulls (integers cannot hold NaN)
            data[q] = pa.nulls(n_t * n, pa.int64() if res is None else pa.float64())
    return pa.table(data)


def make_bundle(site_raw: dict, out: Path) -> None:
    from twin.site import Site

    site = Site.model_validate(site_raw)
    out.mkdir(parents=True)
    (out / "site.yaml").write_text(yaml.safe_dump(site_raw))
    n_t = round(86400 / DT)
    t_s = np.arange(n_t) * DT
    ts = (START.timestamp() * 1e6 + t_s * 1e6).astype(np.int64)
    nodes = site.nodes
    idx = index_site(site)
    gpu_ids, gpu_src = idx.gpu_ids, idx.gpu_node
    role = {f.name: f.role for f in site.fleets}
    training = np.array([role.get(f) == "training" for f in idx.gpu_fleet])
    g = len(gpu_ids)
    daily = 0.15 + 0.5 * np.maximum(0, np.sin(2 * np.pi * (t_s / 3600 - 8) / 24))
    dips = (t_s % 1800) < 60
    supply = 34.0
    # the GPU table is written a block of nodes at a time (one row group each), so a 10,000-GPU
    # day (86 M rows) never sits in memory whole
    gpus_per_node = NODE_GPUS
    block = 64 * gpus_per_node
    node_p = np.empty((n_t, len(nodes)))
    writer = None
    for lo in range(0, g, block):
        hi = min(lo + block, g)
        rng_b = np.random.default_rng([0, lo])
        tr = training[lo:hi]
        act = np.where(tr[None, :], np.where(dips[:, None], 0.1, 0.9), daily[:, None])
        act = np.clip(act + 0.03 * rng_b.standard_normal((n_t, hi - lo)), 0, 1)
        power = 75 + (700 - 75) * act**0.9
        temp = supply + 0.03 * power + 0.3 * rng_b.standard_normal((n_t, hi - lo))
        t = _quantize(
            "gpu",
            _table(
                "gpu",
                ts,
                gpu_ids[lo:hi],
                gpu_src[lo:hi],
                {
                    "power_w": power,
                    "temp_c": temp,
                    "mem_temp_c": temp + 3,
                    "sm_active": act,
                    "power_limit_w": np.full((n_t, hi - lo), 700.0),
                },
            ),
        )
        t = t.cast(t.schema.set(t.schema.get_field_index("id"), pa.field("id", pa.string())))
        t = t.cast(
            t.schema.set(t.schema.get_field_index("source"), pa.field("source", pa.string()))
        )
        if writer is None:
            writer = pq.ParquetWriter(
                out / "gpu.parquet",
                t.schema,
                compression="zstd",
                compression_level=3,
                use_dictionary=["source", "id"],
            )
        writer.write_table(t)
        nb = (hi - lo) // gpus_per_node
        node_p[:, lo // gpus_per_node : lo // gpus_per_node + nb] = (
            power.reshape(n_t, nb, gpus_per_node).sum(axis=2) * 1.1 / 0.96 + 800
        )
    writer.close()
    rows = {}
    rows["node"] = _table(
        "node",
        ts,
        [nd.name for nd in nodes],
        [nd.name for nd in nodes],
        {"power_w": node_p, "inlet_temp_c": np.full(node_p.shape, 24.0)},
    )
    racks = site.racks
    rack_p = node_p.reshape(n_t, len(racks), RACK_NODES).sum(axis=2)
    pdu_ids, pdu_src, pdu_pw, pdu_cur = [], [], [], []
    for r_i, r in enumerate(racks):
        for p in r.pdus:
            pdu_ids.append(p)
            pdu_src.append(p)
            pdu_pw.append(rack_p[:, r_i] / 2)
            pdu_cur.append(np.full(n_t, np.nan))
            for k in (1, 2, 3):
                pdu_ids.append(phase_id(p, k))
                pdu_src.append(p)
                pdu_pw.append(rack_p[:, r_i] / 6)
                pdu_cur.append(rack_p[:, r_i] / 6 / (240 * 0.98))
    rows["pdu"] = _table(
        "pdu",
        ts,
        pdu_ids,
        pdu_src,
        {"power_w": np.column_stack(pdu_pw), "current_a": np.column_stack(pdu_cur)},
    )
    cdus = site.cdus
    heat = np.zeros((n_t, len(cdus)))
    for r_i, r in enumerate(racks):
        heat[:, int(r.cdu.split("-")[1])] += 0.75 * rack_p[:, r_i] / 1000
    flow = np.full(heat.shape, 420.0)
    ret = supply + heat / (1.03 * 3.9 * flow / 60)
    c_ids, c_src, c_cols = (
        [],
        [],
        {
            q: []
            for q in (
                "supply_temp_c",
                "return_temp_c",
                "flow_lpm",
                "heat_kw",
                "fw_supply_temp_c",
                "pump_speed_pct",
            )
        },
    )
    for i, c in enumerate(cdus):
        for sid, vals in (
            (
                c.name,
                {
                    "supply_temp_c": np.full(n_t, supply),
                    "return_temp_c": ret[:, i],
                    "flow_lpm": flow[:, i],
                    "heat_kw": heat[:, i],
                    "fw_supply_temp_c": np.full(n_t, 30.0),
                },
            ),
            *((sub_id(c.name, p), {"pump_speed_pct": np.full(n_t, 80.0)}) for p in c.pumps),
        ):
            c_ids.append(sid)
            c_src.append(c.name)
            for q in c_cols:
                c_cols[q].append(vals.get(q, np.full(n_t, np.nan)))
    rows["cdu"] = _table(
        "cdu", ts, c_ids, c_src, {q: np.column_stack(v) for q, v in c_cols.items()}
    )
    counts = {"gpu": g * n_t}
    for kind, t in rows.items():
        write_parquet(_quantize(kind, t), out / f"{kind}.parquet")
        counts[kind] = t.num_rows
    m = Manifest(
        site=site.name,
        start=START,
        end=START + timedelta(days=1),
        resolution_s=DT,
        rows=counts,
        resolutions={k: dict(RESOLUTION[k]) for k in counts},
        calibration_run=None,
        created_at=datetime.now(UTC),
        notes="bench_whatif",
    )
    (out / "manifest.json").write_text(m.model_dump_json())


def _scenarios() -> list[Scenario]:
    return [
        Scenario.model_validate(
            {"name": "fw-plus-3", "changes": [{"op": "facility_water", "delta_k": 3}]}
        ),
        Scenario.model_validate(
            {
                "name": "cdu-0-pump",
                "changes": [{"op": "fail_pump", "cdu": "cdu-0", "pump": "pump1"}],
            }
        ),
        Scenario.model_validate(
            {
                "name": "plus-4-racks",
                "changes": [
                    {
                        "op": "add_racks",
                        "count": 4,
                        "node_model": "HGX-H200-8-DLC",
                        "nodes_per_rack": 4,
                        "cdu": "cdu-0",
                        "fleet": "infer",
                        "like_rack": "r0000",
                    }
                ],
            }
        ),
    ]


def _peak_rss_mb() -> float:
    """Peak resident set of this process (Linux reports KiB). [MB]"""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _whatif(bundle_dir: Path, scen: list[Scenario], rules_path: Path | None) -> dict:
    """Time what ``dctwin whatif`` does on a bundle: read, baseline, scenarios, report."""
    rules = load_rules(rules_path) if rules_path else None
    t0 = time.perf_counter()
    b = Bundle.load(bundle_dir)
    d = load(b)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    starts: list[float] = []  # when each run started, from t0
    base, runs = run_all(d, scen, rules, progress=lambda _: starts.append(time.perf_counter() - t0))
    t_runs = time.perf_counter() - t0
    each = np.diff([*starts, t_runs])
    with tempfile.TemporaryDirectory() as tmp:
        t1 = time.perf_counter()
        write_report(b, base, runs, Path(tmp) / "report")
        t_report = time.perf_counter() - t1
    return {
        "gpus": len(d.idx.gpu_ids),
        "steps": d.n,
        "step_s": d.dt_s,
        "load_s": round(t_load, 2),
        # the baseline and the scenarios (twin.replay.whatif.run_all), and each run's own
        "runs_s": round(t_runs, 2),
        "baseline_s": round(each[0], 2),
        "scenarios_s": [round(x, 2) for x in each[1:]],
        "report_s": round(t_report, 2),
        "total_s": round(t_load + t_runs + t_report, 2),
        "peak_rss_mb": round(_peak_rss_mb(), 0),
        "verdicts": {r.name: r.verdict for r in runs},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--make", type=Path, help="only write the synthetic bundle into this folder")
    ap.add_argument("--bundle", type=Path, help="time the what-if of this bundle (from --make)")
    ap.add_argument(
        "--demo",
        action="store_true",
        help="the shipped demo bundle with the six shipped scenarios and the shipped rules",
    )
    args = ap.parse_args()
    if args.make:
        t0 = time.perf_counter()
        make_bundle(make_site(args.gpus), args.make)
        print(json.dumps({"make_bundle_s": round(time.perf_counter() - t0, 1)}))
        return 0
    if args.demo:
        repo = Path(__file__).resolve().parents[1]
        site = Bundle.load(repo / "sample_telemetry" / "demo_bundle").site
        scen = [
            load_scenario(f, site)
            for f in sorted((repo / "sample_telemetry" / "scenarios").glob("*.yaml"))
        ]
        res = _whatif(
            repo / "sample_telemetry" / "demo_bundle", scen, repo / "deploy" / "alert_rules.yaml"
        )
    elif args.bundle:
        res = _whatif(args.bundle, _scenarios()[:1], None)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            make_bundle(make_site(args.gpus), Path(tmp) / "b")
            res = _whatif(Path(tmp) / "b", _scenarios(), None)
    print(json.dumps(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
