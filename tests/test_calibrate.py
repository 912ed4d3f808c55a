"""Calibration against the store: recovery of the simulator's true parameters, held-out
prediction quality, drift events, and the `dctwin calibrate` command.

One 2-hour, 1 Hz run of the small site (with a degraded cold plate on one GPU) is simulated,
ingested through the normal path, and calibrated once for the whole module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from twin.calibrate.calibrate import calibrate, save_run
from twin.ingest import Ingester, IngestLimits
from twin.simulator import SiteSimulator, parse_fault
from twin.site import load_site
from twin.store import Store

from .helpers import SMALL_SITE

FAULTY = "trn-r01-n2:5"
HOURS = 2


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    site = load_site(SMALL_SITE)
    start = (datetime.now(UTC) - timedelta(hours=HOURS + 1)).replace(
        minute=0, second=0, microsecond=0
    )
    sim = SiteSimulator(
        site, seed=11, start=start, rate_hz=1.0, faults=[parse_fault(f"cold_plate:{FAULTY}@0=1.0")]
    )
    db = tmp_path_factory.mktemp("cal") / "cal.duckdb"
    store = Store(db)
    ingester = Ingester(store, site, IngestLimits(max_past_s=0))
    batch: list[tuple[str, bytes]] = []
    for _ in range(HOURS * 3600):
        batch.extend(sim.step())
        if len(batch) > 5000:
            ingester.ingest(batch)
            batch = []
    ingester.ingest(batch)
    result = calibrate(store, site, window_s=HOURS * 3600.0, holdout_s=1200.0)
    save_run(store, result)
    yield store, result, sim.truth(), db
    store.close()


def _params(result, kind, param):
    return {p["id"]: p for p in result["params"] if p["kind"] == kind and p["param"] == param}


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_thermal_parameters_recovered_for_every_gpu(calibrated):
    _, result, truth, _ = calibrated
    for param, tol in (
        ("r_k_per_w", 0.05),
        ("c_j_per_k", 0.15),
        ("mem_r_k_per_w", 0.05),
        ("mem_c_j_per_k", 0.15),
    ):
        fitted = _params(result, "gpu", param)
        assert set(fitted) == set(truth["gpus"])
        for gid, p in fitted.items():
            assert p["usable"], (gid, param, p["reason"])
            true = truth["gpus"][gid][param]
            if gid == FAULTY and param == "r_k_per_w":
                true *= 2.0  # the injected fault doubles the core's R
            assert abs(p["value"] / true - 1) <= tol, (gid, param, p["value"], true)


@pytest.mark.slow  # 2 simulated hours at 1 Hz (module fixture): out of the fast tier
def test_capture_fraction_recovered_per_rack(calibrated):
    _, result, truth, _ = calibrated
    fitted = _params(result, "rack", "capture_fraction")
    for rack, t in truth["racks"].items():
        assert fitted[rack]["usable"], fitted[rack]["reason"]
        assert abs(fitted[rack]["value"] - t["capture_fraction"]) <= 0.02


@pytest.mark.slow  # 2 simulated hours at 1 Hz (module fixture): out of the fast tier
def test_power_curve_is_recovered_or_refused_with_a_reason(calibrated):
    _, result, truth, _ = calibrated
    idle = _params(result, "gpu", "idle_w")
    limit = _params(result, "gpu", "limit_w")
    for gid, t in truth["gpus"].items():
        if idle[gid]["usable"]:
            assert abs(idle[gid]["value"] / t["idle_w"] - 1) <= 0.03, gid
            assert abs(limit[gid]["value"] / t["limit_w"] - 1) <= 0.03, gid
        else:
            assert idle[gid]["value"] is None or idle[gid]["reason"], gid
            assert "identifiable" in idle[gid]["reason"] or "range" in idle[gid]["reason"], idle[
                gid
            ]


@pytest.mark.slow  # 2 simulated hours at 1 Hz (module fixture): out of the fast tier
def test_held_out_prediction_quality(calibrated):
    _, result, _, _ = calibrated
    q = result["quality"]
    temp = [r["mae"] for r in q if r["quantity"] == "temp_c@600s" and r["id"] != FAULTY]
    assert temp and max(temp) <= 1.0
    rack = [r["mape"] for r in q if r["kind"] == "rack"]
    assert rack and max(rack) <= 0.02
    ret = [r["mae"] for r in q if r["kind"] == "cdu"]
    assert ret and max(ret) <= 0.5
    for r in q:  # CV(RMSE) and NMBE are reported for every quantity
        assert r["cv_rmse"] is not None and r["nmbe"] is not None, r


@pytest.mark.slow  # 2 simulated hours at 1 Hz (module fixture): out of the fast tier
def test_degraded_cold_plate_is_a_drift_event(calibrated):
    _, result, _, _ = calibrated
    ids = [e["id"] for e in result["events"]]
    assert ids == [FAULTY]


@pytest.mark.slow  # 2 simulated hours at 1 Hz (module fixture): out of the fast tier
def test_runs_are_versioned_in_the_store(calibrated):
    store, result, _, _ = calibrated
    assert result["run"]["run_id"] == 1
    n = store.con.execute(
        "SELECT count(*) FROM calibration_params WHERE run_id = 1 AND kind = 'gpu'"
        " AND param = 'r_k_per_w'"
    ).fetchall()[0][0]
    assert n == 24
    assert store.con.execute("SELECT count(*) FROM calibration_events").fetchall()[0][0] == 1


def test_bad_data_is_unusable_with_a_reason(tmp_path):
    site = load_site(SMALL_SITE)
    start = (datetime.now(UTC) - timedelta(hours=1)).replace(microsecond=0)
    sim = SiteSimulator(site, seed=2, start=start, rate_hz=1.0)
    with Store(tmp_path / "short.duckdb") as store:
        ing = Ingester(store, site)
        for _ in range(60):  # one minute: too few samples for any fit
            ing.ingest(sim.step())
        result = calibrate(store, site, window_s=60.0, holdout_s=10.0)
    r = _params(result, "gpu", "r_k_per_w")
    assert all(not p["usable"] and "samples" in p["reason"] for p in r.values())


@pytest.mark.slow  # 2 simulated hours at 1 Hz (module fixture): out of the fast tier
def test_calibrate_cli_json(calibrated):
    store, _, _, db = calibrated
    store.close()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "twin.cli",
            "calibrate",
            "--db",
            str(db),
            "--site",
            str(SMALL_SITE),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["run"]["run_id"] == 2
    assert "gpu:H200-SXM" in res["classes"]
    r = res["classes"]["gpu:H200-SXM"]["r_k_per_w"]["median"]
    assert 0.02 < r < 0.045
    assert np.isfinite(res["classes"]["rack"]["quality"]["power_w"]["mape"])


def test_gpu_fits_side_by_side_give_the_same_numbers_as_one_after_the_other() -> None:
    # calibrate() runs the power curve and the two RC fits in threads; they share no state,
    # so the results must be identical to running them in turn
    from models.gpu_power import gpu_power_w
    from models.gpu_thermal import rc_simulate
    from twin.calibrate.calibrate import fit_gpu_links

    rng = np.random.default_rng(21)
    n_t, n = 1800, 24
    act = np.repeat(rng.uniform(0.0, 1.0, (n_t // 60, n)), 60, axis=0)
    act[600:660] = 0.0  # every GPU idles for a minute
    power = gpu_power_w(act, 75.0, 700.0, 0.9) * (1 + 0.01 * rng.standard_normal((n_t, n)))
    ref = np.full((n_t, n), 32.0)
    temps = {
        q: rc_simulate(40.0, ref, power, r, 300.0, 1.0) + rng.normal(0, 0.3, (n_t, n))
        for q, r in (("temp_c", 0.03), ("mem_temp_c", 0.033))
    }
    limit = np.full(n, 700.0)
    pc1, rc1 = fit_gpu_links(act, power, limit, temps, ref, 1.0, threads=1)
    pc3, rc3 = fit_gpu_links(act, power, limit, temps, ref, 1.0, threads=3)
    assert pc1.usable.all() and all(f.usable.all() for f in rc1.values())
    for a, b in ((pc1.idle_w, pc3.idle_w), (pc1.limit_w, pc3.limit_w), (pc1.gamma, pc3.gamma)):
        np.testing.assert_array_equal(a, b)
    for q in temps:
        np.testing.assert_array_equal(rc1[q].r_k_per_w, rc3[q].r_k_per_w)
        np.testing.assert_array_equal(rc1[q].c_j_per_k, rc3[q].c_j_per_k)
        assert rc1[q].reason == rc3[q].reason
