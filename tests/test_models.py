"""Unit and property tests of models/: hand-computed values and physical invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models import cdu, coolant, electrical, gpu_power, gpu_thermal, network

finite = {"allow_nan": False, "allow_infinity": False}


# ---- gpu_power ---------------------------------------------------------------------------------


def test_gpu_power_endpoints_and_shape() -> None:
    a = np.array([-0.5, 0.0, 0.25, 1.0, 1.7])
    p = gpu_power.gpu_power_w(a, 75.0, 700.0)
    np.testing.assert_allclose(p, [75.0, 75.0, 75.0 + 625.0 * 0.25, 700.0, 700.0])
    # concave exponent: above the line in the middle
    assert gpu_power.gpu_power_w(0.5, 75.0, 700.0, gamma=0.8) > gpu_power.gpu_power_w(
        0.5, 75.0, 700.0
    )
    # enforced cap below the limit clamps
    assert float(gpu_power.gpu_power_w(1.0, 75.0, 700.0, cap_w=500.0)) == 500.0
    assert float(gpu_power.gpu_power_w(0.2, 75.0, 700.0, cap_w=500.0)) == pytest.approx(200.0)


def test_gpu_power_vectorized_per_device() -> None:
    idle = np.array([70.0, 75.0, 100.0])
    limit = np.array([700.0, 700.0, 1000.0])
    p = gpu_power.gpu_power_w(np.ones((4, 3)), idle, limit)
    assert p.shape == (4, 3)
    np.testing.assert_allclose(p[0], limit)


# ---- gpu_thermal -------------------------------------------------------------------------------


def test_rc_step_reaches_steady_state() -> None:
    r, tau = 0.03, 10.0
    c = tau / r
    t = 32.0
    for _ in range(200):  # 200 s = 20 tau
        t = gpu_thermal.rc_step(t, 32.0, 700.0, r, c, 1.0)
    assert float(t) == pytest.approx(32.0 + 0.03 * 700.0, abs=1e-6)
    assert float(gpu_thermal.steady_temp_c(32.0, 700.0, 0.03)) == pytest.approx(53.0)


def test_rc_step_one_time_constant_and_exact_composition() -> None:
    r, c = 0.05, 200.0  # tau = 10 s
    t1 = gpu_thermal.rc_step(30.0, 30.0, 400.0, r, c, 10.0)
    # after one tau, 1 - 1/e of the way to the steady-state rise of 20 K
    assert float(t1) == pytest.approx(30.0 + 20.0 * (1 - math.exp(-1)))
    # exact ZOH: two half steps equal one full step
    half = gpu_thermal.rc_step(
        gpu_thermal.rc_step(30.0, 30.0, 400.0, r, c, 5.0), 30.0, 400.0, r, c, 5.0
    )
    assert float(half) == pytest.approx(float(t1), abs=1e-12)


def test_rc_simulate_matches_steps_and_broadcasts() -> None:
    rng = np.random.default_rng(0)
    n, g = 50, 4
    power = rng.uniform(100, 700, (n, g))
    ref = 30.0 + rng.normal(0, 0.1, (n, 1))
    r = np.array([0.03, 0.04, 0.05, 0.07])
    c = np.array([300.0, 250.0, 200.0, 800.0])
    out = gpu_thermal.rc_simulate(40.0, ref, power, r, c, 1.0)
    assert out.shape == (n, g)
    np.testing.assert_allclose(out[0], 40.0)
    t = np.full(g, 40.0)
    for k in range(1, n):
        t = gpu_thermal.rc_step(t, ref[k - 1], power[k - 1], r, c, 1.0)
        np.testing.assert_allclose(out[k], t)
    # per-interval dt
    dts = np.full(n, 2.0)
    np.testing.assert_allclose(
        gpu_thermal.rc_simulate(40.0, ref, power, r, c, dts),
        gpu_thermal.rc_simulate(40.0, ref, power, r, c, 2.0),
    )


@given(
    ref=st.floats(10, 50, **finite),
    p1=st.floats(0, 1500, **finite),
    dp=st.floats(0, 1500, **finite),
    r=st.floats(0.005, 0.5, **finite),
)
def test_more_power_never_lowers_steady_temperature(
    ref: float, p1: float, dp: float, r: float
) -> None:
    assert gpu_thermal.steady_temp_c(ref, p1 + dp, r) >= gpu_thermal.steady_temp_c(ref, p1, r)


# ---- coolant -----------------------------------------------------------------------------------


def test_coolant_table_values_and_interpolation() -> None:
    assert float(coolant.density_kg_m3("water", 25.0)) == 997.0
    assert float(coolant.density_kg_m3("pg25", 40.0)) == 1014.3
    assert float(coolant.specific_heat_j_kgk("pg25", 25.0)) == 3920.0
    assert float(coolant.specific_heat_j_kgk("water", 33.0)) == 4180.0
    # halfway between 30 and 40 °C
    assert float(coolant.density_kg_m3("pg25", 35.0)) == pytest.approx((1019.2 + 1014.3) / 2)
    # held flat outside the table
    assert float(coolant.density_kg_m3("water", 60.0)) == 990.2
    with pytest.raises(ValueError, match="unknown coolant 'oil'"):
        coolant.density_kg_m3("oil", 25.0)


def test_pg25_one_and_a_half_lpm_per_kw_gives_ten_kelvin() -> None:
    # physics.md §3.3 [D]: PG25 at 25 °C, 1.5 L/min/kW -> ΔT = 10.0 K
    rise = float(coolant.return_temp_c(20.0, 100.0, 150.0, "pg25")) - 20.0  # mean 25 °C
    assert rise == pytest.approx(10.0, abs=0.02)
    # by hand: 1000 W / (1021.5 kg/m³ * 2.5e-5 m³/s * 3920 J/kgK)
    assert rise == pytest.approx(1000.0 / (1021.5 * 1.5 / 60000 * 3920), abs=1e-3)
    assert float(coolant.flow_for_heat_lpm(1.0, 10.0, "pg25", 25.0)) == pytest.approx(
        1.5, abs=0.003
    )
    # water needs ~1.44 L/min/kW for 10 K (§3.3)
    assert float(coolant.flow_for_heat_lpm(1.0, 10.0, "water", 25.0)) == pytest.approx(
        1.44, abs=0.005
    )


def test_heat_balance_closes() -> None:
    # by hand with table values at the mean temperature (40 °C): rho 992.2, cp 4180
    q = coolant.heat_kw(60.0, 35.0, 45.0, "water")
    assert float(q) == pytest.approx(992.2 * 0.001 * 4180.0 * 10.0 / 1000.0)
    supply = np.array([25.0, 32.0, 40.0])
    heat = np.array([10.0, 120.0, 500.0])
    flow = np.array([20.0, 180.0, 900.0])
    for fluid in ("water", "pg25"):
        ret = coolant.return_temp_c(supply, heat, flow, fluid)
        np.testing.assert_allclose(coolant.heat_kw(flow, supply, ret, fluid), heat, rtol=1e-9)


@given(
    supply=st.floats(15, 45, **finite),
    heat=st.floats(0, 2000, **finite),
    flow=st.floats(1, 5000, **finite),
    more=st.floats(0, 5000, **finite),
    fluid=st.sampled_from(["water", "pg25"]),
)
def test_more_flow_never_raises_return_temperature(
    supply: float, heat: float, flow: float, more: float, fluid: str
) -> None:
    lo = coolant.return_temp_c(supply, heat, flow + more, fluid)
    hi = coolant.return_temp_c(supply, heat, flow, fluid)
    assert lo <= hi + 1e-9


@given(st.floats(0, 1e6, **finite))
def test_lpm_m3s_round_trip(lpm: float) -> None:
    assert float(coolant.m3s_to_lpm(coolant.lpm_to_m3s(lpm))) == pytest.approx(lpm, rel=1e-12)
    assert float(coolant.lpm_to_m3s(60_000.0)) == 1.0


# ---- cdu ---------------------------------------------------------------------------------------


def test_pump_curve_design_point_and_n_minus_one() -> None:
    h0, kp, ks = cdu.pump_curve_from_design(300.0, 100.0, 2)
    assert float(h0) == 125.0
    q2 = float(cdu.parallel_pump_flow_lpm(2, 1.0, h0, kp, ks))
    assert q2 == pytest.approx(300.0)
    assert float(cdu.loop_dp_kpa(q2, ks)) == pytest.approx(100.0)
    # by hand: one pump, k_p/1 = 4 k_s/... -> Q = sqrt(1.25 / 2) * 300
    q1 = float(cdu.parallel_pump_flow_lpm(1, 1.0, h0, kp, ks))
    assert q1 == pytest.approx(300.0 * math.sqrt(1.25 / 2.0))
    assert float(cdu.parallel_pump_flow_lpm(0, 1.0, h0, kp, ks)) == 0.0
    # affinity: flow scales with speed
    assert float(cdu.parallel_pump_flow_lpm(2, 0.8, h0, kp, ks)) == pytest.approx(240.0)


@given(
    max_flow=st.floats(10, 5000, **finite),
    dp=st.floats(10, 400, **finite),
    speed=st.floats(0.2, 1.0, **finite),
    ratio=st.floats(1.05, 2.0, **finite),
)
def test_losing_one_of_two_pumps_lowers_flow_by_less_than_half(
    max_flow: float, dp: float, speed: float, ratio: float
) -> None:
    h0, kp, ks = cdu.pump_curve_from_design(max_flow, dp, 2, shutoff_ratio=ratio)
    both = float(cdu.parallel_pump_flow_lpm(2, speed, h0, kp, ks))
    one = float(cdu.parallel_pump_flow_lpm(1, speed, h0, kp, ks))
    assert 0.5 * both < one < both


def test_pump_power_affinity_and_supply_temperature() -> None:
    rated = cdu.pump_rated_power_w(300.0, 100.0, 2, 0.5)
    assert float(rated) == pytest.approx(100e3 * 0.005 / 2 / 0.5)  # 500 W
    assert float(cdu.pump_power_w(0.5, rated)) == pytest.approx(float(rated) / 8)
    assert float(cdu.pump_power_w(0.0, rated, base_w=20.0)) == 0.0
    np.testing.assert_allclose(cdu.supply_temp_c(np.array([20.0, 30.0]), 4.0, 32.0), [32.0, 34.0])
    assert float(cdu.available_capacity_kw(200.0, 150.0)) == 50.0
    assert float(cdu.available_capacity_kw(200.0, 150.0, 150.0, 300.0)) == -50.0


# ---- electrical --------------------------------------------------------------------------------


def test_node_and_psu_power() -> None:
    # DGX-H100-like node at full GPU power: a = 1200 W, b = 1.25
    assert float(electrical.node_power_w(5600.0, 1200.0, 0.25)) == 8200.0
    assert float(electrical.psu_input_w(8200.0)) == pytest.approx(8217.0 / 0.96)
    assert float(electrical.psu_input_w(0.0, 13.0, 0.98)) == pytest.approx(13.0 / 0.98)


def test_wye_and_single_phase_currents() -> None:
    # wye at 240 V line-to-neutral: 4.8 kW at PF 1 -> 20.0 A
    v_ll = 240.0 * math.sqrt(3)  # ≈ 415.7 V
    assert float(electrical.phase_current_a(4800.0, v_ll, 1.0)) == pytest.approx(20.0)
    # balanced three-phase identity P = sqrt(3) V_LL I PF
    i = float(electrical.phase_current_a(30_000.0 / 3, 400.0, 0.97))
    assert math.sqrt(3) * 400.0 * i * 0.97 == pytest.approx(30_000.0)
    assert float(electrical.phase_current_a(2080.0, 208.0, 1.0, "delta")) == pytest.approx(10.0)
    assert float(electrical.phase_current_a(2300.0, 230.0, 1.0, "single")) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="unknown wiring"):
        electrical.phase_current_a(1.0, 1.0, 1.0, "star")


def test_delta_four_branch_example() -> None:
    # A 208 V delta PDU with four branch circuits: two on L1-L2 (10 A, 6 A), one on L2-L3 (8 A),
    # one on L3-L1 (12 A). By hand (Raritan): I12 = 16, I23 = 8, I31 = 12 A;
    # L1 = sqrt(16² + 12² + 16·12) = sqrt(592), L2 = sqrt(16² + 8² + 16·8) = sqrt(448),
    # L3 = sqrt(8² + 12² + 8·12) = sqrt(304).
    lines = electrical.delta_line_currents_a(
        [10.0, 6.0, 8.0, 12.0], pairs=["L1-L2", "L2-L1", "L2-L3", "L3-L1"]
    )
    np.testing.assert_allclose(lines, [math.sqrt(592), math.sqrt(448), math.sqrt(304)])
    np.testing.assert_allclose(lines, [24.3311, 21.1660, 17.4356], atol=1e-4)
    # the same by phasors: branch currents in phase with V12 (30°), V23 (-90°), V31 (150°)
    i12, i23, i31 = (
        16 * np.exp(1j * np.radians(30)),
        8 * np.exp(1j * np.radians(-90)),
        12 * np.exp(1j * np.radians(150)),
    )
    np.testing.assert_allclose(lines, np.abs([i12 - i31, i23 - i12, i31 - i23]))
    # balanced: sqrt(3) x branch current; vectorized over PDUs
    bal = electrical.delta_line_currents_a(np.full((5, 3), 10.0))
    np.testing.assert_allclose(bal, 10.0 * math.sqrt(3))
    with pytest.raises(ValueError, match="unknown branch"):
        electrical.delta_line_currents_a([1.0], pairs=["L1-N"])


def test_derating_and_imbalance() -> None:
    assert float(electrical.derated_limit_a(30.0)) == 24.0
    assert float(electrical.imbalance([10.0, 10.0, 10.0])) == 0.0
    assert float(electrical.imbalance([0.0, 0.0, 0.0])) == 0.0
    np.testing.assert_allclose(
        electrical.imbalance(np.array([[12.0, 10.0, 8.0], [30.0, 0.0, 0.0]])), [0.4, 3.0]
    )


@given(
    powers=st.lists(st.floats(0, 20_000, **finite), min_size=3, max_size=3),
    v_ll=st.floats(200, 480, **finite),
    pf=st.floats(0.8, 1.0, **finite),
)
def test_wye_phase_currents_sum_back_to_total_power(
    powers: list[float], v_ll: float, pf: float
) -> None:
    currents = electrical.phase_current_a(np.array(powers), v_ll, pf, "wye")
    back = float(np.sum(currents * v_ll / math.sqrt(3) * pf))
    assert back == pytest.approx(sum(powers), rel=1e-9, abs=1e-6)


# ---- network -----------------------------------------------------------------------------------


def test_allreduce_and_utilization() -> None:
    assert float(network.allreduce_bytes_per_rank(16e9, 1024)) == pytest.approx(
        2 * 1023 / 1024 * 16e9
    )
    assert float(network.allreduce_bytes_per_rank(16e9, 2)) == 16e9
    assert float(network.allreduce_bytes_per_rank(16e9, 1)) == 0.0
    # physics.md §5: 32 GB per GPU at 50 GB/s (400 Gb/s) ≥ 0.64 s
    assert float(network.allreduce_time_s(16e9, 1024, 400e9)) == pytest.approx(0.64, abs=0.001)
    np.testing.assert_allclose(network.link_utilization([100e9, 400e9], 400e9), [0.25, 1.0])


@settings(max_examples=50)
@given(n=st.integers(2, 100_000), size=st.floats(1, 1e12, **finite))
def test_allreduce_volume_between_s_and_2s(n: int, size: float) -> None:
    v = float(network.allreduce_bytes_per_rank(size, n))
    assert size <= v * (1 + 1e-12) and v < 2 * size


@settings(max_examples=200, deadline=None)
@given(
    r=st.floats(0.005, 0.5),
    lo=st.floats(0.01, 5.0),
    hi=st.floats(0.01, 5.0),
    share=st.floats(0.0, 1.0),
)
def test_more_flow_never_raises_cold_plate_resistance(
    r: float, lo: float, hi: float, share: float
) -> None:
    lo, hi = min(lo, hi), max(lo, hi)
    r_lo = gpu_thermal.r_at_flow_k_per_w(r, lo, share)
    r_hi = gpu_thermal.r_at_flow_k_per_w(r, hi, share)
    assert r_hi <= r_lo + 1e-12
    assert gpu_thermal.r_at_flow_k_per_w(r, 1.0, share) == pytest.approx(r)
    # the conductive part stays whatever the flow
    assert r_hi >= (1.0 - share) * r - 1e-12


def test_rc_simulate_is_repeated_rc_step_to_the_bit():
    """rc_simulate's loop is rc_step's arithmetic with the steady states precomputed: the same
    numbers, for every way of passing the inputs (one GPU, per-interval steps, NaN)."""
    from models.gpu_thermal import rc_simulate, rc_step

    def stepwise(temp0, ref, power, r, c, dt):
        power = np.asarray(power, float)
        ref = np.broadcast_to(np.asarray(ref, float), power.shape)
        dt = np.asarray(dt, float)
        shape = np.broadcast_shapes(power.shape[1:], np.shape(r), np.shape(c))
        t = np.broadcast_to(np.asarray(temp0, float), shape)
        out = [t]
        for k in range(1, power.shape[0]):
            t = rc_step(t, ref[k - 1], power[k - 1], r, c, dt[k - 1] if dt.ndim else dt)
            out.append(t)
        return np.array(out)

    rng = np.random.default_rng(1)
    p = rng.uniform(0, 700, (50, 5))
    p[10, 2] = np.nan
    r5, c5 = rng.uniform(0.02, 0.04, 5), rng.uniform(200, 500, 5)
    cases = [
        (30.0, [30.0, 30.0, 30.0], [0.0, 100.0, 100.0], 0.1, 100.0, 10.0),
        (rng.normal(40, 1, 5), 32.0, p, r5, c5, 1.0),
        (rng.normal(40, 1, 5), rng.normal(32, 1, (50, 5)), p, r5, c5, rng.uniform(0.5, 2, 50)),
        (40.0, 32.0, rng.uniform(0, 700, 50), r5, 300.0, 1.0),
        (40.0, rng.normal(32, 1, (50, 1)), p[:, :1], r5, 300.0, rng.uniform(0.5, 2, (50, 5))),
    ]
    for case in cases:
        got, want = rc_simulate(*case), stepwise(*case)
        assert got.shape == want.shape and np.array_equal(got, want, equal_nan=True)


def test_rc_simulate_with_r_varying_in_time_is_rc_step_with_each_samples_r():
    """A loop whose flow changes gives one R per sample (row k held from sample k to k + 1):
    the same numbers as rc_step with that row's R, for a regular and a per-interval step."""
    from models.gpu_thermal import rc_simulate, rc_step

    rng = np.random.default_rng(4)
    n, g = 40, 3
    ref, p = rng.normal(32, 1, (n, g)), rng.uniform(100, 700, (n, g))
    r = rng.uniform(0.02, 0.08, (n, g))  # e.g. a pump lost half way
    c = rng.uniform(200, 900, g)
    for dt in (10.0, rng.uniform(0.5, 2.0, n)):
        got = rc_simulate(40.0, ref, p, r, c, dt)
        t, want = np.full(g, 40.0), [np.full(g, 40.0)]
        for k in range(1, n):
            t = rc_step(t, ref[k - 1], p[k - 1], r[k - 1], c, dt if np.ndim(dt) == 0 else dt[k - 1])
            want.append(t)
        assert np.array_equal(got, np.array(want))
    with pytest.raises(ValueError, match="one per sample"):
        rc_simulate(40.0, ref, p, r[:-1], c, 1.0)


