"""The one chain (twin/chain/): limits, the parameter resolver and the thermal controller."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from models import electrical, gpu_thermal
from models.gpu_thermal import rc_simulate
from twin.chain import (
    derated_a,
    feed_capacity_kw,
    gpu_temperatures,
    phase_table,
    power_factor,
    pumps_running,
    rack_capacity_kw,
    resolve,
)
from twin.chain.params import default_rack_beta
from twin.chain.trend import unexplained_trend
from twin.site import load_site
from twin.site.catalog import ASSUMPTIONS
from twin.site.index import index_site

from .helpers import SMALL_SITE


@pytest.fixture(scope="module")
def site():
    return load_site(SMALL_SITE)


def test_derating_is_models_electrical_at_the_catalogs_factor() -> None:
    assert ASSUMPTIONS.continuous_load_factor == 0.8  # NEC 210.20(A)
    np.testing.assert_array_equal(derated_a([32, 63]), electrical.derated_limit_a([32, 63], 0.8))


def test_one_power_factor_rule_measured_else_the_default() -> None:
    got = power_factor([0.95, np.nan, 0.0, 1.2, -1.0, 1.0])
    d = ASSUMPTIONS.power_factor
    np.testing.assert_array_equal(got, [0.95, d, d, d, d, 1.0])


def test_feed_capacity_and_a_rack_without_pdus(site) -> None:
    p = site.pdu_by_name["pdu-r01-a"]
    assert feed_capacity_kw(p, 1.0) == pytest.approx(math.sqrt(3) * 415 * 0.8 * 32 / 1000)
    # measured pf on one feed, the default on the other; A + B feeds add up
    cap = rack_capacity_kw(site, site.racks, {"pdu-r01-a": 0.9})
    a, b = feed_capacity_kw(p, 0.9), feed_capacity_kw(site.pdu_by_name["pdu-r01-b"], 0.98)
    assert cap[0] == pytest.approx(a + b)
    bare = site.racks[0].model_copy(update={"pdus": []})
    assert np.isnan(rack_capacity_kw(site, [bare], {})[0])  # no feed: no limit, not infinity


def test_the_phase_table_holds_every_phase_and_breaker_at_its_derated_limit(site) -> None:
    t = phase_table(site)
    assert "pdu-r01-a/L1" in t.ids and "pdu-r01-a/cb3" in t.ids
    assert len(t.ids) == len(site.pdus) * 6  # three phases and three breakers each
    j = t.ids.index("pdu-r02-b/L2")
    assert t.limit_a[j] == pytest.approx(0.8 * 32) and t.racks[j] == [1]
    assert all(site.is_known("pdu", sid) for sid in t.ids)


def test_a_pump_runs_above_five_percent_and_nan_is_stopped() -> None:
    np.testing.assert_array_equal(
        pumps_running([0.0, 5.0, 5.1, 80.0, np.nan]), [False, False, True, True, False]
    )


def test_the_resolver_takes_calibrated_values_and_says_which(site) -> None:
    idx = index_site(site)
    g0 = idx.gpu_ids[0]
    cal = {
        ("gpu", g0, "r_k_per_w"): 0.05,
        ("gpu", g0, "c_j_per_k"): 900.0,
        ("gpu", g0, "idle_w"): 80.0,
        ("rack", "r01", "beta"): 1.2,
    }
    cp = resolve(site, idx, cal)
    assert cp.gpu.r_k_per_w[0] == 0.05 and cp.gpu.c_j_per_k[0] == 900.0
    assert cp.gpu.thermal_source[0] == "calibrated" and cp.gpu.idle_w[0] == 80.0
    assert cp.gpu.thermal_source[1].startswith("catalog")
    spec = site.nodes[0].gpu_spec
    assert cp.gpu.r_k_per_w[1] == spec.r_liquid_k_per_w
    assert cp.gpu.c_j_per_k[1] == pytest.approx(spec.tau_liquid_s / spec.r_liquid_k_per_w)
    assert cp.rack_beta[0] == 1.2
    assert cp.rack_beta[1] == pytest.approx(default_rack_beta(site.racks[1]))
    assert cp.rack_capture[1] == 0.0  # air-cooled rack: nothing to liquid


def test_hold_power_ends_the_step_at_the_target() -> None:
    t = np.array([70.0, 85.0, 86.9])
    p = gpu_thermal.hold_power_w(t, 87.0, 30.0, 0.05, 1500.0, 10.0)
    np.testing.assert_allclose(gpu_thermal.rc_step(t, 30.0, p, 0.05, 1500.0, 10.0), 87.0)


def _inputs(n: int = 600, g: int = 3):
    ref = np.full((n, g), 30.0)
    r = np.full((n, g), 0.08)
    c = np.full(g, 800.0)
    p = np.full((n, g), 700.0)  # steady state 30 + 56 = 86 °C: just under 87
    return ref, r, c, p


def test_the_controller_holds_the_limit_and_reports_what_it_shed() -> None:
    ref, r, c, p = _inputs()
    p[:, 1] = 900.0  # would reach 102 °C
    r[300:, 2] = 0.2  # loses flow half way: 700 W would reach 170 °C
    res = gpu_temperatures(
        np.full(3, 40.0), ref, p, r, c, 1.0, idle_w=np.full(3, 80.0), max_temp_c=np.full(3, 87.0)
    )
    assert res.temp_c.max() <= 87.0 + 0.011
    assert res.throttled_s[0] == 0 and res.throttled_s[1] > 0 and res.throttled_s[2] > 0
    assert (res.power_w[:, 0] == 700.0).all()
    # held at 87 °C, the GPU draws what keeps it there: (87 - 30) / R
    assert res.power_w[-1, 1] == pytest.approx(57 / 0.08, rel=1e-3)
    assert res.power_w[-1, 2] == pytest.approx(57 / 0.2, rel=1e-3)
    shed = ((p - res.power_w) * 1.0).sum(axis=0)
    np.testing.assert_allclose(res.undelivered_j, shed)


def test_a_gpu_idle_power_cannot_hold_runs_past_its_limit() -> None:
    ref, r, c, p = _inputs()
    r[:, 0] = 2.0  # a stopped loop: even 80 W idle gives 30 + 160 °C
    res = gpu_temperatures(
        np.full(3, 40.0), ref, p, r, c, 1.0, idle_w=np.full(3, 80.0), max_temp_c=np.full(3, 87.0)
    )
    assert res.temp_c[-1, 0] > 87.5 and (res.power_w[-20:, 0] == 80.0).all()


def test_measured_plus_change_is_the_recording_when_nothing_changes() -> None:
    ref, r, c, p = _inputs()
    rng = np.random.default_rng(1)
    meas = 60 + rng.normal(0, 0.3, p.shape)
    meas[100:150, 0] = 88.0  # the recording itself sat over the limit: not throttled again
    tb = rc_simulate(meas[0], ref, p, r, c, 1.0)
    res = gpu_temperatures(
        meas[0],
        ref,
        p,
        r,
        c,
        1.0,
        idle_w=np.full(3, 80.0),
        max_temp_c=np.full(3, 87.0),
        measured_c=meas,
        baseline_model_c=tb,
    )
    np.testing.assert_allclose(res.temp_c, meas, atol=1e-9)
    assert not res.held.any() and (res.power_w == p).all()


def _controller_step_by_step(t0, ref, power, r, c, dt, idle, target):
    """The controller as docs/physics.md §2.5 states it, one step at a time (the reference the
    block-wise implementation must reproduce to the bit)."""
    n, g = power.shape
    p, held = power.copy(), np.zeros((n, g), bool)
    out = np.empty((n, g), dtype=power.dtype)
    x = np.asarray(t0, dtype=float).copy()
    out[0] = x
    decay = np.exp(-dt / (r * c[None, :]))
    for k in range(n):
        e = decay[k]
        nxt = ref[k] + p[k] * r[k] + (x - (ref[k] + p[k] * r[k])) * e
        goal = target[min(k + 1, n - 1)]
        hot = nxt > goal + 0.01
        if hot.any():
            hold = (goal - x * e - ref[k] * (1.0 - e)) / (r[k] * np.maximum(1.0 - e, 1e-12))
            cut = np.where(hot, np.maximum(np.minimum(p[k], hold), idle), p[k])
            held[k] = hot & (cut < p[k] - 0.5)
            p[k] = cut
            ss = ref[k] + p[k] * r[k]
            nxt = ss + (x - ss) * e
        x = nxt
        if k + 1 < n:
            out[k + 1] = x
    return out, p, held


@pytest.mark.parametrize("n", [1, 511, 512, 513, 1300])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("held_when", ["mostly", "rarely"])
def test_the_controller_and_the_model_path_are_the_step_by_step_recurrence(
    n, dtype, held_when
) -> None:
    """Computed a block of steps at a time (a free run checked at its end, step by step once
    the controller acts), the paths are the step-by-step ones exactly: across block boundaries,
    with GPUs held most of the time or in one short burst, and with a float32 power."""
    rng = np.random.default_rng(n)
    g = 6
    ref = 30.0 + rng.standard_normal((n, g))
    power = (200.0 + 500.0 * rng.random((n, g))).astype(dtype)
    r = 0.05 + 0.02 * rng.random((n, g))
    c = np.full(g, 900.0)
    idle, t0 = np.full(g, 60.0), np.full(g, 45.0)
    max_c = np.array([55.0, 60.0, 65.0, 70.0, 90.0, 40.0])  # from always to never held
    if held_when == "rarely":  # one GPU's burst, mid-run, is all that trips the controller
        max_c = np.full(g, 90.0)
        power[n // 2 : n // 2 + 15, 2] = 3000.0
    res = gpu_temperatures(t0, ref, power, r, c, 10.0, idle_w=idle, max_temp_c=max_c)
    out, p, held = _controller_step_by_step(
        t0, ref, power, r, c, 10.0, idle, np.broadcast_to(max_c, (n, g))
    )
    np.testing.assert_array_equal(res.temp_c, out)
    np.testing.assert_array_equal(res.power_w, p)
    np.testing.assert_array_equal(res.held, held)
    assert n < 10 or 0 < held.sum() < (held.size if held_when == "mostly" else 20)
    free, _, _ = _controller_step_by_step(t0, ref, power, r, c, 10.0, idle, np.full((n, g), np.inf))
    np.testing.assert_array_equal(rc_simulate(t0, ref, power, r, c, 10.0).astype(dtype), free)


def test_the_phase_trend_fit_is_the_per_phase_least_squares(monkeypatch) -> None:
    rng = np.random.default_rng(7)
    n, m, step = 15, 40, 60.0  # the fit uses the last TREND_WINDOW_S = 15 min
    load = 1 + 0.05 * rng.standard_normal((n, m))
    t = np.arange(n) * step
    slope_true = np.where(np.arange(m) % 2 == 0, 0.004, 0.0)
    cur = 20 + 8 * load + slope_true[None, :] * t[:, None] + 0.05 * rng.standard_normal((n, m))
    cur[3, 5] = np.nan
    load[7, 9] = np.nan
    slope, se = unexplained_trend(cur, load, step)
    for j in range(m):
        ok = ~(np.isnan(cur[:, j]) | np.isnan(load[:, j]))
        # the level-shift regressor: 1 from the sample after the largest one-sample change
        diffs = np.abs(np.diff(cur[:, j]))
        at = int(np.nanargmax(diffs))
        step_reg = (np.arange(n) > at).astype(float)
        x = np.column_stack([np.ones(ok.sum()), load[ok, j], t[ok] - t[ok].mean(), step_reg[ok]])
        coef, *_ = np.linalg.lstsq(x, cur[ok, j], rcond=None)
        resid = cur[ok, j] - x @ coef
        b_se = math.sqrt(float(resid @ resid) / (ok.sum() - 4) * np.linalg.inv(x.T @ x)[2, 2])
        if abs(coef[2]) > 3 * b_se:
            assert slope[j] == pytest.approx(coef[2], rel=1e-6) and se[j] == pytest.approx(b_se)
        else:
            assert slope[j] == 0 and se[j] == 0
    assert (slope[::2] > 0).all()  # every creeping phase is found
    # fitted in blocks of columns (a replay's minute x phase pairs), the numbers are the same
    cur_h = np.concatenate([20 + rng.standard_normal((45, m)), cur])  # with an hour before
    load_h = np.concatenate([np.ones((45, m)), load])
    whole = unexplained_trend(cur_h, load_h, step)
    monkeypatch.setattr("twin.chain.trend.TREND_COLUMNS", 7)
    blocks = unexplained_trend(cur_h, load_h, step)
    for a, b in zip(whole, blocks, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_phase_whose_load_did_not_move_is_fitted_without_it() -> None:
    """Normal equations that are singular (a rack load that held still is the intercept
    again) take the pseudo-inverse: the trend and its error are the least squares of the
    identifiable columns (intercept, time, level shift), as ``lstsq`` gives them."""
    rng = np.random.default_rng(3)
    n, m, step = 15, 30, 60.0
    t = np.arange(n) * step
    load = np.ones((n, m))  # no load change at all
    slope_true = np.where(np.arange(m) % 3 == 0, 0.005, 0.0)
    cur = 30 + slope_true[None, :] * t[:, None] + 0.05 * rng.standard_normal((n, m))
    slope, se = unexplained_trend(cur, load, step)
    for j in range(m):
        at = int(np.argmax(np.abs(np.diff(cur[:, j]))))
        x = np.column_stack([np.ones(n), t - t.mean(), (np.arange(n) > at).astype(float)])
        coef, *_ = np.linalg.lstsq(x, cur[:, j], rcond=None)
        resid = cur[:, j] - x @ coef
        b_se = math.sqrt(float(resid @ resid) / (n - 4) * np.linalg.inv(x.T @ x)[1, 1])
        if abs(coef[1]) > 3 * b_se:
            assert slope[j] == pytest.approx(coef[1], rel=1e-6) and se[j] == pytest.approx(b_se)
        else:
            assert slope[j] == 0 and se[j] == 0
    assert (slope[::3] > 0).all()


def test_a_failed_links_traffic_goes_to_the_links_of_the_same_tier_at_its_ends(site) -> None:
    from twin.chain.propagate import link_busy_gbps, parallel_links

    names = [lk.name for lk in site.links]
    # both leaf-spine links end on spine-1: each takes the other's traffic
    assert [names[k] for k in parallel_links(site, names.index("lnk-r01-s1"))] == ["lnk-r02-s1"]
    np.testing.assert_array_equal(link_busy_gbps([4e9, 1e9], [2e9, 3e9]), [4.0, 3.0])


def test_the_replays_p90_load_ratio_is_the_live_headrooms_at_every_minute() -> None:
    """One figure, two readers: a replay's p90 ratio (its windows sorted once, every minute at
    once) equals the live headroom's (``last=True``: the hour up to now) and ``np.nanquantile``
    over the last hour at each minute, gaps, an idle rack and a rack with no data included; and
    the fleets' trailing quantile equals ``np.nanquantile`` too."""
    from twin.chain.breach import p90_ratio, trailing_quantile
    from twin.chain.propagate import p90_load_ratio

    rng = np.random.default_rng(11)
    m, racks = 150, 5
    rack_w = rng.normal(40_000.0, 6_000.0, (m, racks))
    rack_w[rng.random((m, racks)) < 0.15] = np.nan
    rack_w[:, 3] = 0.0  # idle: ratio 1
    rack_w[:, 4] = np.nan  # no data: ratio 1
    got = p90_ratio(rack_w)
    for k in range(m):
        hist = rack_w[max(0, k - 59) : k + 1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the rack with no data
            want = p90_load_ratio(np.nanquantile(hist, 0.9, axis=0), rack_w[k])
        np.testing.assert_allclose(got[k], want, rtol=1e-12, atol=0)
        np.testing.assert_array_equal(p90_ratio(rack_w[: k + 1], last=True), got[k])
    assert (got[:, 3:] == 1.0).all() and (got[:, :3] >= 1.0).all() and (got[:, :3] > 1.0).any()
    tq = trailing_quantile(rack_w[:, 0], 30, 0.95)
    for k in range(m):
        win = rack_w[max(0, k - 29) : k + 1, 0]
        want = np.nanquantile(win, 0.95) if np.isfinite(win).any() else np.nan
        np.testing.assert_allclose(tq[k], want, rtol=1e-12, equal_nan=True)


def test_a_heat_meter_off_the_flow_moves_the_return_path_not_its_level(tmp_path) -> None:
    """The live loop-return path is the measured return plus the model's change over the load
    path (``chain.moved_return_c``, the what-if's composition): with CDU-1's heat meter reading
    three times what its flow carries, the model puts the return 15 K over the measured one and
    past its limit, and the headroom paged a breach in 0 s beside 10 K of headroom now. Now the
    path starts at the measured return and no breach is forecast under a flat load."""
    import json
    from datetime import UTC, datetime

    from twin.analysis.headroom import compute_headroom
    from twin.ingest import Ingester, IngestLimits
    from twin.simulator import SiteSimulator
    from twin.store import Store

    site = load_site(SMALL_SITE)
    sim = SiteSimulator(site, seed=3, start=datetime(2026, 1, 1, tzinfo=UTC))

    def meter_reads_3x(topic: str, payload: bytes) -> tuple[str, bytes]:
        if "/cdu/" not in topic:
            return topic, payload
        msg = json.loads(payload)
        for s in msg["samples"]:
            if "heat_kw" in s:
                s["heat_kw"] *= 3.0
        return topic, json.dumps(msg).encode()

    with Store(tmp_path / "s.duckdb") as store:
        batch = [meter_reads_3x(t, b) for _ in range(900) for t, b in sim.step()]
        Ingester(store, site, IngestLimits(max_past_s=0, max_future_s=0)).ingest(batch)
        report = compute_headroom(store, site, use_forecast=False)
    rows = {(r.kind, r.quantity): r for r in report.rows}
    loop, heat = rows["loop", "return_temp_c"], rows["cdu", "heat_kw"]
    # the metered heat needs more flow than the loop has to stay under the return limit: the
    # model's return for it is past the limit, the measured one 10 K under it
    assert rows["cdu", "flow_lpm"].headroom_now < 0
    assert loop.headroom_now > 5.0
    assert loop.headroom_min_p50 == pytest.approx(loop.headroom_now)  # flat load: flat return
    assert loop.breach_in_s_p50 is None and loop.breach_in_s_p90 is None
    assert loop.headroom_min_p90 <= loop.headroom_min_p50
    assert heat.headroom_min_p50 == pytest.approx(heat.headroom_now)  # starts at the meter
