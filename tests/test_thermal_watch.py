"""The minute-aggregate thermal watch (models.thermal_watch) on hand-built series: the RC model
in minute means, R re-estimated over a trailing window, and each GPU's fleet median."""

from __future__ import annotations

import numpy as np

from models import thermal_watch as tw

STEP_S = 10.0
C_J_PER_K = 400.0


def _rc(r_t: np.ndarray, power: np.ndarray, ref_c: float) -> np.ndarray:
    """The RC model stepped exactly for a power held over each step, (T, N)."""
    temp = np.empty_like(power)
    temp[0] = ref_c + r_t[0] * power[0]
    for k in range(1, len(power)):
        a = np.exp(-STEP_S / (r_t[k] * C_J_PER_K))
        steady = ref_c + r_t[k] * power[k - 1]
        temp[k] = steady + (temp[k - 1] - steady) * a
    return temp


def test_a_30_percent_ramp_is_seen_by_residual_and_drift_before_5_k_from_slowdown() -> None:
    rng = np.random.default_rng(1)
    n_gpu, minutes = 12, 150
    n = minutes * 6
    t = np.arange(n) * STEP_S
    r0 = 0.045 * rng.uniform(0.95, 1.05, n_gpu)
    r_t = np.broadcast_to(r0, (n, n_gpu)).copy()
    ramp = np.clip((t - 3600.0) / 3600.0, 0.0, 1.0)  # healthy hour, then +30 % over an hour
    r_t[:, 0] = r0[0] * (1.0 + 0.30 * ramp)
    busy = np.where((t % 1800.0) < 1740.0, 700.0, 150.0)  # checkpoint dips
    power = busy[:, None] + rng.normal(0.0, 5.0, (n, n_gpu))
    temp = np.round(_rc(r_t, power, 42.0) + rng.normal(0.0, 0.2, (n, n_gpu)))
    t_m, p_m, slope = tw.minute_aggregates(temp, power, STEP_S)
    assert t_m.shape == (minutes, n_gpu)
    ref = np.full_like(t_m, 42.0)
    off = np.zeros((1, n_gpu))
    one = np.ones_like(t_m)
    x = tw.heat_w(p_m, slope, np.full((1, n_gpu), C_J_PER_K))
    resid, model = tw.residual_k(t_m, ref, off, r0[None, :], x)  # calibrated on the healthy hour
    z = tw.trailing_min(resid / 0.3, 5)
    r_est = tw.r_estimate(t_m, ref, off, x, one, 30)[0]
    fleet = tw.group_median(r_est, np.zeros(n_gpu, dtype=np.int64))
    drift = r_est / fleet - 1.0
    # healthy hour: every GPU's estimate within 3 % of its own R, the model within 2 sigma
    assert np.nanmax(np.abs(r_est[40:60] / r0[None, :] - 1.0)) < 0.03
    assert np.nanmax(z[10:60]) < 2.0
    # the ramped GPU: first minute of each detector's crossing (the rules' 4 sigma, +25 %)
    k_to_slowdown = 87.0 - t_m[:, 0]
    hot = int(np.argmax(k_to_slowdown <= 5.0))
    assert k_to_slowdown[hot] <= 5.0
    res_at = int(np.argmax(z[:, 0] >= 4.0))
    drift_at = int(np.argmax(drift[:, 0] > 0.25))
    assert z[res_at, 0] >= 4.0 and res_at < hot - 15, (res_at, hot)
    assert drift[drift_at, 0] > 0.25 and drift_at > 60
    # what they saw: measured over modelled by the residual, R over the fleet's by the drift
    assert t_m[res_at, 0] - model[res_at, 0] >= 4 * 0.3
    assert abs(fleet[-1, 0] - np.median(r0)) < 0.05 * np.median(r0)
    assert abs(r_est[-1, 0] / (1.3 * r0[0]) - 1.0) < 0.03
    # healthy GPUs: never over either threshold
    assert np.nanmax(z[:, 1:]) < 4.0 and np.nanmax(drift[:, 1:]) < 0.25


def test_trailing_windows_are_causal_and_the_heat_term_removes_the_dip_transient() -> None:
    a = np.arange(20, dtype=float)[:, None] * np.array([[1.0, -1.0]])
    s = tw.trailing_sum(a, 5)
    assert s[4, 0] == sum(range(5)) and s[10, 0] == sum(range(6, 11))
    m = tw.trailing_min(a, 3)
    assert np.isnan(m[1]).all() and m[5, 0] == 3 and m[5, 1] == -5
    b = a.copy()
    b[12:] = 1e9  # the future cannot move the past
    assert np.array_equal(tw.trailing_sum(b, 5)[:12], s[:12])
    # a step in power: the minute means' steady-state model is off by tau x the slope,
    # the stored-heat term takes it out
    n = 60
    power = np.where(np.arange(n) < 33, 700.0, 150.0)[:, None]
    r = np.full((n, 1), 0.03)
    step = 1.0
    temp = np.empty((n, 1))
    temp[0] = 30.0 + 0.03 * 700.0
    for k in range(1, n):
        a_ = np.exp(-step / (0.03 * C_J_PER_K))
        steady = 30.0 + r[k] * power[k - 1]
        temp[k] = steady + (temp[k - 1] - steady) * a_
    t_m, p_m, slope = tw.minute_aggregates(temp, power, step)
    plain = t_m - (30.0 + 0.03 * p_m)
    fixed, _ = tw.residual_k(
        t_m, np.full_like(t_m, 30.0), 0.0, 0.03, tw.heat_w(p_m, slope, C_J_PER_K)
    )
    assert abs(plain[0, 0]) > 2.0 and abs(fixed[0, 0]) < 0.5 * abs(plain[0, 0])


