"""Hot before it is hot (issue 16 item 4): the residual and drift detectors page a degrading
cold plate before the 5 K threshold does, and say what they saw.

- A hand-built store (the small site, one calibration run): one GPU's R ramps up 30 % over an
  hour among a healthy fleet, on warm water so that it ends within 5 K of its limit. The
  service's detection pass (``twin.analysis.detect``) runs every minute into the alert engine with
  the shipped rules: the first residual or drift page comes before ``headroom.gpu.k_to_slowdown``
  reaches 5 K, and its summary names the measured and the modelled figures.
- The shipped demo bundle through ``dctwin whatif --json``: the degrading cold plate's first
  page is a residual or drift page, an hour or more before ``gpu_temp_high`` would page (which it
  then mutes), and no healthy
  GPU gets a residual or drift page all day.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from twin.alerts import AlertEngine, Topology, load_rules
from twin.alerts.metrics import DRIFT_GPU_R, HEADROOM_GPU_K_TO_SLOWDOWN
from twin.analysis.detect import detect, observations
from twin.cli import app
from twin.site import Site, load_site
from twin.store import Store
from twin.store.schema import arrow_schema

from .helpers import REPO, SMALL_SITE

RULES = REPO / "deploy" / "alert_rules.yaml"
BUNDLE = REPO / "sample_telemetry" / "demo_bundle"
DEMO_GPU = "trn-a03-n2:5"  # the bundle's cold_plate_decay target (manifest notes)
T0 = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
STEP_S = 10.0
HEALTHY_S = 3600.0  # an hour before the fault
RAMP_S = 3600.0  # R +30 % over the next hour ...
AFTER_S = 1200.0  # ... and 20 min held there
R0 = 0.045  # the fleet's R [K/W] (a cold plate within docs/physics.md §9.2's 0.02-0.05)
C_J_PER_K = 400.0
SUPPLY_C = 42.0  # W45 warm water: the ramped GPU ends ~4 K from its 87 °C limit
FAULTY = "trn-r01-n1:3"


def _table(kind: str, ids: list[str], ts_us: np.ndarray, values: dict[str, np.ndarray]):
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


def _ramp_store(path: Path, site: Site) -> tuple[list[str], np.ndarray]:
    """The hand-built telemetry and its calibration; returns the GPU ids and the times."""
    rng = np.random.default_rng(3)
    gpu_ids = [g for nd in site.nodes for g in nd.gpu_ids()]
    g = len(gpu_ids)
    n = int((HEALTHY_S + RAMP_S + AFTER_S) / STEP_S)
    t = np.arange(n) * STEP_S
    ts_us = int(T0.timestamp() * 1e6) + (t * 1e6).astype(np.int64)
    r = R0 * rng.uniform(0.95, 1.05, g)  # healthy cold plates spread a little
    j = gpu_ids.index(FAULTY)
    ramp = np.clip((t - HEALTHY_S) / RAMP_S, 0.0, 1.0)
    r_t = np.broadcast_to(r, (n, g)).copy()
    r_t[:, j] = r[j] * (1.0 + 0.30 * ramp)
    # training load with a checkpoint dip every 30 min, a little noise
    busy = np.where((t % 1800.0) < 1740.0, 700.0, 150.0)
    power = busy[:, None] + rng.normal(0.0, 5.0, (n, g))
    temp = np.empty((n, g))
    temp[0] = SUPPLY_C + r * power[0]
    for k in range(1, n):  # the RC model, exact for a power held over the step
        a = np.exp(-STEP_S / (r_t[k] * C_J_PER_K))
        steady = SUPPLY_C + r_t[k] * power[k - 1]
        temp[k] = steady + (temp[k - 1] - steady) * a
    temp_read = np.round(temp + rng.normal(0.0, 0.2, (n, g)))  # 1 K sensors
    cdu_names = [c.name for c in site.cdus]
    with Store(path) as store:
        store.insert_arrow(
            "gpu",
            _table(
                "gpu",
                gpu_ids,
                ts_us,
                {
                    "power_w": power.round(1),
                    "temp_c": temp_read,
                    "mem_temp_c": temp_read + 5.0,
                    "power_limit_w": np.full((n, g), 700.0),
                    "sm_active": np.full((n, g), 0.9),
                    "util_pct": np.full((n, g), 95.0),
                },
            ),
        )
        store.insert_arrow(
            "cdu",
            _table(
                "cdu",
                cdu_names,
                ts_us,
                {
                    "supply_temp_c": np.full((n, len(cdu_names)), SUPPLY_C),
                    "return_temp_c": np.full((n, len(cdu_names)), SUPPLY_C + 8.0),
                    "flow_lpm": np.full((n, len(cdu_names)), 300.0),
                },
            ),
        )
        params, quality = [], []
        for i, gid in enumerate(gpu_ids):  # calibrated on the healthy hour
            for name, value in (("r_k_per_w", r[i]), ("c_j_per_k", C_J_PER_K), ("offset_k", 0.0)):
                params.append(
                    {"kind": "gpu", "id": gid, "param": name, "value": float(value),
                     "stderr": None, "usable": True, "reason": None}
                )  # fmt: skip
            quality.append(
                {"kind": "gpu", "id": gid, "quantity": "temp_c@600s", "mae": 0.2,
                 "cv_rmse": 0.003, "nmbe": 0.0, "mape": 0.003, "n": 60}
            )  # fmt: skip
        for c in cdu_names:
            params.append(
                {"kind": "cdu", "id": c, "param": "flow_ref_lpm", "value": 300.0,
                 "stderr": None, "usable": True, "reason": None}
            )  # fmt: skip
        run = {
            "fitted_at": T0 + timedelta(seconds=HEALTHY_S),
            "window_start": T0,
            "window_end": T0 + timedelta(seconds=HEALTHY_S),
            "holdout_start": T0 + timedelta(seconds=HEALTHY_S - 1200),
            "gpus": g,
            "racks": len(site.racks),
            "cdus": len(cdu_names),
            "seconds": 0.0,
        }
        store.save_calibration_run(run, params, quality, [])
    return gpu_ids, t


@pytest.mark.slow  # ~80 detection passes: out of the fast tier
def test_a_30_percent_r_ramp_pages_before_5_k_from_slowdown(tmp_path: Path) -> None:
    site = load_site(SMALL_SITE)
    db = tmp_path / "ramp.duckdb"
    _ramp_store(db, site)
    rules = load_rules(RULES)
    engine = AlertEngine(rules, Topology.from_site(site), None)
    first_page: dict[str, tuple[float, str]] = {}
    hot_at = None
    healthy_pages: list[str] = []
    with Store(db, read_only=True) as store:
        for minute in range(0, int((RAMP_S + AFTER_S) / 60) + 1):
            now = T0 + timedelta(seconds=HEALTHY_S + 60 * minute)
            obs = observations(detect(store, site, now=now, fleets=False))
            k = next(
                o.value
                for o in obs
                if o.metric == HEADROOM_GPU_K_TO_SLOWDOWN and o.entity_id == FAULTY
            )
            if hot_at is None and k <= 5.0:
                hot_at = minute
            for note in engine.evaluate(obs, now=now):
                if note.status != "firing":
                    continue
                if FAULTY in note.summary:
                    first_page.setdefault(note.rule, (minute, note.summary))
                elif note.rule in ("gpu_hotspot_residual", "gpu_r_drift"):
                    healthy_pages.append(note.summary)
            if minute % 20 == 0:
                drift = {o.entity_id: o for o in obs if o.metric == DRIFT_GPU_R}
                assert set(drift[FAULTY].labels) >= {"r_k_per_w", "fleet_r_k_per_w"}
    print("pages:", first_page, "k <= 5 at minute", hot_at)
    assert hot_at is not None, "the hand-built ramp must take the GPU within 5 K of its limit"
    model_pages = {
        r: v for r, v in first_page.items() if r in ("gpu_hotspot_residual", "gpu_r_drift")
    }
    assert model_pages, first_page
    first_rule, (at, _) = min(model_pages.items(), key=lambda kv: kv[1][0])
    assert at < hot_at, (first_rule, at, hot_at)
    if "gpu_hotspot_residual" in model_pages:  # K over the model, in sigmas, and sigma
        text = model_pages["gpu_hotspot_residual"][1]
        m = re.search(
            r"runs ([\d.]+) K above its thermal model \(([\d.]+) sigma of ([\d.]+) K\)", text
        )
        assert m, text
        excess, z, sigma = float(m[1]), float(m[2]), float(m[3])
        assert z >= 4 and excess >= 3 and excess == pytest.approx(z * sigma, abs=0.1)
    if "gpu_r_drift" in model_pages:  # R against the fleet's
        text = model_pages["gpu_r_drift"][1]
        m = re.search(r"R ([\d.]+) K/W, fleet median ([\d.]+) K/W", text)
        assert m, text
        assert float(m[1]) > 1.25 * float(m[2]) and abs(float(m[2]) - R0) < 0.1 * R0
    # the threshold page is muted while the model page that names the GPU is open (shipped
    # rules: gpu_hotspot_residual and gpu_r_drift inhibit gpu_temp_high): one incident
    assert "gpu_temp_high" not in first_page, first_page
    assert healthy_pages == []


def _demo_alerts(tmp_path: Path) -> list[dict]:
    """The baseline's alerts of `dctwin whatif --json` on the demo bundle (the scenario, a
    lost feed, leaves the GPUs as recorded)."""
    scen = REPO / "sample_telemetry" / "scenarios" / "feed-a-lost-on-d08.yaml"
    res = CliRunner().invoke(
        app,
        ["whatif", str(BUNDLE), str(scen), "--rules", str(RULES), "--out", str(tmp_path), "--json"],
    )
    assert res.exit_code == 0, res.output
    (base,) = [r for r in json.loads(res.stdout) if r["name"] == "baseline"]
    return base["alerts"]


@pytest.mark.slow  # the demo day through what-if: out of the fast tier
def test_demo_day_pages_the_cold_plate_from_its_model_before_the_threshold(tmp_path) -> None:
    alerts = _demo_alerts(tmp_path)
    mine = [a for a in alerts if a["status"] == "firing" and DEMO_GPU in a["summary"]]
    assert mine, alerts
    first = mine[0]
    print(f"first model page {first['rule']} at {first['at']}")
    assert first["rule"] in ("gpu_hotspot_residual", "gpu_r_drift")
    # one incident: the threshold page (09:19 on the demo day without the model pages) is
    # muted by the open model page, so it never pages; the model page came well before it
    assert [a["rule"] for a in mine] == [first["rule"]], mine
    threshold_at = datetime(2026, 11, 23, 9, 19, tzinfo=UTC)
    lead_min = (threshold_at - datetime.fromisoformat(first["at"])).total_seconds() / 60.0
    assert lead_min >= 60
    # the fault starts at 06:00 (manifest: cold_plate_decay@6h+4h): nothing before it
    assert datetime.fromisoformat(first["at"]) >= datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
    unrelated = [
        a
        for a in alerts
        if a["rule"] in ("gpu_hotspot_residual", "gpu_r_drift") and DEMO_GPU not in a["summary"]
    ]
    assert unrelated == []


@pytest.mark.slow  # the demo bundle loaded and its series computed twice: out of the fast tier
def test_replay_series_see_only_the_past_and_say_what_they_saw() -> None:
    import dataclasses

    from twin.replay.bundle import Bundle
    from twin.replay.hotspot_feed import hotspot_series, labels_at
    from twin.replay.whatif import load

    d = load(Bundle.load(BUNDLE))
    residual, drift = hotspot_series(d)
    j = residual.ids.index(DEMO_GPU)
    at = 7 * 60 + 3  # 07:03, an evaluation minute (one per minute from 00:00)
    lab = labels_at(drift, at, j)
    r, fleet = float(lab["r_k_per_w"]), float(lab["fleet_r_k_per_w"])
    assert r > 1.25 * fleet and drift.values[at, j] == pytest.approx(r / fleet - 1, abs=2e-3)
    assert set(labels_at(residual, at, j)) == {"excess_k", "measured_c", "model_c", "sigma_k"}
    # a change from the 08:00:00 sample on moves nothing before 08:00; the 08:00 evaluation
    # sees that sample, the newest a live pass at 08:00 reads (its last minute ends with it)
    cut = 8 * 360  # samples at 10 s
    temp = d.gpu_temp_c.copy()
    temp[cut:] += 10.0
    res2, drift2 = hotspot_series(dataclasses.replace(d, gpu_temp_c=temp, cache={}))
    row = cut // 6
    for a, b in ((residual.values, res2.values), (drift.values, drift2.values)):
        assert np.array_equal(a[:row], b[:row], equal_nan=True)
    assert not np.array_equal(drift.values[row], drift2.values[row], equal_nan=True)
    assert np.nanmin(res2.values[row + 6 :, j] - residual.values[row + 6 :, j]) > 0
