"""A GPU seen through GPU-Util only, through the user path: `dctwin import nvidia-smi` of the
real RTX 4090 log, `dctwin calibrate` on a one-workstation site, and the stored curve read back
by the chain (docs/physics.md §1.3.1). The util-only curve is applied to util input only."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from models import gpu_power
from twin.chain import propagate
from twin.chain.params import resolve
from twin.cli import app
from twin.site import load_site
from twin.site.catalog import GPU_MODELS
from twin.site.index import index_site
from twin.store import Store

from .helpers import REPO

# import, calibrate and what-if through the CLI: out of the fast tier
pytestmark = pytest.mark.slow

RTX4090_LOG = REPO.parent / "shared" / "reference" / "nvidia_smi" / "rtx4090_1hz_load_cycle.csv"
needs_log = pytest.mark.skipif(
    not RTX4090_LOG.is_file(), reason=f"the reference log {RTX4090_LOG} is not here"
)
#: held-out MAE of a straight line in util on the last 25 % of the log (bench/README.md)
LINEAR_HOLDOUT_MAE_W = 20.8

WORKSTATION_SITE = """\
name: ws
halls:
  - name: lab
    rows:
      - name: bench
        racks:
          - name: desk
            grid: [0, 0]
            pdus: [strip]
            nodes:
              - {name: n1, model: WS-RTX4090-1, phase: L1}
pdus:
  - name: strip
    feed: A
    phases: 1
    voltage_v: 230
    rated_current_a: 16
    breakers:
      - {name: cb1, phase: L1, rated_current_a: 16}
fleets:
  - {name: ws, role: inference, members: [n1]}