def test_a_model_below_its_coolant_is_not_judged() -> None:
    """A calibration with a large negative offset (fitted on loaded minutes) puts an idle GPU's
    model below the coolant that cools it: the residual there is NaN, never a hot GPU, while a
    loaded minute of the same GPU and a plausible model beside it are still judged."""
    ref = np.full((3, 2), 30.0)
    off = np.array([[-8.0, -1.0]])
    x = np.array([[50.0, 50.0], [600.0, 600.0], [60.0, 60.0]])  # idle, loaded, idle [W]
    measured = np.array([[31.0, 31.0], [40.0, 47.0], [31.0, 31.0]])
    resid, model = tw.residual_k(measured, ref, off, 0.03, x)
    # GPU 0: 30 - 8 + 1.5 = 23.5 °C idle, 6.5 K under its coolant -> not judged
    assert np.isnan(resid[0, 0]) and np.isnan(resid[2, 0])
    assert model[0, 0] == 23.5
    # loaded: 30 - 8 + 18 = 40 °C, at its reading
    assert resid[1, 0] == 0.0
    # GPU 1: 30 - 1 + 1.5 = 30.5 °C idle, within 2 K of the coolant -> judged
    assert resid[0, 1] == 0.5 and resid[1, 1] == 47.0 - 47.0
    z = tw.loaded_min(resid / 0.3, x, 3, 1)
    assert not np.isnan(z[-1, 1])


def test_an_r_drift_at_low_heat_is_a_kelvin_not_a_plate() -> None:
    """The heat R was estimated at turns a relative drift into kelvin (docs/physics.md §2.6):
    a 1 K offset error is +33 % of a 0.03 K/W plate at 100 W and +5 % at 700 W, and in
    either case 1 K."""
    minutes, r0 = 40, 0.03
    ref = np.full((minutes, 2), 30.0)
    off = np.zeros((1, 2))
    one = np.ones((minutes, 2))
    x = np.column_stack([np.full(minutes, 160.0), np.full(minutes, 700.0)])
    temp = ref + r0 * x + 1.0  # both 1 K warmer than the offset says: an offset error
    r_est, heat = tw.r_estimate(temp, ref, off, x, one, 30)
    assert np.allclose(heat[-1], [160.0, 700.0])
    drift = r_est[-1] / r0 - 1.0
    assert drift[0] > 0.2 and drift[1] < 0.05  # relative: large at low heat only
    assert np.allclose((r_est[-1] - r0) * heat[-1], 1.0)  # in kelvin: the same 1 K
    # a minute under MIN_HEAT_W never enters R nor its heat; too few loaded minutes: NaN both
    idle = x.copy()
    idle[:, 0] = 100.0
    r_i, h_i = tw.r_estimate(ref + r0 * idle, ref, off, idle, one, 30)
    assert np.isnan(r_i[-1, 0]) and np.isnan(h_i[-1, 0]) and np.isfinite(h_i[-1, 1])


def test_watch_is_its_steps_and_takes_an_r_from_the_re_estimates_so_far() -> None:
    """``watch`` and ``fleet_drift`` (what the live detector and a replay both call) equal the
    steps they compose, with a fixed R and with an R made from the re-estimates (a replay's
    history cap): a GPU whose plate degrades is judged against R capped by its own past."""
    rng = np.random.default_rng(4)
    n_gpu, minutes = 6, 90
    n = minutes * 6
    r0 = np.full(n_gpu, 0.045)
    r_t = np.broadcast_to(r0, (n, n_gpu)).copy()
    r_t[n // 2 :, 0] *= 1.4  # a plate gone bad halfway
    power = 650.0 + rng.normal(0.0, 5.0, (n, n_gpu))
    temp = _rc(r_t, power, 40.0) + rng.normal(0.0, 0.1, (n, n_gpu))
    t_m, p_m, slope = tw.minute_aggregates(temp, power, STEP_S)
    ref, off = np.full_like(t_m, 40.0), np.zeros((1, n_gpu))
    c, one, sigma = np.full((1, n_gpu), C_J_PER_K), np.ones_like(t_m), np.full((1, n_gpu), 0.3)
    x = tw.heat_w(p_m, slope, c)
    est, heat = tw.r_estimate(t_m, ref, off, x, one, 30)
    for r in (r0[None, :] * 1.1, lambda e: np.fmin(r0[None, :] * 1.1, np.nan_to_num(e, nan=1.0))):
        w = tw.watch(t_m, p_m, slope, ref, off, c, one, sigma, r, minutes=5, window=30)
        r_used = r(est) if callable(r) else r
        resid, model = tw.residual_k(t_m, ref, off, r_used, x)
        np.testing.assert_array_equal(w.z, tw.loaded_min(resid / sigma, x, 5, 3))
        np.testing.assert_array_equal(w.model_c, model)
        np.testing.assert_array_equal(w.r_est, est)
        np.testing.assert_array_equal(w.r_heat, heat)
    fleet, drift, excess = tw.fleet_drift(est, heat, np.zeros(n_gpu, dtype=np.int64))
    np.testing.assert_array_equal(fleet, tw.group_median(est, np.zeros(n_gpu, dtype=np.int64)))
    np.testing.assert_array_equal(drift, est / fleet - 1.0)
    np.testing.assert_array_equal(excess, (est - fleet) * heat)
    assert drift[-1, 0] > 0.3 and np.nanmax(np.abs(drift[-1, 1:])) < 0.05
    assert np.nanmax(w.z[-10:, 0]) > 4.0 and np.nanmax(w.z[-10:, 1:]) < 4.0