def _cooling_steps_by_definition(temp_c: np.ndarray, power_w: np.ndarray, r: np.ndarray) -> list:
    """``models.cooling_change`` at 1 s, one GPU and candidate at a time, as its Notes define
    it: (step, index) of the largest judged fall per GPU, ``(nan, -1)`` where none."""
    from models import cooling_change as cc

    w, gap, after, pre = int(cc.MEAN_S), int(cc.GAP_S), int(cc.AFTER_S), int(cc.PRE_S)
    n_t, n_g = temp_c.shape

    def mean(x: np.ndarray) -> float:
        x = x[np.isfinite(x)]
        return float(x.mean()) if len(x) else math.nan

    out = []
    for g in range(n_g):
        p_w = [mean(power_w[i - w + 1 : i + 1, g]) if i >= w - 1 else math.nan for i in range(n_t)]
        best = (math.inf, -1)
        for k in range(pre + w, n_t - gap - after):
            tb, pb = mean(temp_c[k - w : k, g]), mean(power_w[k - w : k, g])
            ta = mean(temp_c[k + gap : k + gap + after, g])
            pa = mean(power_w[k + gap : k + gap + after, g])
            step = (ta - tb) - r[g] * (pa - pb)
            means = p_w[k - pre + w - 1 : k + gap + after]  # the 30 s means from k - pre on
            flat = all(math.isfinite(m) for m in means) and (
                max(means) - min(means) <= cc.FLAT_FRACTION * (max(means) + min(means))
            )
            if flat and math.isfinite(step) and step < best[0]:
                best = (step, k)
        out.append(best if best[1] >= 0 else (math.nan, -1))
    return out