"""


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def _log() -> tuple[list[datetime], np.ndarray, np.ndarray]:
    """Timestamps, util (0..1) and power of the log, read with plain string operations."""
    ts, util, power = [], [], []
    for line in RTX4090_LOG.read_text().splitlines()[1:]:
        t, _name, u, _mu, _used, p = (x.strip() for x in line.split(","))
        ts.append(datetime.strptime(t, "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=UTC))
        util.append(float(u.split()[0]) / 100.0)
        power.append(float(p.split()[0]))
    return ts, np.array(util), np.array(power)


@needs_log
def test_calibrate_stores_a_util_curve_with_the_measured_idle(tmp_path: Path):
    """The log idles only at its very end (its first 75 % holds single 0 % samples in the
    middle of the load and power decaying after it, nothing idle by power): calibrated on all
    but its last 20 s, the stored curve's idle is the measured idle power (issue 29: it was
    91.4 W from those samples), within 10 %."""
    site_file = tmp_path / "ws.yaml"
    site_file.write_text(WORKSTATION_SITE)
    db = tmp_path / "rtx.duckdb"
    res = invoke("import", "nvidia-smi", RTX4090_LOG, "--node", "n1", "--db", db)
    assert res.exit_code == 0, res.output
    ts, util, power = _log()
    span_s = (ts[-1] - ts[0]).total_seconds()
    res = invoke(
        "calibrate", "--db", db, "--site", site_file, "--window", span_s + 30.0,
        "--holdout", 20, "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    with Store(db, read_only=True) as store:
        cal = store.latest_calibration_params(kind="gpu")
    kind = int(cal[("gpu", "n1:0", "curve_kind")])
    assert kind in gpu_power.UTIL_ONLY_KINDS  # not the power law, which this log refuses
    shape_param = {gpu_power.TWO_LEVEL: "util_threshold", gpu_power.SATURATING: "util_u0"}[kind]
    idle, limit = cal[("gpu", "n1:0", "idle_w")], cal[("gpu", "n1:0", "limit_w")]
    shape = cal[("gpu", "n1:0", shape_param)]
    # measured idle, read here: samples at <= 5 % GPU-Util with none above it in the 10 s
    # before (the card draws ~34 W there)
    busy = util > 0.05
    settled = [i for i in range(10, len(util)) if not busy[i - 10 : i + 1].any()]
    measured = float(np.median(power[settled]))
    assert 33.0 < measured < 36.0, measured
    assert idle == pytest.approx(measured, rel=0.10), (idle, measured)
    assert 0 < idle < limit <= 450.0
    # a held-out figure is published for the usable curve (the last 20 s: idle)
    q = [r for r in out["quality"] if r["id"] == "n1:0" and r["quantity"] == "power_w"]
    assert q and q[0]["n"] > 0 and q[0]["mae"] < 10.0, q
    split = len(ts) // 2
    pred = gpu_power.curve_power_w(kind, util[split:], idle, limit, shape, 450.0)

    # the chain reads the stored curve back, and applies it to util input only
    site = load_site(site_file)
    idx = index_site(site)
    gp = resolve(site, idx, cal).gpu
    assert gp.util_kind is not None and int(gp.util_kind[0]) == kind
    assert gp.curve_source[0] == f"calibrated on GPU-Util ({gpu_power.CURVE_KINDS[kind]})"
    a = util[split:, None]
    on_util = propagate.gpu_power_w(a, gp, from_util=np.array([True]))
    np.testing.assert_allclose(on_util[:, 0], np.minimum(pred, limit))
    spec = GPU_MODELS["RTX4090"]
    on_sm = propagate.gpu_power_w(a, gp, from_util=np.array([False]))
    np.testing.assert_allclose(on_sm, gpu_power.gpu_power_w(a, spec.idle_w, spec.tdp_w, spec.gamma))
    np.testing.assert_array_equal(propagate.gpu_power_w(a, gp), on_sm)  # default: SM activity


@needs_log
def test_whatif_scales_a_util_gpu_through_its_stored_util_curve(tmp_path: Path) -> None:
    """`dctwin import nvidia-smi`, `dctwin calibrate`, a bundle, and a what-if that halves the
    workstation's load: the IT energy it saves is the stored saturating curve's change, a few
    times less than the catalog's straight line would say (GPU-Util 90 % -> 45 % keeps the
    card busy)."""
    from collectors.contract import encode, topic_for
    from twin.ingest import Ingester, IngestLimits
    from twin.replay.bundle import Bundle, record
    from twin.replay.scenario import Scenario
    from twin.replay.whatif import load, run

    site_file = tmp_path / "ws.yaml"
    site_file.write_text(WORKSTATION_SITE)
    db = tmp_path / "rtx.duckdb"
    assert invoke("import", "nvidia-smi", RTX4090_LOG, "--node", "n1", "--db", db).exit_code == 0
    ts, _, power = _log()
    site = load_site(site_file)
    with Store(db) as store:
        # the desk's power strip: the card plus an 80 W rest of the workstation, 1 Hz
        topic = topic_for(site.name, "pdu", "strip")
        msgs = [
            (topic, encode(collector="test", source="strip", seq=i, ts=t,
                           samples=[{"id": "strip", "power_w": float(p) + 80.0}]))
            for i, (t, p) in enumerate(zip(ts, power, strict=True))
        ]  # fmt: skip
        Ingester(store, site, IngestLimits(max_past_s=0)).ingest(msgs)
    # fitted on all but the last 20 s: the only idle minute of the log is at its end
    res = invoke("calibrate", "--db", db, "--site", site_file, "--window", 3000, "--holdout", 20)
    assert res.exit_code == 0, res.output
    with Store(db) as store:
        record(store, site_file, tmp_path / "b", ts[0], ts[-1], resolution_s=1.0)
    d = load(Bundle.load(tmp_path / "b"))
    assert d.gpu_activity_from_util is not None and d.gpu_activity_from_util.all()
    gp = d.params.gpu
    assert int(gp.util_kind[0]) in gpu_power.UTIL_ONLY_KINDS
    half = Scenario.model_validate(
        {"name": "half", "changes": [{"op": "scale_fleet", "fleet": "ws", "factor": 0.5}]}
    )
    saved_kwh = run(d, None).it_energy_kwh - run(d, half).it_energy_kwh
    a = d.gpu_activity[:, 0].astype(float)

    def curve_change_kwh(p_of) -> float:
        cut = np.minimum(d.gpu_power_w[:, 0] + p_of(0.5 * a) - p_of(a), 450.0)
        cut = np.maximum(cut, 0.0) - np.minimum(d.gpu_power_w[:, 0], 450.0)
        return float(-cut.sum() * d.params.rack_beta[0] * d.dt_s / 3.6e6)

    def util_curve(x):
        return gpu_power.curve_power_w(
            gp.util_kind[0], x, gp.util_idle_w[0], gp.util_limit_w[0], gp.util_shape[0]
        )

    spec = GPU_MODELS["RTX4090"]
    expected = curve_change_kwh(util_curve)
    line = curve_change_kwh(lambda x: gpu_power.gpu_power_w(x, spec.idle_w, spec.tdp_w, 1.0))
    assert expected > 0 and line > 2 * expected
    assert saved_kwh == pytest.approx(expected, rel=0.05, abs=0.002)


def test_a_stored_util_curve_never_reaches_sm_activity(tmp_path: Path) -> None:
    """Resolve and the chain on a stored two-level curve, without the reference log."""
    site_file = tmp_path / "ws.yaml"
    site_file.write_text(WORKSTATION_SITE)
    site = load_site(site_file)
    idx = index_site(site)
    spec = GPU_MODELS["RTX4090"]
    cal = {
        ("gpu", "n1:0", "curve_kind"): float(gpu_power.TWO_LEVEL),
        ("gpu", "n1:0", "idle_w"): 60.0,
        ("gpu", "n1:0", "limit_w"): 290.0,
        ("gpu", "n1:0", "util_threshold"): 0.05,
    }
    gp = resolve(site, idx, cal).gpu
    # SM activity goes through the catalog's power law: the util curve says nothing about it
    assert (gp.idle_w[0], gp.limit_w[0], gp.gamma[0]) == (spec.idle_w, spec.tdp_w, spec.gamma)
    a = np.array([[0.0], [0.03], [0.5], [1.0]])
    util_w = propagate.gpu_power_w(a, gp, from_util=[True])[:, 0]
    assert util_w.tolist() == [60.0, 60.0, 290.0, 290.0]
    sm_w = propagate.gpu_power_w(a, gp, from_util=[False])[:, 0]
    np.testing.assert_allclose(sm_w, spec.idle_w + (spec.tdp_w - spec.idle_w) * a[:, 0])
    # the what-if's "measured plus the curve's change": util 0.9 -> 0.6 keeps a busy GPU busy
    after = propagate.gpu_power_after_w(
        np.array([[285.0]]), np.array([[0.9]]), np.array([[0.6]]), gp, np.array([[450.0]]),
        from_util=[True],
    )  # fmt: skip
    assert after[0, 0] == 285.0
    # an incomplete stored curve (no threshold) is not used, nor are its levels taken for a
    # power law: the catalog's curve, and the source says why
    del cal[("gpu", "n1:0", "util_threshold")]
    gp2 = resolve(site, idx, cal).gpu
    assert int(gp2.util_kind[0]) == gpu_power.POWER_LAW
    assert gp2.curve_source[0] == "catalog (stored GPU-Util curve incomplete)"
    assert (gp2.idle_w[0], gp2.limit_w[0]) == (spec.idle_w, spec.tdp_w)
    # no curve_kind at all: the power law path, numerically as before
    plain = resolve(site, idx, {("gpu", "n1:0", "idle_w"): 40.0}).gpu
    np.testing.assert_array_equal(
        propagate.gpu_power_w(a, plain, from_util=[True]),
        gpu_power.gpu_power_w(a, plain.idle_w, plain.limit_w, plain.gamma),
    )


def test_power_curves_keep_the_power_law_for_sm_activity_and_a_linear_util_gpu() -> None:
    """calibrate's power_curves: a GPU with SM activity is never offered a util-only family; a
    util GPU whose power is linear in util keeps the power law with fit_power_curve's numbers;
    an on/off util GPU gets a util-only family."""
    from twin.calibrate.calibrate import fit_gpu_links, power_curves

    rng = np.random.default_rng(8)
    n_t = 3600
    sweep = np.round(np.abs(np.sin(np.arange(n_t) / 200.0)), 2)
    on_off = np.where((np.arange(n_t) // 150) % 3 == 0, 0.0, 0.97)
    act = np.stack([on_off, sweep, on_off], axis=1)
    power = np.stack(
        [
            np.where(on_off > 0, 290.0, 40.0),  # SM activity: on/off, but it is not util
            gpu_power.gpu_power_w(sweep, 60.0, 450.0, 1.0),
            np.where(on_off > 0, 290.0, 40.0),
        ],
        axis=1,
    ) * (1 + 0.01 * rng.standard_normal((n_t, 3)))
    limit = np.full(3, 450.0)
    pc, _ = fit_gpu_links(act, power, limit, {}, np.zeros((n_t, 3)), 1.0)
    from_util = np.array([False, True, True])
    curve = power_curves(pc, act, power, limit, from_util, 1.0)
    assert curve.kind[0] == gpu_power.POWER_LAW  # SM activity: the power law, as before
    np.testing.assert_array_equal(curve.idle_w[:2], pc.idle_w[:2], strict=True)
    np.testing.assert_array_equal(curve.shape[:2], pc.gamma[:2])
    assert curve.reason[0] == pc.reason[0]
    assert curve.kind[1] == gpu_power.POWER_LAW and curve.usable[1]
    assert curve.kind[2] in gpu_power.UTIL_ONLY_KINDS and curve.usable[2], curve.reason[2]
    assert np.isfinite(curve.holdout_mae_w[1:]).any(axis=1).all()
    assert np.isnan(curve.holdout_mae_w[0]).all()  # never scored as util
