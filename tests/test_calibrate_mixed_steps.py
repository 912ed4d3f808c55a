"""Calibration when devices report at different or irregular steps (issue 14, item 1).

Two simulated hours of the small site at 1 Hz go through the ingest path into two stores:

- *two exporters*: the GPUs and node of ``trn-r01-n1`` at 1 Hz, those of ``trn-r01-n2`` and
  ``inf-r02-n1`` scraped every 10 s (the tick's point reading kept, the others dropped); PDUs
  and the CDU at 1 Hz. Each GPU must be fitted at its own step, not all coarsened to 10 s.
- *jittered*: every node's GPU and node readings about every 10 s, each 10 s +- 3 s from its
  nominal time, 3 % of them dropped. Calibration resamples them onto a 10 s grid whose phase
  is the timestamps' median (gaps stay NaN and count as gaps), see twin/calibrate/calibrate.py.

`dctwin calibrate` runs on both; R and C are held to tests/test_calibrate_any_step.py's
tolerances.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from collectors.contract import topic_for
from twin.cli import app
from twin.ingest import Ingester, IngestLimits
from twin.simulator import SiteSimulator
from twin.site import load_site
from twin.store import Store
from twin.store.schema import arrow_schema

from .helpers import SMALL_SITE

#: the tolerances of tests/test_calibrate_any_step.py and tests/test_calibrate.py (1 Hz)
THERMAL_TOL = {"r_k_per_w": 0.05, "c_j_per_k": 0.15, "mem_r_k_per_w": 0.05, "mem_c_j_per_k": 0.15}

HOURS = 2
FAST_NODE = "trn-r01-n1"  # 1 Hz in the two-exporter store
SLOW_NODES = ("trn-r01-n2", "inf-r02-n1")  # 10 s there
JITTER_S, DROP = 3, 0.03


def _calibrate_cli(db) -> dict:
    res = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--db",
            str(db),
            "--site",
            str(SMALL_SITE),
            "--window",
            str(HOURS * 3600),
            "--holdout",
            "1200",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mixed")
    site = load_site(SMALL_SITE)
    start = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
    sim = SiteSimulator(site, seed=23, start=start, rate_hz=1.0)
    node_of = {}
    for node in (FAST_NODE, *SLOW_NODES):
        node_of[topic_for(site.name, "gpu", node)] = node
        node_of[topic_for(site.name, "node", node)] = node
    # jittered schedule: per node and 10 s interval j, one tick 10 j + 5 +- 3 s, 3 % dropped
    rng = np.random.default_rng(3)
    n_int = HOURS * 360
    keep = {
        node: {
            10 * j + 5 + int(rng.integers(-JITTER_S, JITTER_S + 1))
            for j in range(n_int)
            if rng.random() >= DROP
        }
        for node in (FAST_NODE, *SLOW_NODES)
    }
    with Store(tmp / "mixed.duckdb") as mixed, Store(tmp / "jitter.duckdb") as jitter:
        ing_m = Ingester(mixed, site, IngestLimits(max_past_s=0))
        ing_j = Ingester(jitter, site, IngestLimits(max_past_s=0))
        buf_m: list[tuple[str, bytes]] = []
        buf_j: list[tuple[str, bytes]] = []
        for tick in range(HOURS * 3600):
            for topic, payload in sim.step():
                node = node_of.get(topic)
                if node is None or node == FAST_NODE or tick % 10 == 9:
                    buf_m.append((topic, payload))
                if node is None or tick in keep[node]:
                    buf_j.append((topic, payload))
            if len(buf_m) > 5000:
                ing_m.ingest(buf_m)
                ing_j.ingest(buf_j)
                buf_m, buf_j = [], []
        ing_m.ingest(buf_m)
        ing_j.ingest(buf_j)
    return (
        (tmp / "mixed.duckdb", _calibrate_cli(tmp / "mixed.duckdb")),
        (tmp / "jitter.duckdb", _calibrate_cli(tmp / "jitter.duckdb")),
        sim.truth(),
    )


def _saved(db, run_id: int, param: str) -> dict[str, tuple[float, bool, str | None]]:
    with Store(db, read_only=True) as store:
        rows = store.con.execute(
            "SELECT id, value, usable, reason FROM calibration_params"
            " WHERE run_id = ? AND kind = 'gpu' AND param = ?",
            [run_id, param],
        ).fetchall()
    return {gid: (v, u, r) for gid, v, u, r in rows}


def _check_thermal(db, result, truth, gpus: list[str], at_least: dict[str, int]) -> None:
    for param, tol in THERMAL_TOL.items():
        got = _saved(db, result["run"]["run_id"], param)
        usable = [g for g in gpus if got[g][1]]
        for gid in usable:
            true = truth["gpus"][gid][param]
            assert abs(got[gid][0] / true - 1) <= tol, (gid, param, got[gid], true)
        for gid in set(gpus) - set(usable):  # refused for identifiability, never for gaps
            reason = got[gid][2] or ""
            assert "gaps" not in reason and "too few" not in reason, (gid, param, reason)
        assert len(usable) >= at_least.get(param, len(gpus)), (param, len(usable), len(gpus))


@pytest.mark.slow  # 2 simulated hours at 1 Hz into two stores, calibrated twice: ~30 s
def test_two_exporters_each_gpu_is_fitted_at_its_own_step(stores):
    (db, result), _, truth = stores
    groups = {g["step_s"]: g["gpus"] for g in result["run"]["step_groups"]}
    assert groups == {1.0: 8, 10.0: 16}, result["run"]["step_groups"]
    steps = _saved(db, result["run"]["run_id"], "step_s")  # the saved run says which
    fast = [g for g in steps if g.startswith(FAST_NODE + ":")]
    slow = [g for g in steps if g.split(":")[0] in SLOW_NODES]
    assert len(fast) == 8 and len(slow) == 16
    assert all(steps[g][0] == 1.0 for g in fast) and all(steps[g][0] == 10.0 for g in slow)
    # the 1 Hz GPUs as at 1 Hz: every R and C usable within tolerance (measured: C within
    # 1.2 %; coarsened to 10 s they would be fitted on a tenth of their readings)
    _check_thermal(db, result, truth, fast, {})
    # the 10 s point readings: every R; C where the readings identify it (measured: 16 of 16,
    # R within 1.4 %, C within 14.3 %, HBM C within 7.7 %)
    _check_thermal(db, result, truth, slow, {"c_j_per_k": 12, "mem_c_j_per_k": 12})


@pytest.mark.slow  # module fixture: ~30 s
def test_jittered_and_dropped_10_s_readings_calibrate(stores):
    _, (db, result), truth = stores
    assert result["run"]["step_groups"] == [{"step_s": 10.0, "gpus": 24}]
    gpus = list(truth["gpus"])
    # measured: 24 of 24 for each, R within 0.8 %, C within 7.0 %, HBM C within 5.3 %
    _check_thermal(db, result, truth, gpus, {"c_j_per_k": 20, "mem_c_j_per_k": 20})


def test_gpus_are_grouped_by_rate_and_rare_ones_do_not_stop_the_rest(tmp_path) -> None:
    from datetime import timedelta

    from twin.calibrate.calibrate import step_groups
    from twin.site.index import index_site

    idx = index_site(load_site(SMALL_SITE))
    t0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
    rate = {g: (10.0 if g.startswith("trn-r01-n2:") else 1.0) for g in idx.gpu_ids}
    rate["inf-r02-n1:0"] = 300.0  # its exporter mostly down: 3 samples in 10 minutes
    del rate["inf-r02-n1:1"]  # never reported
    ids, times = [], []
    for gid, step in rate.items():
        for s in np.arange(0.0, 600.0, step):
            ids.append(gid)
            times.append(t0 + timedelta(seconds=float(s)))
    schema = arrow_schema("gpu")
    cols = {"ts": times, "source": [i.split(":")[0] for i in ids], "id": ids}
    cols |= {f.name: [100.0] * len(ids) for f in schema if f.name == "power_w"}
    cols |= {f.name: [None] * len(ids) for f in schema if f.name not in cols}
    with Store(tmp_path / "s.duckdb") as store:
        store.insert_arrow("gpu", pa.table(cols, schema=schema))
        groups = step_groups(store, idx, t0, t0 + timedelta(minutes=10))
    got = {step: sorted(idx.gpu_ids[g] for g in members) for step, members in groups}
    assert sorted(got) == [1.0, 10.0]
    assert got[10.0] == sorted(
        [g for g in idx.gpu_ids if g.startswith("trn-r01-n2:")] + ["inf-r02-n1:0", "inf-r02-n1:1"]
    )  # the rare and the silent GPU on the coarsest grid: refused there for their gaps
    assert len(got[1.0]) == 14