def test_cooling_steps_equal_their_definition_with_gaps_and_falls() -> None:
    """The vectorized detector (prefix sums, running min and max) against a loop over every GPU
    and candidate: the same largest fall and its start, with missing samples and power steps."""
    from models.cooling_change import cooling_steps

    rng = np.random.default_rng(7)
    n_t, n_g = 260, 6
    temp = 60.0 + rng.normal(0.0, 0.4, (n_t, n_g))
    power = 175.0 + rng.normal(0.0, 3.0, (n_t, n_g))
    temp[150:, [0, 2, 4]] -= 9.0  # cooling changes at flat power
    power[150:, 4] -= 60.0  # ... except that one follows its power down
    temp[rng.random((n_t, n_g)) < 0.08] = np.nan
    power[rng.random((n_t, n_g)) < 0.05] = np.nan
    power[100:140, 5] = np.nan  # a gap: no candidate near it is flat
    r = np.full(n_g, 0.07)
    got = cooling_steps(temp, power, r)
    want = _cooling_steps_by_definition(temp, power, r)
    for g, (step, k) in enumerate(want):
        assert got.index[g] == k, (g, got.index[g], k)
        if k >= 0:
            assert got.step_k[g] == pytest.approx(step, abs=1e-9)
        else:
            assert math.isnan(got.step_k[g])
    assert list(got.flagged) == [True, False, True, False, False, False]
